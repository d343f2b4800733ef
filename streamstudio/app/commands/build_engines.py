"""`streamstudio build-engines`: export a model's networks to ONNX (checked against
onnxruntime) and build fp16 TensorRT engines into the engine cache. Without TensorRT it still
exports and checks the ONNX files and says that engines need TensorRT."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from streamstudio.errors import StreamStudioError

log = logging.getLogger(__name__)

PARTS = ("unet", "vae_encoder", "vae_decoder")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("build-engines", help="export ONNX and build TensorRT engines into the engine cache",
                              description=__doc__)
    p.add_argument("--model", default="auto",
                   help="tiny, a hub id, a diffusers folder or a .safetensors file; auto = stabilityai/sd-turbo "
                        "when cached, else the built-in demo model (default: auto)")
    p.add_argument("--taesd", action="store_true", help="the TAESD fast VAE instead of the model's own")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="networks to export (default: all)")
    p.add_argument("--video", action="store_true", help="also the StreamDiT video model (built-in tiny checkpoint)")
    p.add_argument("--engine-dir", default=None,
                   help="engine cache folder (default $STREAMSTUDIO_ENGINE_DIR or ~/.cache/streamstudio/engines)")
    p.add_argument("--onnx-dir", default=None, help="where ONNX files go without TensorRT (default <engine-dir>/onnx)")
    p.add_argument("--batch", type=int, nargs=3, default=[1, 1, 4], metavar=("MIN", "OPT", "MAX"),
                   help="engine batch range (default 1 1 4; the UNet's batch is steps x frame buffer)")
    p.add_argument("--resolution", type=int, nargs=3, default=[256, 512, 1024], metavar=("MIN", "OPT", "MAX"),
                   help="image size range in pixels, square and non-square within it (default 256 512 1024)")
    p.add_argument("--precision", choices=("fp16", "fp32"), default="fp16", help="engine precision (default fp16)")
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime check of the ONNX files")
    p.add_argument("--device", default="auto", help="device the model is loaded on for export (auto, cpu, cuda)")
    p.add_argument("--dtype", default="auto",
                   help="dtype the model is loaded in: auto (float16 on CUDA, float32 on CPU), float16, float32. "
                        "Keep it as the app runs (auto on both): the engine cache is keyed by the weights, dtype "
                        "included, and TensorRT 11 engines run in the exported graph's types")
    return p


def _load(args):
    from streamstudio.device import pick_device, pick_dtype
    from streamstudio.models.loading import resolve_demo_default

    device = pick_device(args.device)
    dtype = pick_dtype(device, getattr(args, "dtype", "auto"))  # as the pipeline loads it: the same engine key
    comps = resolve_demo_default(args.model, device=device, dtype=dtype, taesd=args.taesd or None)
    for note in comps.notes:
        print(f"note: {note}")
    return comps


def _video_spec():
    """The built-in StreamDiT checkpoint's spec (a random-weight tiny one when none ships yet)."""
    from streamstudio.errors import ModelNotFoundError
    from streamstudio.models import acceleration
    from streamstudio.models.stream_dit import StreamDiT, load_builtin, named_config

    try:
        model, meta = load_builtin()
    except ModelNotFoundError:
        print("note: no built-in StreamDiT checkpoint; exporting the tiny architecture with random weights")
        model, meta = StreamDiT(named_config("tiny")).eval(), {}
    sampling = meta.get("sampling", {}) if isinstance(meta, dict) else {}
    frames = int(sampling.get("buffer_frames", 8))
    size = int(sampling.get("size", 32))
    return acceleration.video_export_spec(model, frames=frames, height=size, width=size)


def run(args) -> int:
    from streamstudio.kernels import tensorrt as trt_kernels
    from streamstudio.kernels.tensorrt.build import ShapeRange
    from streamstudio.kernels.tensorrt.cache import EngineCache
    from streamstudio.models import acceleration

    res = tuple(args.resolution)
    if any(r % 64 for r in res):
        raise StreamStudioError(f"--resolution values must be multiples of 64, got {res}")
    try:
        shapes = ShapeRange(tuple(args.batch), res, res)
    except ValueError as exc:
        raise StreamStudioError(str(exc)) from exc
    comps = _load(args)
    specs = acceleration.image_specs(comps, tuple(args.parts))
    video = _video_spec() if args.video else None
    cache = EngineCache(args.engine_dir)

    if not trt_kernels.tensorrt_available():
        out_dir = Path(args.onnx_dir) if args.onnx_dir else cache.root / "onnx"
        print(f"{trt_kernels.INSTALL_HINT}.\nExporting ONNX only, into {out_dir}; "
              "engines need TensorRT on a machine with an NVIDIA GPU (run this command there).")
        failed = _export(specs, out_dir, shapes, not args.no_check)
        if video is not None:
            spec, (h, w) = video
            failed += _export([spec], out_dir, ShapeRange.fixed(shapes.batch[1], h, w), not args.no_check)
        return 1 if failed else 0

    all_specs = specs + ([video[0]] if video else [])
    for spec in all_specs:
        fixed = video is not None and spec is video[0]
        rng = ShapeRange((1, 1, shapes.batch[2]), (video[1][0],) * 3, (video[1][1],) * 3) if fixed else shapes
        path = acceleration.build_engines([spec], cache.root, shapes=rng, precision=args.precision)[0]
        print(f"{spec.name}: {path}")
    print(f"engines in {cache.root}; use them with --acceleration tensorrt")
    return 0


def _export(specs, out_dir: Path, shapes, check: bool) -> int:
    """Export (at the profile's opt size) and check (at its min size); returns the failures."""
    from streamstudio.models import acceleration

    b, h, w = shapes.batch[1], shapes.height[1], shapes.width[1]
    size = (shapes.batch[0], shapes.height[0], shapes.width[0])
    failed = 0
    for result in acceleration.export_onnx_models(specs, out_dir, batch=b, height=h, width=w, check=check,
                                                  check_size=size):
        line = f"{result.name}: {result.path}"
        if result.check is not None:
            ok = result.check.ok()
            failed += not ok
            line += f"  onnxruntime rel. error {result.check.rel_error:.2e} ({'ok' if ok else 'TOO LARGE'})"
        print(line)
    return failed
