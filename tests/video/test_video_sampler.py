"""The StreamDiT buffer sampler: exactness, level bookkeeping, streaming vs a whole-video reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamstudio.errors import StreamStudioError
from streamstudio.models.video.stream_dit import StreamDiT, StreamDiTConfig, TextEncoderConfig
from streamstudio.models.video.video_net import PixelCodec, StreamDiTBackbone
from streamstudio.pipelines.video.stream_video import (ChunkDecoder, StreamBufferConfig, StreamSampler,
                                                       StreamVideoConfig, VideoStream, frame_noise, level_times)

SHAPE = (2, 3, 3)  # (C, h, w) latents of the oracle tests
CONFIGS = [(8, 1, 1), (4, 2, 2), (2, 4, 4), (1, 8, 8)]  # (N, c, s)


def target(i: int) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(10_000 + i), dtype=torch.float64)


class Oracle:
    """The exact velocity toward known per-frame targets: v = (x1 - x) / (1 - t)."""

    def __init__(self):
        self.sampler: StreamSampler | None = None
        self.calls: list[tuple[list[int], list[float]]] = []  # (frame ids, their t) per call
        self.texts: list[str] = []

    def encode_text(self, prompt: str) -> str:
        return prompt

    def velocity(self, x, t, text):
        ids = self.sampler.ids  # rows after the reference frames
        k = x.shape[1] - len(ids)
        x1 = torch.stack([target(i) for i in ids])
        tt = t[0, k:, None, None, None]
        v = torch.zeros_like(x)
        v[0, k:] = (x1 - x[0, k:]) / (1 - tt)
        self.calls.append((list(ids), t[0, k:].tolist()))
        self.texts.append(text)
        return v


def oracle_sampler(n, c, s, k=0, strength=1.0):
    oracle = Oracle()
    cfg = StreamBufferConfig(num_chunks=n, chunk_size=c, micro_steps=s, ref_frames=k, strength=strength)
    sampler = StreamSampler(oracle, cfg, SHAPE, "p", dtype=torch.float64)
    oracle.sampler = sampler
    return sampler, oracle


def assert_on_straight_path(sampler: StreamSampler):
    t = sampler.times[sampler.levels]
    for row, i in enumerate(sampler.ids):
        expect = (1 - t[row]) * sampler.noise[i] + t[row] * target(i)
        torch.testing.assert_close(sampler.x[row], expect, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n,c,s", CONFIGS)
def test_exact_velocity_reproduces_targets_on_straight_paths(n, c, s):
    sampler, _ = oracle_sampler(n, c, s)
    sampler.start()
    assert_on_straight_path(sampler)
    out = []
    for _ in range(3 * n * s):
        done = sampler.step()
        assert_on_straight_path(sampler)
        if done is not None:
            out.extend(done)
    assert len(out) == 3 * n * c
    for i, frame in enumerate(out):
        torch.testing.assert_close(frame, target(i), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n,c,s", CONFIGS)
def test_every_frame_passes_all_levels_once_in_order(n, c, s):
    sampler, oracle = oracle_sampler(n, c, s)
    sampler.start()
    assert len(oracle.calls) == (n - 1) * s  # the uniform start
    start_level = {i: int(lv) for i, lv in zip(sampler.ids, sampler.levels)}
    assert [start_level[j * c] for j in range(n)] == [(n - 1 - j) * s for j in range(n)]
    oracle.calls.clear()
    leave_calls = []
    for call in range(1, 4 * n * s + 1):
        if sampler.step() is not None:
            leave_calls.append(call)
    assert leave_calls == list(range(s, 4 * n * s + 1, s))  # one chunk every s calls
    seen: dict[int, list[float]] = {}
    for ids, ts in oracle.calls:
        for i, t in zip(ids, ts):
            seen.setdefault(i, []).append(t)
    times = level_times(sampler.cfg)[:-1].tolist()
    for i in range(4 * n * c):  # these frames went all the way: levels start..T-1 in the buffer
        assert seen[i] == pytest.approx(times[start_level.get(i, 0):]), f"frame {i}"
        assert start_level.get(i, 0) == 0 or i < n * c


def test_video_to_video_oracle_keeps_straight_paths_from_t_start():
    sampler, _ = oracle_sampler(4, 2, 2, strength=0.5)
    assert float(sampler.times[0]) == pytest.approx(0.5)
    sampler.start(torch.stack([target(i) for i in range(8)]))
    assert_on_straight_path(sampler)
    out = []
    for _ in range(8):
        done = sampler.step(torch.stack([target(sampler.next_id + j) for j in range(2)]))
        assert_on_straight_path(sampler)
        if done is not None:
            out.extend(done)
    for i, frame in enumerate(out):
        torch.testing.assert_close(frame, target(i), rtol=0, atol=1e-12)


def test_prompt_change_reaches_the_next_call():
    sampler, oracle = oracle_sampler(2, 1, 1)
    sampler.start()
    sampler.step()
    sampler.set_prompt("new")
    sampler.step()
    assert oracle.texts[-2:] == ["p", "new"]


def test_text_to_video_refuses_partial_strength_without_input():
    sampler, _ = oracle_sampler(2, 1, 1, strength=0.5)
    with pytest.raises(StreamStudioError):
        sampler.start()


# ---------------------------------------------------------------------------- random network


def small_model(window=(2, 4, 4), temporal_position=True, seed=0) -> StreamDiT:
    torch.manual_seed(seed)
    cfg = StreamDiTConfig(in_channels=2, patch_size=2, hidden_size=32, depth=2, num_heads=2, window=window,
                          temporal_position=temporal_position, text=TextEncoderConfig(dim=16, hash_buckets=8))
    model = StreamDiT(cfg).double().eval()
    with torch.no_grad():  # adaLN-Zero starts at zero: give it random weights so every path matters
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def reference_video(model, cfg: StreamBufferConfig, shape, prompt, total):
    """Whole video held at once, one level per frame; every call sees the frames of the window.
    The solver (cfg.solver) is written per frame from its textbook form, with each frame's
    velocity history kept by frame index (the start-up's uniform generation hands its own on)."""
    n, c, s, k = cfg.num_chunks, cfg.chunk_size, cfg.micro_steps, cfg.ref_frames
    times = level_times(cfg)
    text = model.encode_text([prompt])
    frames = total + n * c
    video = torch.stack([frame_noise(cfg.seed, i, shape) for i in range(frames)]).double()  # (F, C, h, w)
    level = torch.zeros(frames, dtype=torch.long)
    history: dict[int, tuple[int, torch.Tensor]] = {}  # frame -> (level, its velocity there)

    def step(x, lv, v, v_guess, hist):
        """One frame x from level lv to lv + 1; v its velocity, v_guess (heun) the one at the Euler
        guess and the next level, hist its (level, velocity) before or None."""
        h = float(times[lv + 1] - times[lv])
        if cfg.solver == "heun":
            return x + h * (v + v_guess) / 2
        if cfg.solver == "ab2" and hist is not None and hist[0] == lv - 1:  # Adams-Bashforth, variable step
            h0 = float(times[lv] - times[lv - 1])
            return x + h * ((1 + h / (2 * h0)) * v - h / (2 * h0) * hist[1])
        return x + h * v

    def net(x, t):
        with torch.no_grad():
            return model(x[None], t[None], text)[0]

    u = video[: n * c].clone()  # the uniform start
    u_hist: dict[int, tuple[int, torch.Tensor]] = {}
    for st in range((n - 1) * s + 1):
        for j in range(n):
            if (n - 1 - j) * s == st:
                video[j * c:(j + 1) * c], level[j * c:(j + 1) * c] = u[j * c:(j + 1) * c], st
                history.update({i: u_hist[i] for i in range(j * c, (j + 1) * c) if i in u_hist})
        if st < (n - 1) * s:
            t = torch.full((n * c,), float(times[st]), dtype=torch.float64)
            v = net(u, t)
            guess = net(u + float(times[st + 1] - times[st]) * v, torch.full_like(t, float(times[st + 1])))
            u = torch.stack([step(u[i], st, v[i], guess[i], u_hist.get(i)) for i in range(n * c)])
            u_hist = {i: (st, v[i]) for i in range(n * c)}
    lo = 0
    while lo < total:
        hi = lo + n * c
        r = lo - k if lo >= k else lo  # the K references, once K frames are finished
        refs, t_refs = video[r:lo], torch.ones(lo - r, dtype=torch.float64)
        v = net(torch.cat([refs, video[lo:hi]]), torch.cat([t_refs, times[level[lo:hi]]]))[lo - r:]
        h = (times[level[lo:hi] + 1] - times[level[lo:hi]])[:, None, None, None]
        guess = net(torch.cat([refs, video[lo:hi] + h * v]), torch.cat([t_refs, times[level[lo:hi] + 1]]))[lo - r:]
        new = [step(video[i], int(level[i]), v[i - lo], guess[i - lo], history.get(i)) for i in range(lo, hi)]
        history.update({i: (int(level[i]), v[i - lo]) for i in range(lo, hi)})
        video[lo:hi] = torch.stack(new)
        level[lo:hi] += 1
        while lo < frames and level[lo] == cfg.levels:
            lo += 1
    return video[:total]


def stream(sampler: StreamSampler, frames: int) -> list[torch.Tensor]:
    """Step a started sampler until at least `frames` frames came out; all of them, in order."""
    out = []
    while len(out) < frames:
        done = sampler.step()
        if done is not None:
            out.extend(done)
    return out

@pytest.mark.parametrize("n,c,s,k,window,solver", [
    (4, 2, 2, 0, None, "euler"), (2, 4, 4, 0, None, "euler"), (4, 2, 1, 2, None, "euler"),
    (4, 1, 2, 4, (4, 4, 4), "euler"), (4, 2, 2, 0, None, "ab2"), (4, 1, 2, 0, (4, 4, 4), "ab2"),
    (4, 2, 1, 2, None, "ab2"), (4, 2, 2, 0, None, "heun"), (4, 2, 1, 2, None, "heun")])
def test_streaming_equals_whole_video_reference(n, c, s, k, window, solver):
    """The fourth case: one frame a chunk and 4 references under a temporal window of 4 (the
    built-in model's), which took 5 frames after the first rotation and failed. The ab2 cases
    check each frame's velocity history across the start-up's hand-over and the rotations."""
    model = small_model() if window is None else small_model(window=window)
    cfg = StreamBufferConfig(num_chunks=n, chunk_size=c, micro_steps=s, ref_frames=k, seed=3, solver=solver)
    shape = (2, 8, 8)
    sampler = StreamSampler(StreamDiTBackbone(model), cfg, shape, "a red circle", dtype=torch.float64)
    sampler.start()
    out = stream(sampler, 12)
    ref = reference_video(model, cfg, shape, "a red circle", 12)
    torch.testing.assert_close(torch.stack(out[:12]), ref, rtol=1e-9, atol=1e-9)


def test_temporal_window_one_equals_per_frame_uniform_sampling():
    model = small_model(window=(1, 4, 4), temporal_position=False)
    cfg = StreamBufferConfig(num_chunks=4, chunk_size=2, micro_steps=2, seed=5)
    shape = (2, 8, 8)
    sampler = StreamSampler(StreamDiTBackbone(model), cfg, shape, "blue", dtype=torch.float64)
    sampler.start()
    out = stream(sampler, 10)
    times = level_times(cfg)
    text = model.encode_text(["blue"])
    for i in range(10):
        x = frame_noise(cfg.seed, i, shape).double()[None, None]  # (1, 1, C, h, w)
        with torch.no_grad():
            for lv in range(cfg.levels):
                x = x + (times[lv + 1] - times[lv]) * model(x, times[lv].reshape(1, 1), text)
        torch.testing.assert_close(out[i], x[0, 0], rtol=1e-9, atol=1e-9)
    # and a temporal window of 2 does mix frames (so the check above can fail)
    model2 = small_model(window=(2, 4, 4), temporal_position=False)
    s2 = StreamSampler(StreamDiTBackbone(model2), cfg, shape, "blue", dtype=torch.float64)
    s2.start()
    x = frame_noise(cfg.seed, 0, shape).double()[None, None]
    with torch.no_grad():
        for lv in range(cfg.levels):
            x = x + (times[lv + 1] - times[lv]) * model2(x, times[lv].reshape(1, 1), text)
    first = None
    while first is None:
        first = s2.step()
    assert (first[0] - x[0, 0]).abs().max() > 1e-6


# ---------------------------------------------------------------------------- decoding and frame API


class BoxCodec(PixelCodec):
    """A temporal decoder: each frame is averaged with its neighbours inside the decoded span."""

    def decode(self, latents):
        padded = torch.cat([latents[:1], latents, latents[-1:]])
        return (padded[:-2] + padded[1:-1] + padded[2:]) / 3


def test_chunk_decoder_overlap_hides_seams():
    torch.manual_seed(0)
    video = torch.linspace(-1, 1, 24).repeat_interleave(1)[:, None, None, None].expand(24, 1, 2, 2).clone()
    whole = BoxCodec().decode(video)

    def chunked(overlap):
        dec = ChunkDecoder(BoxCodec(), overlap)
        parts = [dec.push(video[i:i + 4]) for i in range(0, 24, 4)]
        tail = dec.flush()
        return torch.cat(parts + ([tail] if tail is not None else []))

    err_plain = (chunked(0) - whole).abs().max()
    err_overlap = (chunked(2) - whole).abs().max()
    assert chunked(2).shape == whole.shape
    assert err_overlap < 0.5 * err_plain


def test_video_stream_frame_api_text_and_video():
    model = small_model().float()
    model.cfg.in_channels = 2
    cfg = StreamVideoConfig(StreamBufferConfig(num_chunks=2, chunk_size=2, micro_steps=1, strength=1.0),
                            height=8, width=8, out_height=16, out_width=16)

    class TwoChannel(PixelCodec):
        def encode(self, images):
            return super().encode(images)[:, :2]

        def decode(self, latents):
            return torch.cat([latents, latents[:, :1]], 1)

    stream = VideoStream(StreamDiTBackbone(model), cfg, "red", codec=TwoChannel(), latent_channels=2)
    frames = list(stream.frames(5))
    assert len(frames) == 5 and frames[0].shape == (16, 16, 3) and frames[0].dtype == np.uint8
    with pytest.raises(StreamStudioError):
        stream.push(np.zeros((8, 8, 3), np.uint8))

    cfg.buffer = StreamBufferConfig(num_chunks=2, chunk_size=2, micro_steps=1, strength=0.5)
    v2v = VideoStream(StreamDiTBackbone(model), cfg, "red", codec=TwoChannel(), latent_channels=2)
    out = []
    for i in range(7):
        out += v2v.push(np.full((12, 12, 3), 20 * i, np.uint8))
    out += v2v.flush()
    assert len(out) == 7
    with pytest.raises(StreamStudioError):
        v2v.push(np.zeros((8, 8), np.uint8))


# ---------------------------------------------------------------------------- warm-up (issue 30)


@pytest.mark.parametrize("n,c,s", CONFIGS[:3])
def test_warmup_shows_only_frames_made_by_streaming_calls(n, c, s):
    """With `warmup`, every frame shown went through every level in streaming calls (the buffer at
    N different levels), none in a call of the start-up's uniform generation (every frame at one
    level). The paper's start shows frames that did not (so the check can fail)."""
    for warmup in (True, False):
        oracle = Oracle()
        cfg = StreamBufferConfig(num_chunks=n, chunk_size=c, micro_steps=s, warmup=warmup)
        sampler = StreamSampler(oracle, cfg, SHAPE, "p", dtype=torch.float64)
        oracle.sampler = sampler
        sampler.start()
        shown = stream(sampler, 2 * n * c)
        # the exact velocity: frame i becomes target(i)
        first = next(i for i in range(n * c) if torch.allclose(shown[0], target(i), rtol=0, atol=1e-9))
        streamed: dict[int, list[float]] = {}  # frame id -> its times in streaming calls
        for ids, ts in oracle.calls:
            if len(set(ts)) > 1:
                for i, t in zip(ids, ts):
                    streamed.setdefault(i, []).append(t)
        levels = pytest.approx(level_times(cfg)[:-1].tolist())
        whole = [streamed.get(i) == levels for i in range(first, first + len(shown))]
        if warmup:
            assert all(whole) and first == (n - 1) * c
            assert sampler.startup_calls == 2 * (n - 1) * s and sampler.calls == len(shown) // c * s
        else:
            assert first == 0 and not all(whole)


@pytest.mark.parametrize("n,c,s,k", [(4, 2, 2, 0), (4, 2, 1, 2)])
def test_warmup_drops_the_startup_frames_and_changes_nothing_else(n, c, s, k):
    """A random network: the warmed-up stream is the plain stream without its first (N-1)*c frames
    (the same noise per frame id; dropped chunks still become the reference frames)."""
    model = small_model()
    shape = (2, 8, 8)
    outs = []
    for warmup in (False, True):
        cfg = StreamBufferConfig(num_chunks=n, chunk_size=c, micro_steps=s, ref_frames=k, seed=4, warmup=warmup)
        sampler = StreamSampler(StreamDiTBackbone(model), cfg, shape, "a red circle", dtype=torch.float64)
        sampler.start()
        out = stream(sampler, 16)
        outs.append(torch.stack(out))
    drop = (n - 1) * c
    assert StreamBufferConfig(num_chunks=n, chunk_size=c, warmup=True).warmup_frames == drop
    torch.testing.assert_close(outs[1][: 16 - drop], outs[0][drop:16], rtol=1e-9, atol=1e-9)


def test_video_to_video_has_no_warmup():
    """An input frame's output stays aligned with it: the SDEdit start drops nothing."""
    sampler, oracle = oracle_sampler(4, 2, 2, strength=0.5)
    sampler.cfg.warmup = True
    sampler.start(torch.stack([target(i) for i in range(8)]))
    assert sampler.startup_calls == 6 and sampler.calls == 0 and sampler.ids[0] == 0


# ---------------------------------------------------------------------------- solvers (issue 30)


class Decay:
    """dx/dt = lam * x for every frame: x(1) = x(t_0) exp(lam (1 - t_0)), whatever the buffer."""

    lam = -1.5

    def encode_text(self, prompt: str) -> str:
        return prompt

    def velocity(self, x, t, text):
        return self.lam * x


@pytest.mark.parametrize("solver,order", [("euler", 1), ("ab2", 2), ("heun", 2)])
def test_solver_error_falls_with_its_order(solver, order):
    """Halving the level spacing divides a p-th order method's global error by about 2^p
    (Euler 2, Adams-Bashforth 2 and Heun 4): the frames, streamed through the buffer and through
    the start-up, against the exact solution of a linear ODE."""
    errors = []
    for s in (4, 8, 16):
        cfg = StreamBufferConfig(num_chunks=4, chunk_size=1, micro_steps=s, seed=1, solver=solver)
        sampler = StreamSampler(Decay(), cfg, SHAPE, "p", dtype=torch.float64)
        sampler.start()
        out = stream(sampler, 8)
        exact = [frame_noise(1, i, SHAPE).double() * np.exp(Decay.lam) for i in range(8)]
        errors.append(max(float((o - e).abs().max()) for o, e in zip(out, exact)))
    ratios = [errors[0] / errors[1], errors[1] / errors[2]]
    assert all(2 ** order * 0.8 < r < 2 ** order * 1.25 for r in ratios), (errors, ratios)


def test_ab2_keeps_straight_paths_exact():
    """On a straight path the velocity does not change, so Adams-Bashforth is exact too."""
    oracle = Oracle()
    cfg = StreamBufferConfig(num_chunks=4, chunk_size=2, micro_steps=2, solver="ab2")
    sampler = StreamSampler(oracle, cfg, SHAPE, "p", dtype=torch.float64)
    oracle.sampler = sampler
    sampler.start()
    out = stream(sampler, 12)
    for i, frame in enumerate(out[:12]):
        torch.testing.assert_close(frame, target(i), rtol=0, atol=1e-12)


def test_unknown_solver_is_refused():
    with pytest.raises(StreamStudioError, match="solver must be one of euler, ab2, heun, got 'rk4'"):
        StreamBufferConfig(solver="rk4").validate()


class FarOracle(Oracle):
    """The exact velocity toward targets three times the data range's scale (most values beyond +-1)."""

    def velocity(self, x, t, text):
        ids = self.sampler.ids
        x1 = torch.stack([3 * target(i) for i in ids])
        return ((x1 - x[0]) / (1 - t[0, :, None, None, None]).clamp_min(1e-12))[None]


@pytest.mark.parametrize("solver", ["euler", "ab2"])
def test_clip_sample_lands_on_the_clipped_target(solver):
    """diffusers' clip_sample: the predicted clean frame is clipped to [-r, r] before each step, so
    a frame whose exact target lies outside ends on the target clipped (and on the target itself
    without the clip). (Heun's second call at t = 1 meets the exact field's 0 / 0 there.)"""
    for clip in (True, False):
        oracle = FarOracle()
        cfg = StreamBufferConfig(num_chunks=4, chunk_size=1, micro_steps=2, solver=solver, clip_sample=clip,
                                 clip_sample_range=1.5)
        sampler = StreamSampler(oracle, cfg, SHAPE, "p", dtype=torch.float64)
        oracle.sampler = sampler
        sampler.start()
        out = stream(sampler, 6)
        for i, frame in enumerate(out[:6]):
            want = 3 * target(i)
            torch.testing.assert_close(frame, want.clamp(-1.5, 1.5) if clip else want, rtol=0, atol=1e-9)
    with pytest.raises(StreamStudioError, match="clip_sample_range"):
        StreamBufferConfig(clip_sample=True, clip_sample_range=0).validate()
