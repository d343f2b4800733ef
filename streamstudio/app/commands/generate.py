"""`streamstudio generate`: txt2img images, or img2img over a folder of images as a stream."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.sources import IMAGE_SUFFIXES

log = logging.getLogger(__name__)

MAX_SIDE = 4096  # --width / --height at most (a 4096x4096 SD latent is already 512x512)
LCM_LORA_HELP = ("the LCM-LoRA fused into an SD 1.5 or SDXL model that is not turbo or LCM already, for few-step "
                 "sampling: auto (latent-consistency/lcm-lora-sdv1-5 or lcm-lora-sdxl, from the hub or its cache), a "
                 "hub id, a local .safetensors file or folder, or none (the model as it is: few steps then give poor "
                 "images) (default auto)")
MAX_STEPS = 50  # the LCM schedule's length: --steps and --t-index live inside it


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """The image pipeline's settings, shared by generate, render and serve."""
    from streamstudio.app.settings import add_setting_flags, number

    g = parser.add_argument_group("image pipeline")
    g.add_argument("--model", default="auto",
                   help="builtin, tiny, a hub id, a diffusers folder or a .safetensors file; auto = stabilityai/sd-turbo "
                        "with a CUDA GPU (downloaded once), else the built-in image model (default: auto)")
    add_setting_flags(g)  # the live settings: --prompt, --strength, --guidance, --seed, --temporal, ...
    g.add_argument("--steps", type=number(int, 1, MAX_STEPS), default=None, help="denoising steps N (default 1 for turbo models, 2 otherwise)")
    g.add_argument("--t-index", type=number(int, 0, MAX_STEPS - 1), nargs="+", default=None, metavar="I",
                   help="explicit indices into the 50-step LCM schedule (overrides --steps/--strength)")
    g.add_argument("--width", type=number(int, 8, MAX_SIDE, multiple=8), default=None,
                   help="output width, a multiple of 8 (default: the model's own side, 256 for builtin, 512 for SD "
                        "models, 64 for tiny; with an input, its aspect ratio with that long side, e.g. 256x144 for "
                        "a 16:9 clip; with only --height, from the aspect)")
    g.add_argument("--height", type=number(int, 8, MAX_SIDE, multiple=8), default=None,
                   help="output height, a multiple of 8 (default: as --width; with an input, from its aspect)")
    g.add_argument("--sequential", action="store_true", help="denoise step by step instead of Stream Batch")
    g.add_argument("--taesd", action="store_true", help="use the TAESD fast VAE (madebyollin/taesd)")
    g.add_argument("--lcm-lora", default="auto", metavar="ID|PATH|none", help=LCM_LORA_HELP)
    g.add_argument("--lora", action="append", default=[], metavar="PATH_OR_ID[:scale]",
                   help="a LoRA (.safetensors file, folder or hub id; SD 1.5/2.1 or SDXL), fused; repeatable")
    g.add_argument("--controlnet", action="append", default=[], metavar="ID_OR_PATH[:scale]",
                   help="a ControlNet (hub id or diffusers folder, e.g. lllyasviel/control_v11p_sd15_canny) with its "
                        "conditioning scale; repeatable; img2img only (the control image comes from each input frame)")
    g.add_argument("--control-preprocessor", action="append", default=[], metavar="NAME",
                   help="the preprocessor of each --controlnet, in the same order: canny (default), depth, lineart, "
                        "softedge or none (the frame itself)")
    g.add_argument("--control-image", default=None, metavar="FILE",
                   help="txt2img with --controlnet: the picture every image is controlled by (preprocessed once)")
    g.add_argument("--ip-adapter", default=None, metavar="ID_OR_PATH[:scale]",
                   help="an IP-Adapter (h94/IP-Adapter, or a .safetensors file with image_encoder/ beside it); "
                        "needs --ip-image")
    g.add_argument("--ip-image", default=None, metavar="FILE", help="the IP-Adapter's reference image")
    g.add_argument("--acceleration", choices=("none", "compile", "tensorrt"), default="none",
                   help="torch.compile or TensorRT engines for the UNet and VAE (default none)")
    g.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    g.add_argument("--dtype", default="auto", help="auto (float16 on CUDA, float32 on CPU), float16, float32")
    g.add_argument("--threads", type=number(int, 1, 1024), default=None,
                   help="torch CPU threads (default on the CPU: one fewer than the usable CPUs, at most 8)")


def output_size(width: int | None, height: int | None, default: int,
                aspect: float | None = None) -> tuple[int, int]:
    """The stream's (width, height): what was given; what was not, from the input's `aspect`
    (width / height) when known, as a multiple of 8: the longer side `default` when neither is
    given (a 640x360 clip with a 512 model: 512x288); else `default`."""
    def multiple_of_8(value: float) -> int:
        return max(8, int(value / 8 + 0.5) * 8)

    if aspect is None or not aspect > 0 or (width is not None and height is not None):
        return (default if width is None else width), (default if height is None else height)
    if width is None and height is None:
        return (default, multiple_of_8(default / aspect)) if aspect >= 1 else (multiple_of_8(default * aspect), default)
    if width is None:
        return multiple_of_8(height * aspect), height
    return width, multiple_of_8(width / aspect)


