"""`streamstudio build-engines`'s runner: the model loaded as the app loads it, its networks
exported to ONNX (checked with onnxruntime) and, with TensorRT, built into engines of the profiles
the app will look up (models/image/acceleration.BatchPlan). Its parser is build_engines.py."""

from __future__ import annotations

from pathlib import Path

from streamstudio.app.cli.requests import image_request
from streamstudio.app.streams.image import load_components
from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.kernels import tensorrt as trt_kernels
from streamstudio.kernels.tensorrt.build import ShapeRange
from streamstudio.kernels.tensorrt.cache import EngineCache
from streamstudio.models import acceleration
from streamstudio.models.image.acceleration import BatchPlan
from streamstudio.models.image.export_specs import image_specs
from streamstudio.models.video.stream_dit import StreamDiT, load_builtin, named_config
from streamstudio.models.video.video_engine import video_export_spec
from streamstudio.streaming.sinks import make_output_folder


def _load(args):
    """The model with --lora, --controlnet, --ip-adapter as the app loads them (streams.image's
    load_components), so the UNet engine is the one the app looks up (the same inputs, the same
    weights, the same dtype: the same cache key). Scales and reference pictures are engine
    inputs: they need not match the app's."""
    comps = load_components(image_request(args))
    for note in comps.notes:
        print(f"note: {note}")
    return comps


def _video_spec():
    """The built-in StreamDiT checkpoint's spec (a random-weight tiny one when none ships yet)."""
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
    res = tuple(args.resolution) if args.resolution else None  # (multiples of 64: checked by its type)
    try:  # --batch by hand: that range (and 256..1024 pixels unless --resolution); else the plan's
        shapes = (ShapeRange(tuple(args.batch), *((res, res) if res else ())) if args.batch
                  else ShapeRange((1, 1, 1), res, res) if res else None)
    except ValueError as exc:
        raise StreamStudioError(str(exc)) from exc
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

