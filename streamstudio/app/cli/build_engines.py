"""`streamstudio build-engines`: export a model's networks to ONNX (checked against
onnxruntime) and build fp16 TensorRT engines into the engine cache. Without TensorRT it still
exports and checks the ONNX files and says that engines need TensorRT.

Each engine's batch range is sized from what the app will send it (models/image/acceleration.BatchPlan):
the CFG types streams may use, the steps, the frame buffer and cross-stream batching's max rows
(the UNet's batch is N*k for none/self, N*k + k for initialize, 2*N*k for full, and batching joins
streams' calls up to the max rows, padded to buckets 1, 2, 4, 8, 16). Give the settings the app
runs with, and the engines are the ones it looks up; --batch MIN OPT MAX sets a range by hand."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from streamstudio.errors import StreamStudioError

log = logging.getLogger(__name__)

PARTS = ("unet", "vae_encoder", "vae_decoder")


def add_parser(subparsers) -> argparse.ArgumentParser:
    from streamstudio.app.settings import LCM_LORA_HELP, number

    p = subparsers.add_parser("build-engines", description=__doc__)
    p.add_argument("--model", default="auto",
                   help="builtin, tiny, a hub id, a diffusers folder or a .safetensors file; auto = "
                        "stabilityai/sd-turbo with a CUDA GPU (downloaded once), else the built-in image model "
                        "(default: auto)")
    p.add_argument("--taesd", action="store_true", help="the TAESD fast VAE instead of the model's own")
    p.add_argument("--lcm-lora", default="auto", metavar="ID|PATH|none", help="the app's --lcm-lora: " + LCM_LORA_HELP)
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="networks to export (default: all)")
    p.add_argument("--video", action="store_true", help="also the StreamDiT video model (built-in tiny checkpoint)")
    p.add_argument("--engine-dir", default=None,
                   help="engine cache folder (default $STREAMSTUDIO_ENGINE_DIR or ~/.cache/streamstudio/engines)")
    p.add_argument("--onnx-dir", default=None, help="where ONNX files go without TensorRT (default <engine-dir>/onnx)")
    p.add_argument("--batch", type=number(int, 1, 1024), nargs=3, default=None, metavar=("MIN", "OPT", "MAX"),
                   help="engine batch range by hand (default: from --cfg, --steps, --frame-buffer-size and "
                        "--max-batch-rows, as the app will send)")
    p.add_argument("--resolution", type=number(int, 64, 4096, multiple=64), nargs=3, default=None,
                   metavar=("MIN", "OPT", "MAX"),
                   help="image size range in pixels, square and non-square within it (default: exactly "
                        "--width x --height, as the app runs)")
    p.add_argument("--width", type=number(int, 8, 4096, multiple=8), default=None,
                   help="image width the app runs at (default 512, 64 for tiny)")
    p.add_argument("--height", type=number(int, 8, 4096, multiple=8), default=None,
                   help="image height the app runs at (default 512, 64 for tiny)")
    p.add_argument("--cfg", nargs="+", choices=("none", "self", "initialize", "full"), default=None,
                   help="CFG types streams may use, the usual one first (default: self, then the other three, "
                        "as web clients may switch)")
    p.add_argument("--steps", type=number(int, 1, 50), default=None,
                   help="denoising steps N (default 1 for turbo models, 2 otherwise)")
    p.add_argument("--frame-buffer-size", type=number(int, 1, 64), default=1,
                   help="frames per stream call k (default 1)")
    p.add_argument("--sequential", action="store_true", help="streams denoise step by step instead of Stream Batch")
    p.add_argument("--max-batch-rows", type=number(int, 0, 1024), default=16,
                   help="cross-stream batching's rows per call, as serve's --max-batch-rows (default 16; 0: no "
                        "batching, as generate and render)")
    p.add_argument("--lora", action="append", default=[], metavar="PATH_OR_ID[:scale]",
                   help="the app's --lora, fused into the UNet engine (its cache key holds the weights); repeatable")
    p.add_argument("--controlnet", action="append", default=[], metavar="ID_OR_PATH",
                   help="the app's --controlnet, exported inside the UNet engine (control image and scale are "
                        "inputs); repeatable, in the app's order")
    p.add_argument("--ip-adapter", default=None, metavar="ID_OR_PATH",
                   help="the app's --ip-adapter (its image embedding and scale are UNet engine inputs)")
    p.add_argument("--precision", choices=("fp16", "fp32"), default="fp16", help="engine precision (default fp16)")
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime check of the ONNX files")
    p.add_argument("--device", default="auto", help="device the model is loaded on for export (auto, cpu, cuda)")
    p.add_argument("--dtype", default="auto",
                   help="dtype the model is loaded in: auto (float16 on CUDA, float32 on CPU), float16, float32. "
                        "Keep it as the app runs (auto on both): the engine cache is keyed by the weights, dtype "
                        "included, and TensorRT 11 engines run in the exported graph's types")
    return p


def _load(args):
    """The model with --lora, --controlnet, --ip-adapter as the app loads them (streams.image's
    load_components), so the UNet engine is the one the app looks up (the same inputs, the same
    weights, the same dtype: the same cache key). Scales and reference pictures are engine
    inputs: they need not match the app's."""
    from streamstudio.app.cli.requests import image_request
    from streamstudio.app.streams.image import load_components

    comps = load_components(image_request(args))
    for note in comps.notes:
        print(f"note: {note}")
    return comps