def build_pipeline(args, mode: str, serving: bool = False, aspect: float | None = None):
    """Load the model named by args and build a stream with args' settings. `serving`: the
    stream is the web app's template (its networks run behind the batching executor).
    `aspect`: the input's width / height, for the size when --width/--height are not given."""
    from streamstudio.device import pick_device, pick_dtype, use_threads
    from streamstudio.models.loading import resolve_demo_default
    from streamstudio.pipelines.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    device = pick_device(args.device)
    dtype = pick_dtype(device, args.dtype)
    use_threads(getattr(args, "threads", None), device)
    comps = resolve_demo_default(args.model, device=device, dtype=dtype, taesd=args.taesd or None,
                                 lcm_lora=getattr(args, "lcm_lora", "auto"))
    if getattr(args, "lora", None):  # before acceleration: engines and compiled graphs see the fused weights
        from streamstudio.models.lora import LoraSet

        comps.loras = LoraSet(comps)
        for spec in args.lora:
            comps.notes.append(f"LoRA: {comps.loras.add(spec).source}")
    _add_control_networks(args, comps, device, dtype)
    turbo = comps.step_type == "turbo"
    default_size = comps.default_size or 512  # the model's own: builtin 256, tiny 64
    width, height = output_size(args.width, args.height, default_size, aspect)
    config = StreamDiffusionConfig(
        width=width, height=height, mode=mode,
        steps=(1 if turbo else 2) if args.steps is None else args.steps,
        strength=args.strength, t_index_list=args.t_index,
        use_denoising_batch=not args.sequential, cfg_type=args.cfg,
        guidance_scale=args.guidance if args.guidance is not None else (1.0 if turbo else 1.2),
        delta=args.delta, seed=args.seed, similarity_filter=args.filter_threshold is not None,
        similarity_threshold=args.filter_threshold if args.filter_threshold is not None else 0.98,
        max_skip_frame=args.max_skip_frame, temporal=args.temporal, feedback_weight=args.feedback_weight,
        bank_size=args.bank_size, bank_interval=args.bank_interval, bank_threshold=args.bank_threshold,
        bank_fusion=args.bank_fusion,
    ).validate()
    if getattr(args, "acceleration", "none") != "none":
        from streamstudio.models.acceleration import apply_acceleration

        comps = apply_acceleration(comps, args.acceleration, plan=acceleration_plan(args, config, serving))
    for note in comps.notes:
        print(f"note: {note}")
    pipe = StreamDiffusion(comps, config, prompt=args.prompt, negative_prompt=args.negative_prompt)
    if getattr(args, "ip_image", None):
        pipe.set_reference(_read_picture(args.ip_image, "--ip-image"))
    if getattr(args, "control_image", None):
        if mode != "txt2img":
            raise StreamStudioError("--control-image is for txt2img (no --input); img2img controls each input frame "
                                    "by itself")
        pipe.set_control_image(_read_picture(args.control_image, "--control-image"))
    return pipe


