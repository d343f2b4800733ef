"""Fused kernels and the image pipeline: speed against torch eager and the bandwidth floor.
(Not named kernels.py: with benchmarks/ on the path that name shadowed the `kernels` package
transformers looks for, and importing transformers ran this script.)

    python benchmarks/kernel_ops.py                 # GPU: full sizes; CPU: reference paths, reduced sizes
    python benchmarks/kernel_ops.py --quick         # fewer repeats and frames (a few seconds on CPU)
    python benchmarks/kernel_ops.py --no-pipeline   # the fused ops only

Each fused op (preprocess, postprocess, stream_step, cosine similarity) and its pure-torch
reference ("eager") are timed at sizes that do not fit in the GPU's L2 cache (each op moves
4x L2 or more: batches of 1080p frames, a stream_step buffer of 2048 512x512 latents, vectors
of 64 Mi elements), as N back-to-back launches captured in one CUDA graph, replayed and timed
with CUDA events (back-to-back launches without a graph if capture fails), so the figure is
the kernel's and not the launch's. Each op's bandwidth floor is the bytes it must move (every
input read once, every output written once) over the device-to-device copy bandwidth
measured in the same run (`dst.copy_(src)` of 1 GiB, timed the same way, read + write
counted); "floor %" = floor time / kernel time = achieved GB/s / copy GB/s, target 70 % or
better. The pipeline runs img2img at 512x512 with the sd-turbo architecture (SD 2.1 UNet
config, random weights, no downloads), 1 step, fp16, TAESD: eager, fused kernels,
torch.compile, and TensorRT when it is installed.

Results go to benchmarks/results/kernels.json (written after each part, so a run killed at a
time limit leaves what it measured): the top level is this run (device, date, copy
bandwidth, ops, pipeline, notes); "gpu" and "cpu" hold the latest run of each kind, the
other one carried over from the existing file (or from benchmarks/results/kernels.json), or
{"missing": reason}. On CPU only the reference paths run, at reduced sizes, timed over
back-to-back calls, and the GPU figures are recorded as missing with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from common import RESULTS as RESULTS_DIR, bench_device, table, utc_now, write_json  # puts the package on sys.path

from streamstudio import kernels
from streamstudio.app.cli.bench_run import device_name
from streamstudio.kernels import reference
from streamstudio.kernels.reference import CFG_FULL, CFG_NONE, CFG_SELF

RESULTS = RESULTS_DIR / "kernels.json"
TARGET_FLOOR_PCT = 70.0  # each fused op at >= 70 % of the copy bandwidth
L2_MULTIPLE = 4  # each op moves >= 4x the L2 cache
H100_L2 = 50 * 2**20  # the L2 assumed when the device does not report one
GPU_COPY_BYTES = 1 << 30
CPU_COPY_BYTES = 32 << 20

# stabilityai/sd-turbo's UNet (the SD 2.1 architecture), written out so nothing is downloaded
SD21_UNET = dict(
    sample_size=64, in_channels=4, out_channels=4, layers_per_block=2, cross_attention_dim=1024,
    block_out_channels=(320, 640, 1280, 1280), attention_head_dim=(5, 10, 20, 20), use_linear_projection=True,
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    norm_num_groups=32, act_fn="silu", flip_sin_to_cos=True, freq_shift=0,
)


# ------------------------------------------------------------------------------ timing
@dataclass(frozen=True)
class Timing:
    launches: int  # back-to-back calls per timed run (one CUDA graph on a GPU)
    replays: int  # timed runs; the median is kept


def timing(gpu: bool, quick: bool) -> Timing:
    if gpu:
        return Timing(10, 5) if quick else Timing(20, 10)
    return Timing(2, 3) if quick else Timing(5, 5)


def _warm(fn: Callable[[], object], device: torch.device, stream=None) -> None:
    """Two calls before timing: the extension's first load, cuBLAS handles, the allocator."""
    ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    with ctx:
        for _ in range(2):
            fn()