def _video_spec():
    """The built-in StreamDiT checkpoint's spec (a random-weight tiny one when none ships yet)."""
    from streamstudio.errors import ModelNotFoundError
    from streamstudio.models.video.stream_dit import StreamDiT, load_builtin, named_config
    from streamstudio.models.video.video_engine import video_export_spec

    try:
        model, meta = load_builtin()
    except ModelNotFoundError:
        print("note: no built-in StreamDiT checkpoint; exporting the tiny architecture with random weights")
        model, meta = StreamDiT(named_config("tiny")).eval(), {}
    sampling = meta.get("sampling", {}) if isinstance(meta, dict) else {}
    frames = int(sampling.get("buffer_frames", 8))
    size = int(sampling.get("size", 32))
    return video_export_spec(model, frames=frames, height=size, width=size)


def plan_for(args, comps):
    """The BatchPlan of the streams the app will run with these settings."""
    from streamstudio.models.image.acceleration import BatchPlan

    size = comps.default_size or 512
    steps = args.steps if args.steps is not None else (1 if comps.step_type == "turbo" else 2)
    cfg = list(args.cfg or ["self", "none", "initialize", "full"])
    if args.max_batch_rows < 0 or args.frame_buffer_size < 1 or steps < 1:
        raise StreamStudioError("--max-batch-rows must be >= 0, --frame-buffer-size and --steps >= 1")
    try:
        return BatchPlan.for_streams(height=args.height or size, width=args.width or size, steps=steps,
                                     frame_buffer_size=args.frame_buffer_size, cfg_types=cfg,
                                     stream_batch=not args.sequential, max_rows=args.max_batch_rows or None)
    except ValueError as exc:
        raise StreamStudioError(str(exc)) from exc


def run(args) -> int:
    from streamstudio.kernels import tensorrt as trt_kernels
    from streamstudio.kernels.tensorrt.build import ShapeRange
    from streamstudio.kernels.tensorrt.cache import EngineCache
    from streamstudio.models import acceleration
    from streamstudio.models.image.export_specs import image_specs

    res = tuple(args.resolution) if args.resolution else None  # (multiples of 64: checked by its type)
    try:  # --batch by hand: that range (and 256..1024 pixels unless --resolution); else the plan's
        shapes = (ShapeRange(tuple(args.batch), *((res, res) if res else ())) if args.batch
                  else ShapeRange((1, 1, 1), res, res) if res else None)
    except ValueError as exc:
        raise StreamStudioError(str(exc)) from exc
    from streamstudio.streaming.sinks import make_output_folder

    for flag, folder in (("--engine-dir", args.engine_dir), ("--onnx-dir", args.onnx_dir)):
        if folder:  # (before the model loads)
            make_output_folder(folder, f"{flag} files")
    comps = _load(args)
    plan = None if args.batch else plan_for(args, comps)
    if plan is not None:
        print(f"note: batch sizes sent: unet {plan.sizes['unet']}, vae {plan.sizes['vae_decoder']} "
              f"at {plan.width}x{plan.height}")
    specs = image_specs(comps, tuple(args.parts))
    video = _video_spec() if args.video else None
    cache = EngineCache(args.engine_dir)
    ranges = [(spec, acceleration.engine_shapes(spec.name, plan, shapes)) for spec in specs]
    video_max = args.batch[2] if args.batch else 1  # render-video runs one buffer: batch 1

    if not trt_kernels.tensorrt_available():
        out_dir = Path(args.onnx_dir) if args.onnx_dir else cache.root / "onnx"
        print(f"{trt_kernels.INSTALL_HINT}.\nExporting ONNX only, into {out_dir}; "
              "engines need TensorRT on a machine with an NVIDIA GPU (run this command there).")
        failed = _export(ranges, out_dir, not args.no_check)
        if video is not None:
            spec, (h, w) = video
            failed += _export([(spec, ShapeRange.fixed(1, h, w))], out_dir, not args.no_check)
        return 1 if failed else 0

    for spec in specs:
        path = acceleration.build_engines([spec], cache.root, shapes=shapes, precision=args.precision, plan=plan)[0]
        print(f"{spec.name}: {path}")
    if video is not None:
        spec, (h, w) = video
        rng = ShapeRange((1, 1, video_max), (h,) * 3, (w,) * 3)
        path = acceleration.build_engines([spec], cache.root, shapes=rng, precision=args.precision)[0]
        print(f"{spec.name}: {path}")
    print(f"engines in {cache.root}; use them with --acceleration tensorrt")
    return 0


def _export(ranges, out_dir: Path, check: bool) -> int:
    """Export each spec (at its profile's opt size) and check it (at its min size); returns the failures."""
    from streamstudio.models import acceleration

    failed = 0
    for spec, shapes in ranges:
        b, h, w = shapes.batch[1], shapes.height[1], shapes.width[1]
        size = (shapes.batch[0], shapes.height[0], shapes.width[0])
        for result in acceleration.export_onnx_models([spec], out_dir, batch=b, height=h, width=w, check=check,
                                                      check_size=size):
            line = f"{result.name}: {result.path}"
            if result.check is not None:
                ok = result.check.ok()
                failed += not ok
                line += f"  onnxruntime rel. error {result.check.rel_error:.2e} ({'ok' if ok else 'TOO LARGE'})"
            print(line)
    return failed
