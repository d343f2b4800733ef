"""ControlNets (models/image/controlnet.py): tiny ControlNets made from the tiny UNets, checked against
diffusers' own MultiControlNetModel."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from addon_models import SIZE, make_pipe, stream_frames, tiny_controlnet

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models.image import controlnet, sdxl
from streamstudio.models.image.controlnet import ControlNetSpec, load_controlnet, parse_controlnet


@pytest.fixture(scope="module")
def sd(request):
    from streamstudio.models.image.loading import load_components

    comps = load_components("tiny")
    return comps, [tiny_controlnet(comps.unet, 0), tiny_controlnet(comps.unet, 1)]


def call(unet, x, t, text, res=None, added=None):
    kw = {} if res is None else dict(down_block_additional_residuals=res[0], mid_block_additional_residual=res[1])
    with torch.no_grad():
        return unet(x, t, encoder_hidden_states=text, added_cond_kwargs=added, **kw).sample


def inputs(rows=2, size=64, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 4, size // 8, size // 8, generator=g)  # (B, 4, h, w)
    t = torch.tensor([900, 300, 500, 100][:rows])
    text = torch.randn(rows, 7, dim, generator=g)  # (B, L, D)
    images = [torch.rand(rows, 3, size, size, generator=g) for _ in range(2)]  # control images in [0, 1]
    return x, t, text, images


def test_parse_controlnet():
    assert (parse_controlnet("lllyasviel/control_v11p_sd15_canny")
            == ControlNetSpec("lllyasviel/control_v11p_sd15_canny"))
    assert parse_controlnet("./nets/depth:0.6") == ControlNetSpec("./nets/depth", 0.6)
    with pytest.raises(StreamStudioError, match="--controlnet"):
        parse_controlnet(":0.5")


def test_scale_zero_is_the_plain_unet_and_scale_changes_the_output(sd):
    comps, nets = sd
    x, t, text, images = inputs()
    plain = call(comps.unet, x, t, text)
    zero = controlnet.residuals(nets[:1], x, t, text, images[:1], torch.zeros(2, 1))
    assert torch.equal(call(comps.unet, x, t, text, zero), plain)
    one = controlnet.residuals(nets[:1], x, t, text, images[:1], torch.ones(2, 1))
    assert (call(comps.unet, x, t, text, one) - plain).abs().max() > 1e-2


def test_per_row_scales_and_two_nets_equal_diffusers_multicontrolnet(sd):
    from diffusers.models import MultiControlNetModel

    comps, nets = sd
    x, t, text, images = inputs()
    scales = torch.tensor([[0.5, 1.2], [1.0, 0.0]])  # (B, n): each row its own scales
    ours = call(comps.unet, x, t, text, controlnet.residuals(nets, x, t, text, images, scales))
    multi = MultiControlNetModel(nets)
    for row in range(2):
        sl = slice(row, row + 1)
        with torch.no_grad():
            d, m = multi(x[sl], t[sl], text[sl], [im[sl] for im in images], scales[row].tolist(), return_dict=False)
        ref = call(comps.unet, x[sl], t[sl], text[sl], (d, m))
        torch.testing.assert_close(ours[sl], ref, atol=1e-5, rtol=1e-4)


def test_sdxl_controlnet_takes_the_added_conditioning():
    from streamstudio.models.image.loading import load_components

    comps = load_components("tiny-sdxl")
    net = tiny_controlnet(comps.unet)
    x, t, text, images = inputs(dim=64)
    added = dict(text_embeds=torch.randn(2, 32), time_ids=sdxl.time_ids(64, 64, 2, torch.device("cpu"), torch.float32))
    plain = call(comps.unet, x, t, text, added=added)
    res = controlnet.residuals([net], x, t, text, images[:1], torch.full((2, 1), 0.8), added)
    assert (call(comps.unet, x, t, text, res, added) - plain).abs().max() > 1e-2
    with pytest.raises(StreamStudioError, match="does not fit"):
        controlnet.check_fits(tiny_controlnet(load_components("tiny").unet), comps.unet)
    controlnet.check_fits(net, comps.unet)


def test_load_controlnet_from_folder_and_clear_errors(sd, tmp_path):
    comps, nets = sd
    nets[0].save_pretrained(tmp_path / "canny")
    loaded = load_controlnet(str(tmp_path / "canny"))
    sa, sb = nets[0].state_dict(), loaded.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    with pytest.raises(ModelNotFoundError, match="hf download"):
        load_controlnet("lllyasviel/control_v11p_sd15_canny", local_files_only=True)
    (tmp_path / "net.ckpt").write_bytes(b"\0" * 8)
    with pytest.raises(StreamStudioError, match="not a .safetensors"):
        load_controlnet(str(tmp_path / "net.ckpt"))
    with pytest.raises(StreamStudioError, match="as many control images"):
        controlnet.residuals(nets, *inputs()[:3], inputs()[3][:1], torch.ones(2, 2))


# ------------------------------------------------------------------ ControlNets in the stream pipeline


def aligned(pipe, inputs):
    outs = []
    for image in inputs:
        outs += pipe.push(image)
    return outs + pipe.flush()


def test_each_slot_gets_its_own_frames_control_image(sd):
    """Frames of distinct flat colours through Stream Batch (3 steps): the ControlNet call's rows
    for slots 0, 1, 2 carry the control images of frames i, i-1, i-2 (the first frame's while
    the primed slots hold it)."""
    comps, nets = sd
    pipe = make_pipe(comps, nets[:1], cfg_type="none")
    seen = []
    nets[0].register_forward_pre_hook(lambda m, a, kw: seen.append(kw["controlnet_cond"][:, 0, 0, 0].clone()),
                                      with_kwargs=True)
    levels = [20, 60, 100, 140, 180]
    for level in levels:
        pipe.push(np.full((SIZE, SIZE, 3), level, np.uint8))
        assert pipe.addons.control.runs == levels.index(level) + 1  # one preprocessor pass per input frame
    batch_calls = [rows for rows in seen if rows.shape[0] == 3]  # the priming trajectory's calls have one row
    assert len(batch_calls) == len(levels)
    for i, rows in enumerate(batch_calls):
        want = [levels[max(i - j, 0)] / 255 for j in range(3)]
        torch.testing.assert_close(rows, torch.tensor(want), atol=1e-6, rtol=0)
    nets[0]._forward_pre_hooks.clear()


@pytest.mark.parametrize("cfg", ["none", "initialize", "full"])
def test_stream_batch_equals_sequential_with_controlnets(sd, cfg):
    from helpers import capture_latents

    comps, nets = sd
    inputs = stream_frames(5)
    kw = dict(cfg_type=cfg, guidance_scale=1.5)
    batch, seq = (make_pipe(comps, nets, [0.7, 0.4], **kw),
                  make_pipe(comps, nets, [0.7, 0.4], use_denoising_batch=False, **kw))
    lat_b, lat_s = capture_latents(batch), capture_latents(seq)
    aligned(batch, inputs), aligned(seq, inputs)
    assert len(lat_b) == len(lat_s) == len(inputs)
    # equal to float rounding (~3e-6); every slot given the newest frame's control images is ~4e-4 off
    for a, b in zip(lat_b, lat_s):
        torch.testing.assert_close(a, b, atol=3e-5, rtol=0)


def test_scale_zero_stream_is_the_plain_stream_and_scale_is_live(sd):
    comps, nets = sd
    inputs = stream_frames(4, seed=1)
    plain = aligned(make_pipe(comps, []), inputs)
    zero = aligned(make_pipe(comps, nets, [0.0, 0.0], preprocessor="canny"), inputs)
    assert all(np.array_equal(a, b) for a, b in zip(plain, zero))
    live = make_pipe(comps, nets, [0.0, 0.0], preprocessor="canny")
    live.addons.set_control_scale(0, 1.5)
    assert any(not np.array_equal(a, b) for a, b in zip(plain, aligned(live, inputs)))
    with pytest.raises(StreamStudioError, match="no ControlNet"):
        make_pipe(comps, []).addons.set_control_scale(0, 1.0)
    with pytest.raises(StreamStudioError, match="control picture"):
        make_pipe(comps, nets, mode="txt2img").push(None)


def test_generate_with_controlnet_flags(sd, tmp_path, capsys):
    from PIL import Image

    from streamstudio.app.cli import main

    comps, nets = sd
    nets[0].save_pretrained(tmp_path / "canny_net")
    src = tmp_path / "in"
    src.mkdir()
    for i, image in enumerate(stream_frames(2, seed=4)):
        Image.fromarray(image).save(src / f"{i}.png")
    common = ["generate", "--model", "tiny", "--input", str(src), "--prompt", "a fox", "--width", "32",
              "--height", "32"]
    assert main([*common, "--output", str(tmp_path / "plain")]) == 0
    assert main([*common, "--output", str(tmp_path / "cn"), "--controlnet", f"{tmp_path / 'canny_net'}:1.5",
                 "--control-preprocessor", "softedge"]) == 0
    assert "ControlNet: " in capsys.readouterr().out
    plain = [np.asarray(Image.open(f)) for f in sorted((tmp_path / "plain").glob("*.png"))]
    controlled = [np.asarray(Image.open(f)) for f in sorted((tmp_path / "cn").glob("*.png"))]
    assert len(controlled) == 2 and any(not np.array_equal(a, b) for a, b in zip(plain, controlled))
    assert main([*common, "--output", str(tmp_path / "x"), "--control-preprocessor", "canny"]) == 1
    assert "one per net" in capsys.readouterr().err
    assert main([*common, "--output", str(tmp_path / "x"), "--controlnet", str(tmp_path / "canny_net"),
                 "--control-preprocessor", "hed"]) == 1
    assert "--control-preprocessor" in capsys.readouterr().err


def test_update_changes_control_scales_live(sd):
    comps, nets = sd
    inputs = stream_frames(3, seed=2)
    plain = aligned(make_pipe(comps, []), inputs)
    pipe = make_pipe(comps, nets, [0.9, 0.9])
    pipe.update(control_scales=[0.0, 0.0], guidance_scale=1.2)
    assert [u.scale for u in pipe.addons.control.units] == [0.0, 0.0] and pipe.config.guidance_scale == 1.2
    assert all(np.array_equal(a, b) for a, b in zip(plain, aligned(pipe, inputs)))
    with pytest.raises(StreamStudioError, match="one scale per ControlNet"):
        pipe.update(control_scales=[1.0])


def test_streams_with_different_control_scales_share_calls_and_get_their_own_frames(sd):
    """Cross-stream batching: two ControlNet streams at different conditioning scales (per-row
    scales) and CFG types run at the same time through one executor; their UNet calls are joined
    and each stream gets the frames it gets alone."""
    from helpers import run_in_lockstep

    from streamstudio.models.image.batching import BatchExecutor, BatchingConfig, batched_components

    comps, nets = sd
    with_nets = dataclasses.replace(comps, controlnets=list(nets))
    specs = [([0.7, 0.4], "self", stream_frames(3, seed=5)), ([0.1, 1.2], "initialize", stream_frames(3, seed=6))]
    alone = []
    for scales, cfg, inputs in specs:
        pipe = make_pipe(with_nets, nets, scales, steps=2, cfg_type=cfg, guidance_scale=1.3)
        alone.append([pipe(f) for f in inputs])
    executor = BatchExecutor(BatchingConfig(max_wait_ms=500))
    try:
        shared = batched_components(with_nets, executor)
        pipes = [make_pipe(shared, nets, scales, steps=2, cfg_type=cfg, guidance_scale=1.3) for scales, cfg, _ in specs]
        got = run_in_lockstep(executor, pipes, [spec[2] for spec in specs])
        assert executor.stats.batched_calls > 0, "no call served both streams"
        for want, have in zip(alone, got):
            assert len(have) == len(want)
            assert all(np.abs(a.astype(np.int16) - b.astype(np.int16)).max() <= 1 for a, b in zip(want, have))
    finally:
        executor.close()


def test_web_sessions_start_from_the_clis_control_settings(sd, tmp_path):
    """serve's sessions are built by ServerModel over the shared model: each gets its own control
    inputs with the --control-preprocessor and --controlnet scales given on the command line."""
    from streamstudio.app.web.sessions import ServerModel
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig

    comps, nets = sd
    shared = dataclasses.replace(comps, controlnets=list(nets), control_defaults=[("softedge", 0.6), ("none", 0.2)])
    model = ServerModel(shared, StreamDiffusionConfig(width=SIZE, height=SIZE, steps=2), prompt="a cat")
    try:
        a, b = model.build("img2img"), model.build("img2img")
        assert ([(u.preprocessor.config.kind, u.scale) for u in a.addons.control.units]
                == [("softedge", 0.6), ("none", 0.2)])
        a.addons.set_control_scale(0, 1.5)  # one session's change is its own
        assert b.addons.control.units[0].scale == 0.6
    finally:
        model.close()


def test_no_upload_or_extra_sync_per_frame(sd):
    """The per-call scales stay on the device until a scale changes (an upload is a host sync on a
    GPU), and a ControlNet frame makes as many sync calls as a plain one (test_hot_path's count)."""
    from helpers import CountSyncs

    comps, nets = sd
    pipe = make_pipe(comps, nets[:1], cfg_type="none")
    frames = stream_frames(4, seed=8)
    pipe(frames[0])
    first = pipe.addons.control.scales(1, pipe.device)
    pipe(frames[1])
    assert pipe.addons.control.scales(1, pipe.device) is first
    pipe.addons.set_control_scale(0, 0.5)
    assert pipe.addons.control.scales(1, pipe.device) is not first

    def syncs(p, frame):
        with CountSyncs() as counter:
            p(frame)
        return sum(counter.counts.values())

    plain = make_pipe(comps, [], cfg_type="none")
    plain(frames[0]), plain(frames[1])
    assert syncs(pipe, frames[2]) == syncs(plain, frames[2])


def test_warm_up_feeds_every_field_the_model_takes(tmp_path):
    """The acceleration warm-up's example condition (SDComponents.example_cond) carries SDXL's
    pooled text and time ids, the ControlNets' images and scales and IP-Adapter's embedding:
    the UNet takes it (an SDXL UNet refuses a call without them) and its fields are the ones a
    stream's calls have, so a compiled graph is not compiled again at the first frame."""
    from addon_models import write_tiny_ip_adapter

    from streamstudio.models.image.acceleration import BatchPlan, warm_up
    from streamstudio.models.image.ip_adapter import IPAdapter
    from streamstudio.models.image.loading import load_components

    xl = load_components("tiny-sdxl")
    xl.controlnets = [tiny_controlnet(xl.unet)]
    xl.ip_adapter = IPAdapter(xl, str(write_tiny_ip_adapter(xl.unet, tmp_path / "ip")))
    plan = BatchPlan.for_streams(height=SIZE, width=SIZE, steps=2, cfg_types=["self"])
    assert warm_up(xl, plan) > 0
    pipe = make_pipe(xl, xl.controlnets, steps=2)
    seen = []
    recorder = lambda m, a, kw: seen.append(kw)  # noqa: E731
    handle = xl.unet.register_forward_pre_hook(recorder, with_kwargs=True)
    try:
        pipe(stream_frames(1)[0])
        stream_calls = len(seen)
        warm_up(xl, plan)
    finally:
        handle.remove()
    stream_call, warm_call = seen[stream_calls - 1], seen[-1]  # the stream's last UNet call, a warm-up call
    assert stream_call["added_cond_kwargs"].keys() == warm_call["added_cond_kwargs"].keys() == \
        {"text_embeds", "time_ids", "image_embeds"}
    assert len(stream_call["down_block_additional_residuals"]) == len(warm_call["down_block_additional_residuals"])


@pytest.mark.slow
def test_unet_export_with_sdxl_fields_and_a_controlnet_matches_onnxruntime(tmp_path):
    """The TensorRT path's ONNX export of the UNet call (models/image/export_specs.image_specs) takes
    every field of the model's condition as an input (SDXL's pooled text and time ids, the
    ControlNet's image at pixel size and its scale) and computes what the eager call does
    (onnxruntime at another batch and size); the engine's cache identity covers the ControlNet."""
    pytest.importorskip("onnxruntime")
    from streamstudio.kernels.tensorrt.cache import model_identity
    from streamstudio.kernels.tensorrt.export import check_onnx, export_onnx
    from streamstudio.models.image.export_specs import image_specs
    from streamstudio.models.image.loading import load_components

    xl = load_components("tiny-sdxl")
    xl.controlnets = [tiny_controlnet(xl.unet)]
    spec = image_specs(xl, ("unet",))[0]
    path = export_onnx(spec, tmp_path / "unet" / "model.onnx", batch=2, height=64, width=64)
    result = check_onnx(spec, path, batch=1, height=96, width=128)
    assert result.rel_error < 1e-3
    assert result.shapes["control_0"] == (1, 3, 96, 128) and result.shapes["time_ids"] == (1, 6)
    before = model_identity(spec.source)
    with torch.no_grad():
        xl.controlnets[0].controlnet_mid_block.weight.mul_(2)
    assert model_identity(image_specs(xl, ("unet",))[0].source) != before


def test_web_api_control_scales_reach_the_session_stream(sd):
    """The web API's settings check takes control_scales (the session's own scales, per row) and
    a session applies them to its stream; wrong values are one clear error."""
    from streamstudio.app.settings import parse_settings
    from streamstudio.app.web.sessions import ServerModel
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig

    comps, nets = sd
    assert parse_settings({"control_scales": [0.8, 1]}) == {"control_scales": [0.8, 1.0]}
    for bad in ([], [True], ["1"], [11.0], 0.5):
        with pytest.raises(StreamStudioError, match="control_scales is a list"):
            parse_settings({"control_scales": bad})
    shared = dataclasses.replace(comps, controlnets=list(nets), control_defaults=[("canny", 1.0), ("none", 1.0)])
    model = ServerModel(shared, StreamDiffusionConfig(width=SIZE, height=SIZE, steps=2), prompt="a cat")
    try:
        pipe = model.build("img2img")
        pipe.update(**parse_settings({"control_scales": [0.25, 0.0], "guidance_scale": 1.1}))
        assert [u.scale for u in pipe.addons.control.units] == [0.25, 0.0] and pipe.config.guidance_scale == 1.1
        with pytest.raises(StreamStudioError, match="one scale per ControlNet"):
            pipe.update(**parse_settings({"control_scales": [0.5]}))
    finally:
        model.close()


def test_txt2img_with_a_control_picture(sd, tmp_path, capsys):
    """txt2img with ControlNets: one control picture, preprocessed once, controls every image;
    through generate's --control-image too."""
    from PIL import Image

    from streamstudio.app.cli import main

    comps, nets = sd
    picture = np.zeros((48, 48, 3), np.uint8)
    picture[:, 24:] = 255  # a step: fitted to the stream's 32x32, then its canny edges
    pipe = make_pipe(comps, nets[:1], preprocessor="canny", mode="txt2img", steps=2)
    pipe.addons.set_control_image(picture)
    images = pipe.generate(3)
    assert len(images) == 3 and pipe.addons.control.runs == 1
    zero = make_pipe(comps, nets[:1], [0.0], preprocessor="canny", mode="txt2img", steps=2)
    zero.addons.set_control_image(picture)
    plain = make_pipe(comps, [], mode="txt2img", steps=2).generate(3)
    assert all(np.array_equal(a, b) for a, b in zip(plain, zero.generate(3)))
    assert any(not np.array_equal(a, b) for a, b in zip(plain, images))
    with pytest.raises(StreamStudioError, match="img2img stream takes"):
        make_pipe(comps, nets[:1]).addons.set_control_image(picture)

    nets[0].save_pretrained(tmp_path / "net")
    Image.fromarray(picture).save(tmp_path / "edges.png")
    common = ["generate", "--model", "tiny", "--prompt", "a fox", "--width", "32", "--height", "32",
              "--controlnet", str(tmp_path / "net")]
    assert main([*common, "--output", str(tmp_path / "out"), "--num-images", "2", "--control-image",
                 str(tmp_path / "edges.png")]) == 0
    assert len(list((tmp_path / "out").glob("*.png"))) == 2
    assert main([*common, "--output", str(tmp_path / "x")]) == 1
    assert "control picture" in capsys.readouterr().err


def control_picture(h=61, w=97, seed=0):
    """A picture that needs a resize: smooth gradients, hard edges and camera-like noise, uint8 RGB."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    g = np.stack([xx * 255 / (w - 1), yy * 255 / (h - 1), (xx + yy) * 127 / (h + w)], -1)
    g[:, w // 3:w // 3 + 2] = 255  # a bright bar
    g[h // 2] = 0  # a dark line
    g[h // 5:h // 2, w // 2:] = 200  # a flat block
    return np.clip(np.round(g + rng.normal(0, 12, g.shape)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("height,width,picture_size", [(64, 96, (61, 97)), (32, 32, (61, 97)), (128, 160, (61, 97)),
                                                       (64, 96, (64, 96))])
def test_control_picture_is_fitted_as_diffusers_controlnet_pipeline(sd, height, width, picture_size):
    """txt2img's control picture at the stream's size equals diffusers' own: the control tensor
    StableDiffusionControlNetPipeline.prepare_image makes of the PIL picture (its
    control_image_processor: PIL's Lanczos on the 8-bit picture, / 255), exactly; shrinking,
    enlarging, a change of aspect, and a picture at the size. The preprocessor then runs on that
    (canny on diffusers' tensor). The stream's bilinear input resize was up to 39/255 off."""
    from diffusers import LCMScheduler, StableDiffusionControlNetPipeline
    from PIL import Image

    from streamstudio.pipelines.image.control import ControlInputs, ControlUnit, Preprocessor, canny, fit_picture

    comps, nets = sd
    theirs = StableDiffusionControlNetPipeline(
        vae=comps.vae, text_encoder=comps.text_encoder, tokenizer=comps.tokenizer, unet=comps.unet, controlnet=nets[0],
        scheduler=LCMScheduler.from_config(comps.scheduler_config), safety_checker=None, feature_extractor=None,
        requires_safety_checker=False)
    picture = control_picture(*picture_size)
    want = theirs.prepare_image(Image.fromarray(picture), width=width, height=height, batch_size=1,
                                num_images_per_prompt=1, device=torch.device("cpu"), dtype=torch.float32)
    assert want.shape == (1, 3, height, width)
    assert torch.equal(fit_picture(picture, height, width), want)
    control = ControlInputs([ControlUnit(Preprocessor("none")), ControlUnit(Preprocessor("canny"))])
    plain, edges = control.picture_images([picture, picture], height, width)
    assert torch.equal(plain, want.expand(2, -1, -1, -1))
    assert torch.equal(edges, canny(want).expand(2, 3, -1, -1))


def test_txt2img_control_picture_reaches_the_net_as_diffusers_prepares_it(sd):
    """set_control_image on a picture of another size and aspect: every row of every ControlNet
    call takes the control tensor diffusers' StableDiffusionControlNetPipeline.prepare_image makes
    of it (PIL's Lanczos), not the stream's bilinear input resize (up to 39/255 off)."""
    from diffusers import LCMScheduler, StableDiffusionControlNetPipeline
    from PIL import Image

    comps, nets = sd
    theirs = StableDiffusionControlNetPipeline(
        vae=comps.vae, text_encoder=comps.text_encoder, tokenizer=comps.tokenizer, unet=comps.unet, controlnet=nets[0],
        scheduler=LCMScheduler.from_config(comps.scheduler_config), safety_checker=None, feature_extractor=None,
        requires_safety_checker=False)
    picture = control_picture(61, 97)
    want = theirs.prepare_image(Image.fromarray(picture), width=SIZE, height=SIZE, batch_size=1,
                                num_images_per_prompt=1, device=torch.device("cpu"),
                                dtype=torch.float32)  # (1, 3, 32, 32)
    pipe = make_pipe(comps, nets[:1], mode="txt2img", steps=2)
    seen = []
    hook = nets[0].register_forward_pre_hook(lambda m, a, kw: seen.append(kw["controlnet_cond"].clone()),
                                             with_kwargs=True)
    try:
        pipe.addons.set_control_image(picture)
        pipe.generate(1)
    finally:
        hook.remove()
    assert seen
    for cond in seen:
        assert (cond - want).abs().max() <= 1e-6, (cond - want).abs().max().item() * 255


@pytest.mark.slow
def test_compiled_controlnet_stream_equals_eager(sd, tmp_path):
    """--acceleration compile with a ControlNet (the warm-up feeds the control fields, so the
    stream's calls run the warmed graphs): the images equal the eager run's (~80 s on a CPU)."""
    from PIL import Image

    from streamstudio.app.cli import main

    comps, nets = sd
    nets[0].save_pretrained(tmp_path / "net")
    src = tmp_path / "in"
    src.mkdir()
    for i, image in enumerate(stream_frames(3, seed=9)):
        Image.fromarray(image).save(src / f"{i}.png")
    outs = {}
    for acc in ("none", "compile"):
        assert main(["generate", "--model", "tiny", "--input", str(src), "--output", str(tmp_path / acc),
                     "--width", "32", "--height", "32", "--steps", "2", "--controlnet", str(tmp_path / "net"),
                     "--acceleration", acc]) == 0
        outs[acc] = [np.asarray(Image.open(f)).astype(int) for f in sorted((tmp_path / acc).glob("*.png"))]
    assert len(outs["compile"]) == 3
    assert all(np.abs(a - b).max() <= 1 for a, b in zip(outs["none"], outs["compile"]))