def time_graph(fn: Callable[[], object], t: Timing) -> float:
    """Seconds per call of fn: t.launches calls captured in one CUDA graph, replayed t.replays
    times, each replay timed with CUDA events; the median. Warmed up (and captured) on a side
    stream, as torch.cuda.graphs advises."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    _warm(fn, torch.device("cuda"), side)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for _ in range(t.launches):
            fn()
    graph.replay()  # the first replay uploads the graph
    torch.cuda.synchronize()
    times = []
    for _ in range(t.replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / t.launches)
    del graph
    torch.cuda.empty_cache()  # the graph's private pool, before the next op allocates
    return statistics.median(times)


def time_loop(fn: Callable[[], object], t: Timing, device: torch.device) -> float:
    """Seconds per call of fn over t.launches back-to-back calls (CUDA events around all of
    them on a GPU, so the host never waits between launches); the median of t.replays runs."""
    _warm(fn, device)
    times = []
    for _ in range(t.replays):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(t.launches):
                fn()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(t.launches):
                fn()
            seconds = time.perf_counter() - t0
        times.append(seconds / t.launches)
    return statistics.median(times)


def measure(fn: Callable[[], object], device: torch.device, t: Timing) -> tuple[float, str]:
    """(seconds per call, how it was timed): a CUDA graph on a GPU, back-to-back calls where
    capture fails (the reason kept) and on CPU."""
    if device.type == "cuda":
        try:
            return time_graph(fn, t), f"cuda graph of {t.launches} launches, median of {t.replays} replays"
        except Exception as exc:  # noqa: BLE001 - a capture failure is recorded, then the loop times it
            reason = _first_line(exc)
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
            how = f"{t.launches} back-to-back launches, median of {t.replays} (graph capture failed: {reason})"
            return time_loop(fn, t, device), how
    return time_loop(fn, t, device), f"{t.launches} back-to-back calls, median of {t.replays}"


def copy_bandwidth(device: torch.device, quick: bool, nbytes: int | None = None) -> tuple[float, str]:
    """(bytes per second, how) of a device-to-device `dst.copy_(src)`, read + write counted,
    timed as the ops are (1 GiB on a GPU)."""
    n = nbytes or (GPU_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = timing(device.type == "cuda", quick)
    seconds, how = measure(lambda: dst.copy_(src), device, t)
    return 2 * n / seconds, f"dst.copy_(src) of {n / 2**20:.0f} MiB, {how}"


def l2_bytes(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).L2_cache_size) or H100_L2


@contextlib.contextmanager
def reference_only():
    """Make the public ops take the reference (the eager baseline of the fused pipeline)."""
    saved = kernels._ops
    kernels._ops = lambda *tensors: None
    try:
        yield
    finally:
        kernels._ops = saved


# ------------------------------------------------------------------------------ ops
@dataclass(frozen=True)
class Sizes:
    cam: tuple[int, int]  # camera frames (H, W)
    size: int  # the model's input side (preprocess's output, 512)
    resize_batch: int  # frames of `cam` resized to `size` (RGB and RGBA)
    frame_batch: int  # frames of `cam` through preprocess without resize, and through postprocess
    rows: int  # stream_step buffer rows
    latent: tuple[int, int, int]  # one row (C, h, w): a 512x512 image's latent
    cosine: int  # elements per cosine vector


GPU_SIZES = Sizes(cam=(1080, 1920), size=512, resize_batch=32, frame_batch=16, rows=2048, latent=(4, 64, 64),
                  cosine=64 << 20)
CPU_SIZES = Sizes(cam=(270, 480), size=128, resize_batch=1, frame_batch=1, rows=4, latent=(4, 64, 64),
                  cosine=256 << 10)


@dataclass
class Case:
    op: str
    shape: str  # what one call moves
    fused: Callable[[], object]  # the public op (the CUDA kernel on a GPU with the extension built)
    eager: Callable[[], object]  # the pure-torch reference
    read: int  # bytes the op must read: every input once
    written: int  # bytes it must write: every output once

    @property
    def nbytes(self) -> int:
        return self.read + self.written


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _rgba_supported() -> bool:
    """preprocess takes RGBA frames (the reference composites them on black)."""
    try:
        reference.preprocess(torch.zeros(1, 2, 2, 4, dtype=torch.uint8), 2, 2)
    except (ValueError, RuntimeError):
        return False
    return True


def op_cases(device: torch.device, gpu: bool, sizes: Sizes | None = None) -> list[Case]:
    """Each fused op at `sizes` (GPU_SIZES: every op moves >= 4x an H100's 50 MB L2)."""
    s = sizes or (GPU_SIZES if gpu else CPU_SIZES)
    dtype = torch.float16 if gpu else torch.float32
    esz = torch.finfo(dtype).bits // 8
    torch.manual_seed(0)  # (seeds every device's generator)
    h, w = s.cam
    n = s.size

    def frames(batch: int, channels: int = 3) -> torch.Tensor:  # (B, H, W, C) uint8
        return torch.randint(0, 256, (batch, h, w, channels), device=device, dtype=torch.uint8)

    def like(shape) -> torch.Tensor:
        return torch.randn(shape, device=device).to(dtype)

    cam, dt_name = f"{h}x{w}", str(dtype).removeprefix("torch.")
    cases = []
    rgb = frames(s.resize_batch)  # (B, H, W, 3)
    cases.append(Case(f"preprocess resize {cam}->{n}",
                      f"{s.resize_batch}x{cam}x3 u8 -> {s.resize_batch}x3x{n}x{n} {dt_name}",
                      lambda: kernels.preprocess(rgb, n, n, dtype), lambda: reference.preprocess(rgb, n, n, dtype),
                      nbytes(rgb), s.resize_batch * 3 * n * n * esz))
    if _rgba_supported():
        rgba = frames(s.resize_batch, 4)  # (B, H, W, 4)
        cases.append(Case(f"preprocess RGBA resize {cam}->{n}",
                          f"{s.resize_batch}x{cam}x4 u8 -> {s.resize_batch}x3x{n}x{n} {dt_name}",
                          lambda: kernels.preprocess(rgba, n, n, dtype),
                          lambda: reference.preprocess(rgba, n, n, dtype),
                          nbytes(rgba), s.resize_batch * 3 * n * n * esz))
    same = frames(s.frame_batch)  # (B, H, W, 3)
    cases.append(Case(f"preprocess same size {cam}", f"{s.frame_batch}x{cam}x3 u8 -> {s.frame_batch}x3x{cam} {dt_name}",
                      lambda: kernels.preprocess(same, h, w, dtype), lambda: reference.preprocess(same, h, w, dtype),
                      nbytes(same), s.frame_batch * 3 * h * w * esz))
    images = like((s.frame_batch, 3, h, w)).clamp_(-1, 1)  # (B, 3, H, W)
    cases.append(Case(f"postprocess {cam}", f"{s.frame_batch}x3x{cam} {dt_name} -> {s.frame_batch}x{cam}x3 u8",
                      lambda: kernels.postprocess(images), lambda: reference.postprocess(images),
                      nbytes(images), s.frame_batch * h * w * 3))

    lat = (s.rows, *s.latent)  # (B, C, h, w)
    x, text, uncond, stock, noise = (like(lat) for _ in range(5))
    abar = torch.rand(s.rows, 2, device=device) * 0.8 + 0.1
    coef = torch.stack([abar[:, 0].sqrt(), (1 - abar[:, 0]).sqrt(), torch.zeros_like(abar[:, 0]),
                        torch.ones_like(abar[:, 0]), abar[:, 1].sqrt(), (1 - abar[:, 1]).sqrt()], 1)  # (B, 6) float32
    rows = f"{s.rows}x{'x'.join(map(str, s.latent))} {dt_name}"
    # (name, cfg, tensors read, outputs written): none and full return `stock` as stock_next, unwritten
    for name, cfg, read, outs in (("no CFG", CFG_NONE, (x, text, noise, coef), 2),
                                  ("self-CFG", CFG_SELF, (x, text, stock, noise, coef), 3),
                                  ("full CFG", CFG_FULL, (x, text, uncond, noise, coef), 2)):
        args = (x, text, uncond if cfg == CFG_FULL else None, stock, noise, coef, 1.2, 1.0, cfg)
        cases.append(Case(f"stream_step {name}", f"{len(read) - 1} in, {outs} out of {rows} (+ coef)",
                          lambda args=args: kernels.stream_step(*args), lambda args=args: reference.stream_step(*args),
                          nbytes(*read), outs * nbytes(x)))
    a, b = like(s.cosine), like(s.cosine)
    cases.append(Case("cosine similarity", f"2 x {s.cosine} {dt_name}", lambda: kernels.cosine_similarity(a, b),
                      lambda: reference.cosine_similarity(a, b), nbytes(a, b), 4))
    return cases


def _pct(floor_s: float, s: float | None) -> float | None:
    return 100 * floor_s / s if s else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _timed(fn: Callable[[], object], device: torch.device, t: Timing) -> tuple[float | None, str | None, str | None]:
    """(seconds, how, None), or (None, None, error) when fn fails (out of memory, say): one
    op's failure is recorded and the others are still measured."""
    try:
        seconds, how = measure(fn, device, t)
        return seconds, how, None
    except Exception as exc:  # noqa: BLE001 - recorded in the row
        if device.type == "cuda":
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        return None, None, _first_line(exc)


def bench_ops(device: torch.device, quick: bool, bandwidth: float, sizes: Sizes | None = None) -> list[dict]:
    gpu = device.type == "cuda"
    fused_ok = gpu and kernels.fused_available()
    t = timing(gpu, quick)
    l2 = l2_bytes(device)
    rows = []
    for case in op_cases(device, gpu, sizes):
        eager_s, eager_how, eager_error = _timed(case.eager, device, t)
        fused_s, fused_how, fused_error = _timed(case.fused, device, t) if fused_ok else (None, None, None)
        floor_s = case.nbytes / bandwidth
        floor_pct = _pct(floor_s, fused_s)
        row = dict(
            op=case.op, shape=case.shape, bytes=case.nbytes, bytes_read=case.read, bytes_written=case.written,
            l2_multiple=case.nbytes / l2 if l2 else None,
            eager_us=eager_s * 1e6 if eager_s else None, fused_us=fused_s * 1e6 if fused_s else None,
            floor_us=floor_s * 1e6,
            eager_GBps=case.nbytes / eager_s / 1e9 if eager_s else None,
            fused_GBps=case.nbytes / fused_s / 1e9 if fused_s else None,
            speedup=eager_s / fused_s if fused_s and eager_s else None,  # reference time / fused time
            fused_over_eager=fused_s / eager_s if fused_s and eager_s else None,  # fused time / reference time
            floor_pct=floor_pct,  # = fused GB/s as a % of the copy bandwidth
            eager_floor_pct=_pct(floor_s, eager_s),
            meets_target=floor_pct >= TARGET_FLOOR_PCT if floor_pct is not None else None,
            timing=fused_how or eager_how, eager_timing=eager_how)
        if eager_error or fused_error:
            row["error"] = "; ".join(f"{k}: {e}" for k, e in (("eager", eager_error), ("fused", fused_error)) if e)
            print(f"{case.op}: {row['error']}", file=sys.stderr)
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ pipeline
def sd_turbo_components(device: torch.device, dtype: torch.dtype):
    """sd-turbo-shaped components with random weights: SD 2.1 UNet, TAESD, a small CLIP text
    encoder of width 1024 (it runs once per prompt, not per frame)."""
    from diffusers import AutoencoderTiny, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from streamstudio.models.image import tiny
    from streamstudio.models.image.components import SDComponents

    torch.manual_seed(0)
    unet = UNet2DConditionModel(**SD21_UNET)
    vae = AutoencoderTiny()  # the default config is TAESD's architecture
    tok = tiny.tiny_tokenizer()
    text = CLIPTextModel(CLIPTextConfig(vocab_size=len(tok), hidden_size=1024, intermediate_size=1024,
                                        num_hidden_layers=1, num_attention_heads=16, max_position_embeddings=77))
    for m in (unet, vae, text):
        m.eval().requires_grad_(False)
    comps = SDComponents(unet, vae, text, tok, dict(tiny.SCHEDULER_CONFIG), "sd-turbo-architecture", step_type="turbo")
    return comps.to(device, dtype)


def tiny_components(device, dtype):
    from streamstudio.models.image.loading import load_components

    return load_components("tiny", device=device, dtype=dtype, taesd=True)


def pipeline_fps(comps, size: int, frames: int, warmup: int, device: torch.device) -> float:
    import numpy as np

    from streamstudio.pipelines.image.stream_diffusion import (
        StreamDiffusion,
        StreamDiffusionConfig,
    )

    config = StreamDiffusionConfig(width=size, height=size, steps=1, strength=0.5, cfg_type="none",
                                   guidance_scale=1.0, step_type="turbo")
    stream = StreamDiffusion(comps, config, prompt="a photo")
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(4)]
    for i in range(warmup):
        stream(images[i % 4])
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(frames):
        stream(images[i % 4])
    if device.type == "cuda":
        torch.cuda.synchronize()
    return frames / (time.perf_counter() - t0)


