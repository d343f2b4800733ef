"""ControlNet preprocessors (pipelines/image/control.py) on constructed pictures whose answer is known,
and canny against OpenCV's cv2.Canny as an independent reference."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from streamstudio.errors import StreamStudioError
from streamstudio.pipelines.image.control import (ControlConfig, Preprocessor, canny, classical_depth, preprocess,
                                                  transformers_depth_model)


def to_tensor(img: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 -> (1, 3, H, W) in [0, 1]."""
    return torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255.0


def step(h=48, w=64, column=32, low=0, high=255, vertical=True) -> np.ndarray:
    img = np.full((h, w, 3), low, np.uint8)
    if vertical:
        img[:, column:] = high
    else:
        img[column:, :] = high
    return img


def ours(img: np.ndarray, low=100, high=200, sigma=0.0) -> np.ndarray:
    return canny(to_tensor(img), low, high, sigma)[0, 0].numpy() > 0


def opencv(img: np.ndarray, low=100, high=200, sigma=0.0) -> np.ndarray:
    src = img if sigma == 0 else cv2.GaussianBlur(img, (0, 0), sigma)
    return cv2.Canny(src, low, high) > 0


def smooth_colour(seed: int, h=96, w=128) -> np.ndarray:
    base = np.random.default_rng(seed).integers(0, 256, (h // 8, w // 8, 3)).astype(np.uint8)
    return cv2.resize(base, (w, h), interpolation=cv2.INTER_CUBIC)


def test_canny_vertical_step_gives_one_column():
    edges = ours(step(column=32))
    cols = np.flatnonzero(edges.any(axis=0))
    # the gradient is equal on both sides of the step; OpenCV keeps the first of a tie (mag > left, >= right)
    assert cols.tolist() == [31]
    assert edges[:, 31].all()
    assert np.array_equal(edges, opencv(step(column=32)))


def test_canny_horizontal_step_gives_one_row():
    edges = ours(step(column=20, vertical=False))
    assert np.flatnonzero(edges.any(axis=1)).tolist() == [19]
    assert edges[19].all()


def test_canny_flat_picture_has_no_edges():
    assert not ours(np.full((32, 32, 3), 128, np.uint8)).any()


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("low,high", [(100, 200), (50, 150), (20, 60)])
def test_canny_equals_opencv_without_blur(seed, low, high):
    img = smooth_colour(seed)
    ref = opencv(img, low, high)
    assert ref.sum() > 500  # the picture has plenty of edges
    assert np.array_equal(ours(img, low, high), ref)


def test_canny_equals_opencv_on_noise_and_grey():
    noise = np.random.default_rng(5).integers(0, 256, (40, 56, 3)).astype(np.uint8)
    assert np.array_equal(ours(noise), opencv(noise))
    grey = np.repeat(cv2.cvtColor(smooth_colour(3), cv2.COLOR_RGB2GRAY)[..., None], 3, axis=2)
    assert np.array_equal(ours(grey, 40, 90), opencv(grey, 40, 90))


@pytest.mark.parametrize("sigma", [1.0, 1.4])
def test_canny_with_blur_close_to_opencv(sigma):
    # OpenCV blurs 8-bit pictures in fixed point, we in float: a few pixels may differ
    img = smooth_colour(7)
    a, b = ours(img, 30, 80, sigma), opencv(img, 30, 80, sigma)
    assert b.sum() > 500
    assert (a != b).sum() / b.sum() < 0.03


def test_canny_hysteresis_keeps_weak_chain_joined_to_strong():
    img = np.zeros((64, 64, 3), np.uint8)
    img[:32, 32:] = 30  # |dx| + |dy| = 120: between the thresholds (weak)
    img[32:, 32:] = 255  # strong
    edges = ours(img)
    # the weak half of the edge is kept (it touches the strong half; at the corner the chain bends)
    assert edges[:30, 31].all() and edges[34:, 31].all()
    assert np.array_equal(edges, opencv(img))
    weak_only = img.copy()
    weak_only[32:, 32:] = 30
    assert not ours(weak_only).any() and not opencv(weak_only).any()


def test_canny_thresholds_swapped_as_opencv():
    img = smooth_colour(2)
    assert np.array_equal(ours(img, 200, 100), opencv(img, 200, 100))


def test_preprocess_shapes_device_dtype_and_per_frame():
    frames = torch.cat([to_tensor(step(column=10)), to_tensor(step(column=40))]).to(torch.float64)
    for kind in ("canny", "depth", "lineart", "softedge", "none"):
        out = Preprocessor(kind)(frames)
        assert out.shape == frames.shape and out.dtype == frames.dtype
        assert float(out.min()) >= 0 and float(out.max()) <= 1
        # each frame's control image is its own: the batched call equals per-frame calls
        torch.testing.assert_close(out[1:], Preprocessor(kind)(frames[1:]), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(Preprocessor("none")(frames), frames)
    edges = Preprocessor("canny")(frames)
    assert torch.equal(edges[:, 0], edges[:, 1]) and torch.equal(edges[:, 0], edges[:, 2])  # grey RGB


def test_bad_settings_raise_clear_errors():
    with pytest.raises(StreamStudioError, match="--control-preprocessor"):
        Preprocessor("hed")
    with pytest.raises(StreamStudioError, match="thresholds"):
        Preprocessor(ControlConfig("canny", low_threshold=-1))
    with pytest.raises(StreamStudioError, match=r"\(B, 3, H, W\)"):
        Preprocessor("canny")(torch.zeros(1, 1, 8, 8))


def test_depth_fallback_ground_plane_and_sharp_subject():
    flat = torch.full((1, 3, 32, 40), 0.5)
    d = classical_depth(flat)[0, 0]
    rows = d.mean(dim=1)
    assert torch.all(rows[1:] > rows[:-1])  # lower rows are nearer (brighter)
    torch.testing.assert_close(d, d[:, :1].expand_as(d))  # nothing changes across a row
    # a sharp, textured square on a flat background stands out from the background at its rows
    img = np.full((64, 64, 3), 128, np.uint8)
    img[8:24, 24:40] = np.random.default_rng(0).integers(0, 256, (16, 16, 3))
    d = classical_depth(to_tensor(img))[0, 0]
    assert float(d[8:24, 24:40].mean()) > float(d[8:24, :12].mean()) + 0.2
    assert float(d[8:24, 24:40].mean()) > float(d[8:24, 52:].mean()) + 0.2


def test_depth_model_hook_resized_and_normalised():
    calls = []

    def model(frames):  # (B, 3, H, W) -> (B, h, w): a left-to-right ramp at half size, values 5..9
        calls.append(frames.shape)
        b, _, h, w = frames.shape
        return torch.linspace(5, 9, w // 2).expand(b, h // 2, w // 2)

    out = preprocess(torch.rand(2, 3, 16, 24), ControlConfig("depth"), depth_model=model)
    assert calls == [(2, 3, 16, 24)] and out.shape == (2, 3, 16, 24)
    assert float(out[:, :, :, 0].max()) == 0.0 and float(out[:, :, :, -1].min()) == 1.0
    assert torch.all(out[0, 0, 0, 1:] >= out[0, 0, 0, :-1])
    with pytest.raises(StreamStudioError, match="depth model must return"):
        preprocess(torch.rand(2, 3, 16, 24), ControlConfig("depth"), depth_model=lambda f: torch.zeros(1, 4, 4))


@pytest.mark.slow
def test_transformers_depth_model_from_a_tiny_saved_dpt(tmp_path):  # ~4 s, most of it importing DPT
    from transformers import DPTConfig, DPTForDepthEstimation

    torch.manual_seed(0)
    config = DPTConfig(hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32,
                       image_size=32, patch_size=8, neck_hidden_sizes=[8, 8, 8, 8], fusion_hidden_size=8,
                       backbone_out_indices=[0, 1, 2, 3], head_in_index=-1)
    DPTForDepthEstimation(config).save_pretrained(tmp_path)
    model = transformers_depth_model(str(tmp_path), local_files_only=True)
    frames = torch.rand(2, 3, 20, 28)
    out = Preprocessor("depth", depth_model=model)(frames)
    assert out.shape == (2, 3, 20, 28) and float(out.min()) == 0.0 and float(out.max()) == 1.0


def test_lineart_finds_dark_lines_only():
    img = np.full((32, 48, 3), 255, np.uint8)
    img[:, 20] = 0  # a black line on white
    line = preprocess(to_tensor(img), ControlConfig("lineart"))[0, 0]
    assert torch.all(line.argmax(dim=1) == 20)
    assert float(line[:, 20].min()) > 0.8
    assert float(line[:, :14].max()) < 0.02 and float(line[:, 27:].max()) < 0.02
    # a white line on black is no dark line: its own pixels stay black (its dark flanks are drawn)
    flank = preprocess(to_tensor(255 - img), ControlConfig("lineart"))[0, 0]
    assert float(flank[:, 20].max()) == 0.0 and float(flank[:, :14].max()) < 0.02


def test_soft_edge_peaks_at_step_and_is_zero_far_away():
    soft = preprocess(to_tensor(step(column=24)), ControlConfig("softedge"))[0, 0]
    assert set(soft.argmax(dim=1).tolist()) <= {23, 24}
    assert float(soft.max()) == pytest.approx(1.0)
    assert float(soft[:, :18].max()) < 1e-3 and float(soft[:, 30:].max()) < 1e-3
    # the profile falls off smoothly on both sides (soft, not a one-pixel line)
    assert 0.05 < float(soft[0, 22]) < 1.0 and 0.05 < float(soft[0, 25]) < 1.0


@pytest.mark.gpu
def test_preprocessors_on_the_gpu_equal_the_cpu():
    frames = torch.cat([to_tensor(smooth_colour(s)) for s in range(2)])
    for kind in ("canny", "depth", "lineart", "softedge"):
        cpu = Preprocessor(kind)(frames)
        gpu = Preprocessor(kind)(frames.cuda())
        assert gpu.device.type == "cuda"
        if kind == "canny":
            assert torch.equal(gpu.cpu(), cpu)
        else:
            torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=1e-4)


def test_control_inputs_run_each_preprocessor_once_per_group_and_give_row_scales():
    from streamstudio.pipelines.image.control import ControlInputs, ControlUnit

    inputs = ControlInputs([ControlUnit(Preprocessor("canny"), 0.8), ControlUnit(Preprocessor("none"), 0.3)])
    frames = torch.cat([to_tensor(step(column=10)), to_tensor(step(column=30))])  # (2, 3, H, W)
    canny_images, frame_images = inputs.images(frames)
    assert inputs.runs == 1 and canny_images.shape == frames.shape
    assert torch.equal(canny_images, Preprocessor("canny")(frames)) and torch.equal(frame_images, frames)
    assert inputs.scales(3, torch.device("cpu")).tolist() == [[0.800000011920929, 0.30000001192092896]] * 3
    inputs.set_scale(1, 0.0)
    assert inputs.scales(1, torch.device("cpu"))[0, 1] == 0
    with pytest.raises(StreamStudioError, match="no ControlNet 2"):
        inputs.set_scale(2, 1.0)
    with pytest.raises(StreamStudioError, match="scale"):
        inputs.set_scale(0, float("nan"))


@pytest.mark.parametrize("check_every", [1, 4, 64])
def test_hysteresis_follows_chains_longer_than_a_check_block(check_every):
    """A weak spiral chain of ~300 pixels hanging off one strong pixel is kept whole whatever the
    check interval (64 is the GPU's: one sync a frame for short chains, more blocks for long ones)."""
    from streamstudio.pipelines.image.control import hysteresis

    cand = torch.zeros(1, 1, 40, 40, dtype=torch.bool)
    top, left, bottom, right = 2, 2, 37, 37
    while top < bottom and left < right:  # a spiral path, 3 pixels between its turns
        cand[0, 0, top, left:right + 1] = True
        cand[0, 0, top:bottom + 1, right] = True
        cand[0, 0, bottom, left:right + 1] = True
        cand[0, 0, top + 3:bottom + 1, left] = True
        cand[0, 0, top + 3, left:left + 4] = True  # on into the next, inner ring
        top, left, bottom, right = top + 3, left + 3, bottom - 3, right - 3
    strong = torch.zeros_like(cand)
    strong[0, 0, 2, 2] = True
    isolated = cand.clone()
    isolated[0, 0, 0, 0] = True  # a candidate touching nothing strong
    edges = hysteresis(strong, isolated, check_every)
    assert torch.equal(edges, cand) and int(cand.sum()) > 300
