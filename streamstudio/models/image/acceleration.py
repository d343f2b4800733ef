"""Acceleration of the image networks: `apply_acceleration(comps, mode)` with mode

- "none":     the components as they are;
- "compile":  torch.compile of the image seam's eps, encode and decode (CUDA graphs through
              mode="reduce-overhead" on a GPU; plain inductor on CPU);
- "tensorrt": fp16 TensorRT engines of the seam's three calls (TAESD too), built once into the
              engine cache (`models/image/export_specs.py`). Without TensorRT (or a GPU) it says so
              once and keeps the torch path. The UNet engine holds the ControlNets and the
              IP-Adapter (their images, embedding and scales are inputs); with LoRAs it is
              rebuilt when they change (not refit).

Either way the result is SDComponents whose `net` (the seam, `models/image/image_net.py`) is the
accelerated variant; `unet` and `vae` stay the diffusers modules.

What the networks will be sent is planned once (`BatchPlan`): the UNet's batch follows the CFG
type, the steps N and frame_buffer_size k (N*k rows for none/self, (N+1)*k for initialize, 2*N*k
for full; the priming and sequential calls k, 2k), and with cross-stream batching every sum of
streams' calls up to the executor's max rows, padded to the buckets (1, 2, 4, 8, 16) where the
networks are compiled or engines. TensorRT profiles are sized from the plan, and every planned
shape is captured (CUDA graphs) or warmed up at start-up.

The modes, the TensorRT check and the two halves of `streamstudio build-engines` are shared with
the video network: `models/acceleration.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from streamstudio.errors import StreamStudioError
from streamstudio.kernels.reference import CFG_CODES
from streamstudio.kernels.tensorrt.build import ShapeRange, ensure_engine
from streamstudio.kernels.tensorrt.cache import EngineCache
from streamstudio.kernels.tensorrt.export import ExportSpec
from streamstudio.models.acceleration import MODES, compile_kwargs, engine_shapes, say_once, tensorrt_missing
from streamstudio.models.image.components import SDComponents
from streamstudio.models.image.export_specs import IMAGE_PARTS, EngineImageNet, image_specs
from streamstudio.models.image.image_net import ImageCond, ImageNet, WrappedImageNet, broadcast
from streamstudio.kernels.tensorrt import runtime

if TYPE_CHECKING:  # (TensorRT's runtime loads only when engines are asked for)
    from streamstudio.kernels.tensorrt.runtime import TRTEngine

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# What the networks are sent: batch sizes per CFG type, steps, frame buffer and batching
# ---------------------------------------------------------------------------------------------

DEFAULT_BUCKETS = (1, 2, 4, 8, 16)


def bucket_sizes(max_rows: int) -> tuple[int, ...]:
    """The batch sizes a batched call is padded up to: the powers of two below max_rows, and
    max_rows itself ((1, 2, 4, 8, 16) for 16; (1, 2, 4, 8, 12) for 12)."""
    if max_rows < 1:
        raise StreamStudioError(f"max_rows must be at least 1, got {max_rows}")
    sizes, b = [], 1
    while b < max_rows:
        sizes.append(b)
        b *= 2
    return tuple(sizes + [max_rows])


def bucket_for(rows: int, buckets: Iterable[int]) -> int:
    """The smallest bucket that holds `rows` (rows itself above the largest)."""
    return next((b for b in sorted(buckets) if b >= rows), rows)


def unet_call_rows(cfg_type: str, steps: int, frame_buffer_size: int = 1, stream_batch: bool = True) -> tuple[int, ...]:
    """Every UNet batch one stream sends (StreamBatchSampler._predict_eps), ascending.

    With Stream Batch and N > 1 steps the frame's call has N*k rows (none, self), N*k + k
    (initialize: the new frame's unconditional pass too) or 2*N*k (full); the first frame primes
    the buffer with N-1 calls of k rows (2k for full, and for initialize's first). With one step,
    or sequential denoising, every call is a step of k rows (2k for full, and initialize's first)."""
    if cfg_type not in CFG_CODES:
        raise StreamStudioError(f"cfg_type must be one of {', '.join(CFG_CODES)}, got {cfg_type!r}")
    n, k = steps, frame_buffer_size
    if n < 1 or k < 1:
        raise StreamStudioError(f"steps and frame_buffer_size must be at least 1, got {n} and {k}")

    def step(rows: int, first: int) -> int:  # one _step's UNet batch
        if cfg_type == "full":
            return 2 * rows
        return rows + first if cfg_type == "initialize" else rows

    if not stream_batch or n == 1:
        sizes = {step(k, k if j == 0 else 0) for j in range(n)}
    else:
        sizes = {step(k, k if j == 0 else 0) for j in range(n - 1)}  # priming: slots 1..N-1
        sizes.add(step(n * k, k))  # every later frame: one call over all slots
    return tuple(sorted(sizes))


def batched_rows(requests: Iterable[int], max_rows: int | None,
                 buckets: Iterable[int] | None = None) -> tuple[int, ...]:
    """The batch sizes a network is sent when calls of `requests` rows (any mix, from any number
    of streams) are joined up to max_rows (a call bigger than that runs alone), each padded to
    its bucket. max_rows None: no batching, the requests themselves."""
    requests = sorted(set(requests))
    if max_rows is None:
        sizes = set(requests)
    else:
        reach = {0}
        for total in range(1, max_rows + 1):  # every sum of requests (repeats allowed) <= max_rows
            if any(total - r in reach for r in requests if r <= total):
                reach.add(total)
        sizes = (reach - {0}) | {r for r in requests if r > max_rows}
    if buckets:
        sizes = {bucket_for(s, buckets) for s in sizes}
    return tuple(sorted(sizes))


@dataclass
class BatchPlan:
    """Every batch size each image network (unet, vae_encoder, vae_decoder) will be sent, the
    one it is optimized for, and the image size. TensorRT engines are built for the range of
    these sizes and capture each of them at start-up; compiled networks warm them up."""

    sizes: dict[str, tuple[int, ...]]  # part -> ascending batch sizes
    opt: dict[str, int]  # part -> the batch of one stream's usual call
    height: int = 512
    width: int = 512
    buckets: tuple[int, ...] | None = None  # calls padded to these (None: not padded)

    @staticmethod
    def for_streams(*, height: int = 512, width: int = 512, steps: int = 1, frame_buffer_size: int = 1,
                    cfg_types: Iterable[str] = ("self",), stream_batch: bool = True, max_rows: int | None = None,
                    pad: bool | None = None) -> "BatchPlan":
        """The plan for streams of these settings. cfg_types: every CFG type a stream may use
        (the web app lets a client switch: give all four); the first is the default (its call
        is the one engines are optimized for). Guidance <= 1 runs the none path, which is
        covered too. max_rows: cross-stream batching's BatchingConfig.max_rows (None: no
        batching). pad: calls padded to buckets (default: when batching)."""
        cfg_types = list(cfg_types)
        if not cfg_types:
            raise StreamStudioError("cfg_types needs at least one CFG type")
        k = frame_buffer_size
        per_stream: set[int] = set()
        for cfg in dict.fromkeys([*cfg_types, "none"]):  # guidance <= 1 takes the none path
            per_stream.update(unet_call_rows(cfg, steps, k, stream_batch))
        pad = max_rows is not None if pad is None else pad
        buckets = bucket_sizes(max_rows) if pad and max_rows is not None else None
        usual = unet_call_rows(cfg_types[0], steps, k, stream_batch)[-1]  # the steady-state call
        sizes = {"unet": batched_rows(per_stream, max_rows, buckets),
                 "vae_encoder": batched_rows([k], max_rows, buckets),
                 "vae_decoder": batched_rows([k], max_rows, buckets)}
        opt = {"unet": bucket_for(usual, buckets or ()), "vae_encoder": bucket_for(k, buckets or ()),
               "vae_decoder": bucket_for(k, buckets or ())}
        return BatchPlan(sizes, opt, height, width, buckets)

    def batch_range(self, part: str) -> tuple[int, int, int]:
        sizes = self.sizes[part]
        return sizes[0], min(max(self.opt[part], sizes[0]), sizes[-1]), sizes[-1]

    def shapes(self, part: str, resolution: ShapeRange | None = None) -> ShapeRange:
        """The engine profile of `part`: the plan's batch range, and `resolution`'s height and
        width range (default: exactly the plan's size)."""
        if resolution is None:
            return ShapeRange(self.batch_range(part), (self.height,) * 3, (self.width,) * 3)
        return ShapeRange(self.batch_range(part), resolution.height, resolution.width)

    def covers(self, part: str, batch: int) -> bool:
        lo, _, hi = self.batch_range(part)
        return lo <= batch <= hi


def apply_acceleration(comps: SDComponents, mode: str, *, engine_dir: str | Path | None = None,
                       shapes: ShapeRange | None = None, precision: str = "fp16", cuda_graphs: bool = True,
                       parts: tuple[str, ...] = IMAGE_PARTS, compile_options: dict | None = None,
                       plan: BatchPlan | None = None) -> SDComponents:
    """New SDComponents whose UNet and VAE are accelerated by `mode` (the inputs are not changed).

    plan: what the networks will be sent (`BatchPlan.for_streams(...)` from the stream's
      settings and the batching executor's max rows). TensorRT engines are built for its batch
      range and capture a CUDA graph of each of its sizes now; compiled networks are warmed up
      at each size (`warm_up`) on this thread, which is right where this thread runs them
      (generate, render). Behind the batching executor the networks run on its thread (CUDA
      graph trees are per thread): give compile mode no plan there, and warm up with
      `models.image.batching.warm_up` instead. Without a plan, engines cover `shapes` (default batch
      1..4, 256..1024 pixels) and capture shapes as they come.
    shapes: the batch / resolution range of TensorRT engines without a plan; with one, only its
      resolution range is used (default: exactly the plan's size).
    parts: which networks the TensorRT mode replaces.
    compile_options: extra torch.compile arguments (e.g. {"backend": "aot_eager"}).
    """
    if mode not in MODES:
        raise StreamStudioError(f"acceleration must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "none":
        return comps
    if mode == "compile":
        fast = _compiled(comps, cuda_graphs, compile_options or {})
        if plan is not None:
            warm_up(fast, plan)
        return fast
    return _tensorrt(comps, engine_dir, shapes, precision, cuda_graphs, parts, plan)


def warm_up(comps: SDComponents, plan: BatchPlan, *, repeats: int | None = None,
            run: Callable[[Callable[[], None]], object] | None = None) -> int:
    """Run the seam's eps, encode and decode once (CUDA: three times, so CUDA graphs are
    recorded) at every batch size of the plan, so that no size is compiled or captured for the
    first time while streams run. The inputs are contiguous, as every call's are. `run(fn)`
    runs a job where the networks run (the batching executor's thread: CUDA graph trees are
    per thread). Returns the number of network calls made."""
    net = comps.net
    device, dtype = net.device, net.dtype
    repeats = repeats if repeats is not None else (3 if device.type == "cuda" else 1)
    h, w = plan.height // net.latent_scale, plan.width // net.latent_scale
    calls = 0

    def job() -> None:
        nonlocal calls
        with torch.inference_mode():
            for b in plan.sizes["unet"]:
                x = torch.zeros((b, net.latent_channels, h, w), device=device, dtype=dtype)  # (B, 4, h, w)
                t = torch.full((b,), 999, device=device, dtype=torch.long)  # (B,)
                cond = comps.example_cond(b, plan.height, plan.width, device, dtype)  # every field the model takes
                for _ in range(repeats):
                    net.eps(x, t, cond)
                    calls += 1
            for b in plan.sizes["vae_encoder"]:
                images = torch.zeros((b, 3, plan.height, plan.width), device=device, dtype=dtype)  # (B, 3, H, W)
                for _ in range(repeats):
                    net.encode(images)
                    calls += 1
            for b in plan.sizes["vae_decoder"]:
                latents = torch.zeros((b, net.latent_channels, h, w), device=device, dtype=dtype)  # (B, 4, h, w)
                for _ in range(repeats):
                    net.decode(latents)
                    calls += 1

    (run or (lambda fn: fn()))(job)
    log.info("warmed up batch sizes unet %s, vae %s / %s (%d calls)", plan.sizes["unet"], plan.sizes["vae_encoder"],
             plan.sizes["vae_decoder"], calls)
    return calls


# ---------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------

class CompiledImageNet(WrappedImageNet):
    """The image seam with eps, encode and decode through torch.compile, fed contiguous
    inputs: the pipeline's text embeddings and timesteps are often expanded views (stride 0
    over the batch), and a compiled graph's guards check strides, so an expanded and a
    contiguous call of one size would compile twice. Feature-bank calls run eagerly on `inner`.

    encode never uses CUDA graphs: the stream keeps the input latents across calls (flush
    feeds the last input again), and a graph replay would overwrite them; decode's images are
    converted to frames at once, so it may."""

    fixed_shapes = True

    def __init__(self, inner: ImageNet, **compile_kwargs):
        super().__init__(inner)
        encode_kwargs = {k: v for k, v in compile_kwargs.items() if not (k == "mode" and v == "reduce-overhead")}
        # three functions of their own: dynamo's recompile limit counts the compiled shapes per code object
        self._eps = torch.compile(self._eps_flat, **compile_kwargs)
        self._encode = torch.compile(self._encode_eager, **encode_kwargs)
        self._decode = torch.compile(self._decode_eager, **compile_kwargs)

    def _eps_flat(self, layout, x, t, *cond):  # (B, 4, h, w), (B,), the condition's tensors
        return self.inner.eps(x, t, ImageCond.unflatten(layout, cond))

    def _encode_eager(self, images):
        return self.inner.encode(images)

    def _decode_eager(self, latents):
        return self.inner.decode(latents)

    def eps(self, x, t, cond, bank=None):
        if bank:
            return self.inner.eps(x, t, cond, bank)
        t, cond = broadcast(x.shape[0], t, cond, x.device)  # (B,), B rows
        layout, tensors = cond.flatten()
        return self._eps(layout, x.contiguous(), t.contiguous(), *(c.contiguous() for c in tensors))

    def encode(self, images):
        return self._encode(images)

    def decode(self, latents):
        return self._decode(latents)


RECOMPILE_LIMIT = 32  # compiled shapes per function: every bucket (and the odd priming size) fits


def _allow_recompiles(limit: int = RECOMPILE_LIMIT) -> None:
    """Raise dynamo's per-function recompile limit (8 by default) to `limit`: each bucket is a
    compiled shape of the same function, and past the limit dynamo silently runs it eagerly."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    if getattr(config, name) < limit:
        setattr(config, name, limit)


def _compiled(comps: SDComponents, cuda_graphs: bool, options: dict) -> SDComponents:
    _allow_recompiles()
    kw = {**compile_kwargs(comps.net.device, cuda_graphs), **options}
    note = f"acceleration: torch.compile ({', '.join(f'{k}={v}' for k, v in kw.items()) or 'default'})"
    return replace(comps, network=CompiledImageNet(comps.net, **kw), notes=[*comps.notes, note])


# ---------------------------------------------------------------------------------------------
# TensorRT
# ---------------------------------------------------------------------------------------------

def _tensorrt(comps: SDComponents, engine_dir, shapes: ShapeRange | None, precision: str, cuda_graphs: bool,
              parts: tuple[str, ...], plan: BatchPlan | None = None) -> SDComponents:
    """Engines of the seam's calls. The UNet's covers its ControlNets (their images at the plan's
    pixel size, their scales) and IP-Adapter's embedding and scale (models/image/export_specs.eps_spec);
    with LoRAs it is rebuilt when they change (`EngineImageNet.watch`)."""
    device = comps.net.device
    missing = tensorrt_missing(device)
    if missing:
        return replace(comps, notes=[*comps.notes, missing])
    cache = EngineCache(engine_dir)

    def load(spec: ExportSpec):
        rng = engine_shapes(spec.name, plan, shapes)
        path = ensure_engine(spec, cache, rng, precision=precision)
        engine = runtime.TRTEngine(path, device, cuda_graphs=cuda_graphs)
        if plan is not None and cuda_graphs:  # every shape that will be sent, captured before streams run
            engine.capture_all([spec.input_shapes(b, plan.height, plan.width) for b in plan.sizes[spec.name]])
        return engine

    engines: dict[str, TRTEngine] = {}
    for spec in image_specs(comps, parts):
        try:
            engines[spec.name] = load(spec)
        except Exception as exc:  # a parser / builder failure keeps that network on torch
            say_once(f"TensorRT engine for {spec.name} failed ({exc}); that network stays on the torch path")
    rebuild = watch = None
    if comps.loras is not None and "unet" in engines:
        loras = comps.loras

        def watch():
            return loras.version

        def rebuild():
            say_once(LORA_REBUILD_MESSAGE)
            log.warning("LoRAs changed (%s): rebuilding the TensorRT UNet engine for the new weights",
                        ", ".join(f"{source} x {scale:g}" for source, scale in loras.listing()) or "none left")
            try:
                return load(image_specs(comps, ("unet",))[0])
            except Exception as exc:  # the new weights' engine failed: the UNet goes on in torch (right frames)
                say_once(f"TensorRT engine for the UNet's new weights failed ({exc}); the UNet stays on the torch path")
                return None

    net = EngineImageNet(comps.net, engines.get("unet"), engines.get("vae_encoder"), engines.get("vae_decoder"),
                         rebuild=rebuild, watch=watch)
    note = f"acceleration: tensorrt {precision} ({', '.join(engines) or 'no engines'}) from {cache.root}"
    addons = [f"{len(comps.controlnets)} ControlNet(s)" if comps.controlnets else "",
              "IP-Adapter" if comps.ip_adapter is not None else ""]
    if "unet" in engines and any(addons):
        note += f"; the UNet engine takes {' and '.join(a for a in addons if a)}"
    if plan is not None:
        note += f"; unet batches {plan.sizes['unet']}"
    notes = [*comps.notes, note]
    if rebuild is not None:
        notes.append(LORA_REBUILD_MESSAGE)
    return replace(comps, network=net, notes=notes)


LORA_REBUILD_MESSAGE = (
    "TensorRT and LoRAs: the UNet engine holds the fused LoRA weights, so a LoRA change (scale, add, remove) "
    "rebuilds the UNet engine before the next frame (engines are built without TensorRT's refit flag, so they "
    "are rebuilt, not refit; an engine of the same weights is taken from the cache instead, e.g. the base "
    "model's after the last LoRA is removed). How long a rebuild takes is not measured (no GPU run yet; "
    "TensorRT builds of a UNet usually take minutes); frames wait meanwhile. Use --acceleration compile to "
    "change LoRAs live without it.")