def bench_pipeline(device: torch.device, quick: bool, on_row: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """fps of each mode; on_row(rows) after each one (the JSON is written as the run goes)."""
    from streamstudio.kernels import tensorrt as trt_kernels
    from streamstudio.models.image.acceleration import apply_acceleration

    gpu = device.type == "cuda"
    if gpu:
        comps, size, name = (sd_turbo_components(device, torch.float16), 512,
                             "sd-turbo arch, TAESD, 512x512, 1 step, fp16")
        frames, warmup = (30, 10) if quick else (200, 30)
    else:
        comps, size, name = tiny_components(device, torch.float32), 64, "tiny model, TAESD, 64x64, 1 step, fp32 (CPU)"
        frames, warmup = (4, 1) if quick else (16, 2)
    rows: list[dict] = []

    def add(row: dict) -> None:
        rows.append(row)
        if on_row is not None:
            on_row(rows)

    with reference_only():
        add(dict(mode="eager", model=name, fps=pipeline_fps(comps, size, frames, warmup, device)))
    if gpu and kernels.fused_available():
        add(dict(mode="fused kernels", model=name, fps=pipeline_fps(comps, size, frames, warmup, device)))
    if gpu:  # compile on CPU takes minutes of inductor builds and says nothing about GPUs
        fast = apply_acceleration(comps, "compile")
        add(dict(mode="fused + torch.compile", model=name, fps=pipeline_fps(fast, size, frames, warmup, device)))
    if gpu and trt_kernels.tensorrt_available():
        fast = apply_acceleration(comps, "tensorrt")
        add(dict(mode="fused + tensorrt", model=name, fps=pipeline_fps(fast, size, frames, warmup, device)))
    return rows


# ------------------------------------------------------------------------------ main
OP_COLUMNS = [("op", "op", "<38"), ("MB", lambda r: r["bytes"] / 1e6, ">7.1f"), ("xL2", "l2_multiple", ">5.1f"),
              ("eager us", "eager_us", ">10.1f"), ("fused us", "fused_us", ">10.1f"),
              ("floor us", "floor_us", ">10.1f"), ("fused GB/s", "fused_GBps", ">10.1f"),
              ("floor %", "floor_pct", ">8.1f"), ("eager %", "eager_floor_pct", ">8.1f"),
              ("f/eager", "fused_over_eager", ">8.3f"),
              ("target", lambda r: {True: "ok", False: "MISS", None: "-"}[r.get("meets_target")], ">6"),
              ("", lambda r: f" ({r['error']})" if r.get("error") else "", "<0")]


def print_table(ops: list[dict], pipe: list[dict], bandwidth: float, copy_how: str = "", l2: int | None = None) -> None:
    if ops:
        print(f"copy bandwidth: {bandwidth / 1e9:.1f} GB/s" + (f" ({copy_how})" if copy_how else ""))
        print(f"target: each fused op >= {TARGET_FLOOR_PCT:.0f} % of the copy bandwidth (floor %)"
              + (f"; L2 {l2 / 1e6:.1f} MB" if l2 else ""))
        print(table(OP_COLUMNS, ops))
    for r in pipe:
        print(f"pipeline {r['mode']:24s} {r['fps']:8.2f} fps   ({r['model']})")


def _previous(out: Path) -> dict:
    """The existing results (the --out file, else benchmarks/results/kernels.json), or {}."""
    for path in (out, RESULTS):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            if isinstance(data, dict):
                return data
    return {}


def _kind(record: dict) -> str | None:
    """"gpu" or "cpu" for a run record (its device name), None for a missing one."""
    if not isinstance(record, dict) or "ops" not in record:
        return None
    return "cpu" if str(record.get("device", "")).startswith("CPU") else "gpu"


def _sections(previous: dict, run: dict, kind: str, missing_gpu: str) -> dict:
    """{"gpu": ..., "cpu": ...}: this run under its kind, the other kind's latest run carried
    from `previous` (its own section, or its top level in the older one-run format)."""
    out = {}
    for k in ("gpu", "cpu"):
        if k == kind:
            out[k] = run
            continue
        carried = previous.get(k)
        if _kind(carried) != k:
            carried = {key: v for key, v in previous.items() if key not in ("gpu", "cpu")}
            carried = carried if _kind(carried) == k else None
        out[k] = carried or {"missing": missing_gpu if k == "gpu" else "no CPU run recorded"}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and frames")
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu")
    parser.add_argument("--no-pipeline", action="store_true", help="ops only")
    parser.add_argument("--out", default=str(RESULTS), help=f"JSON output (default {RESULTS})")
    args = parser.parse_args(argv)
    device = bench_device(args.device)
    gpu = device.type == "cuda"
    out = Path(args.out)
    previous = _previous(out)
    notes = []
    missing_gpu = ("no CUDA GPU in this run; only the pure-torch reference paths ran, at reduced sizes (ops: "
                   f"{CPU_SIZES.cam[0]}x{CPU_SIZES.cam[1]} frames, {CPU_SIZES.rows} latent rows, {CPU_SIZES.cosine} "
                   "elements; pipeline: tiny model at 64x64). Run on a GPU for the targets (fused ops >= 70% of "
                   "the bandwidth floor; 150 fps img2img on one H100).")
    if not gpu:
        notes.append("GPU figures missing: " + missing_gpu)
    elif not kernels.fused_available():
        notes.append(f"fused kernels unavailable: {kernels.cuda_build.failure_reason(kernels.EXTENSION)}")
    l2 = l2_bytes(device)
    t = timing(gpu, args.quick)
    run = dict(device=device_name(device), date=utc_now(),
               torch=torch.__version__, cuda=torch.version.cuda, quick=args.quick, l2_bytes=l2,
               target_floor_pct=TARGET_FLOOR_PCT, launches=t.launches, replays=t.replays,
               copy_bandwidth_GBps=None, copy_timing=None, ops=[], pipeline=[], notes=notes)

    def write() -> None:
        result = dict(run, **_sections(previous, run, "gpu" if gpu else "cpu", missing_gpu))
        write_json(out, result, indent=1)

    write()
    bandwidth, copy_how = copy_bandwidth(device, args.quick)
    run.update(copy_bandwidth_GBps=bandwidth / 1e9, copy_timing=copy_how)
    run["ops"] = bench_ops(device, args.quick, bandwidth)
    if gpu and l2:
        small = [r["op"] for r in run["ops"] if r["bytes"] < L2_MULTIPLE * l2]
        if small:
            notes.append(f"moves less than {L2_MULTIPLE}x L2 ({l2 / 1e6:.0f} MB): {', '.join(small)}")
    write()
    print_table(run["ops"], [], bandwidth, copy_how, l2)
    if not args.no_pipeline:
        bench_pipeline(device, args.quick, on_row=lambda rows: (run.update(pipeline=list(rows)), write()))
        print_table([], run["pipeline"], bandwidth)
    for note in notes:
        print("note:", note)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