def _read_picture(path: str, flag: str):
    """An image file as HxWx3 uint8 RGB, or a clear error naming the flag."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, UnidentifiedImageError) as exc:
        raise StreamStudioError(f"{flag} {path!r} is not a readable image ({exc})") from exc


def _add_control_networks(args, comps, device, dtype):
    """--controlnet / --control-preprocessor / --ip-adapter: the networks go into `comps` (before
    acceleration), with the preprocessors and scales every stream on them starts from (a web
    session's too)."""
    from streamstudio.pipelines.control import Preprocessor

    nets, preps = getattr(args, "controlnet", []) or [], getattr(args, "control_preprocessor", []) or []
    if len(preps) > len(nets):
        raise StreamStudioError(f"{len(preps)} --control-preprocessor for {len(nets)} --controlnet; give one per net")
    if nets:
        from streamstudio.models.controlnet import check_fits, load_controlnet, parse_controlnet

        specs = [parse_controlnet(text) for text in nets]
        kinds = [preps[i] if i < len(preps) else "canny" for i in range(len(specs))]
        for kind in kinds:
            Preprocessor(kind)  # a wrong name fails here, before any network loads
        comps.controlnets = [load_controlnet(spec.source, device, dtype) for spec in specs]
        for net in comps.controlnets:
            check_fits(net, comps.unet)
        comps.control_defaults = [(kind, spec.scale) for kind, spec in zip(kinds, specs)]
        comps.notes += [f"ControlNet: {spec.source} ({kind}, scale {spec.scale:g})" for kind, spec in zip(kinds, specs)]
    if getattr(args, "ip_adapter", None):
        from streamstudio.models.ip_adapter import IPAdapter

        if not getattr(args, "ip_image", None):
            raise StreamStudioError("--ip-adapter needs a reference image: --ip-image FILE")
        comps.ip_adapter = IPAdapter(comps, args.ip_adapter)
        comps.notes.append(f"IP-Adapter: {comps.ip_adapter.source} (scale {comps.ip_adapter.scale:g})")
    elif getattr(args, "ip_image", None):
        raise StreamStudioError("--ip-image is the reference of an IP-Adapter: give --ip-adapter too")


def acceleration_plan(args, config, serving: bool):
    """The batches the accelerated networks will be sent (TensorRT engines are built for them and
    capture each; compiled networks are warmed up at each), or None.

    generate and render: one stream of `config`, on this thread. serve: streams of any CFG type
    through the batching executor; compiled networks are warmed up on the executor's thread
    instead (app.batching.warm_up, from the server's model), so they get no plan here."""
    from streamstudio.models.acceleration import BatchPlan

    if not serving:
        return BatchPlan.for_streams(height=config.height, width=config.width,
                                     steps=len(config.resolved_t_index_list()),
                                     frame_buffer_size=config.frame_buffer_size, cfg_types=[config.cfg_type],
                                     stream_batch=config.use_denoising_batch)
    if args.acceleration == "compile":
        return None
    from streamstudio.app.batching import stream_plan
    from streamstudio.app.commands.serve import batching_config

    return stream_plan(config, batching_config(args))


def add_parser(subparsers) -> argparse.ArgumentParser:
    from streamstudio.app.settings import number
    from streamstudio.frames import FIT_MODES

    p = subparsers.add_parser("generate", description=__doc__)
    p.add_argument("--input", default=None, help="an image or a folder of images (img2img, in name order)")
    p.add_argument("--output", required=True, help="folder for the PNGs")
    p.add_argument("--num-images", type=number(int, 1, 100_000), default=1, help="txt2img: how many images (default 1)")
    p.add_argument("--fit", choices=FIT_MODES, default="crop",
                   help="img2img: an image of another aspect ratio than the output is cropped (centred, the "
                        "default) or padded (black bars), never stretched. Without --width/--height the output "
                        "takes the first image's aspect ratio")
    add_pipeline_arguments(p)
    return p


def list_images(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(f for f in path.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise StreamStudioError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in folder {path}")
        return files
    raise StreamStudioError(f"input {path} does not exist")


def image_aspect(path: Path) -> float | None:
    """An image file's width / height, read from its header (None when it cannot be read: the
    source says why when it opens it)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            width, height = im.size
    except OSError:
        return None
    return width / height if width and height else None


def run(args) -> int:
    """txt2img: a NoInputSource of --num-images frames; img2img: the images as one stream. Both
    run on streaming.Runner into the output folder, each image named after its input."""
    from streamstudio.models.hub import check_model_source

    check_model_source(args.model)  # a hub id that cannot be had: said at once, before torch loads
    from streamstudio.app.commands.render import FittedFrames, watch
    from streamstudio.streaming.runner import Runner, RunnerConfig
    from streamstudio.streaming.sinks import ImageSequenceSink, check_not_input, make_output_folder
    from streamstudio.streaming.sources import ImageSequenceSource, NoInputSource

    inputs = list_images(Path(args.input)) if args.input else None
    if args.num_images < 1:
        raise StreamStudioError("--num-images must be at least 1")
    for f in inputs or ():  # an output image named as its input would overwrite it
        check_not_input(Path(args.output) / (f.stem + ".png"), [f])
    out_dir = make_output_folder(args.output, "images")  # before the model loads
    if inputs:  # the first image's aspect sizes the output, as render's input does; every image is fitted to it
        pipe = FittedFrames(build_pipeline(args, "img2img", aspect=image_aspect(inputs[0])), args.fit)
    else:
        pipe = build_pipeline(args, "txt2img")
    print(f"model: {pipe.comps.name} ({pipe.step_type} step), t_index_list {pipe.t_index}, "
          f"frame latency {pipe.latency_frames}")
    width, height = pipe.config.width, pipe.config.height
    if inputs is None:
        source = NoInputSource(args.num_images, 1.0, width, height, description="txt2img")
        names = [f"image_{i:05d}.png" for i in range(args.num_images)]
    else:
        source = ImageSequenceSource(inputs, description=str(args.input))
        names = [f.stem + ".png" for f in inputs]
    sink = ImageSequenceSink(str(out_dir), width, height, source.info.fps, names=names)
    runner = Runner(source, pipe, sink, RunnerConfig(live=False))
    metrics = watch(runner, len(names), desc="img2img" if inputs else "generate", unit="img")
    print(f"wrote {metrics.frames_out} image(s) to {out_dir}")
    return 0
