"""Opening an image stream: a request (the model, its size, the settings, the add-ons, as the
command line or a web session gives them) becomes a `StreamDiffusion` on a loaded model. Every
front end opens its image streams here: generate, render, serve's model, bench, the batch jobs
and the Splats tab. `FittedFrames` fits frames of another aspect ratio to the stream's."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from streamstudio.errors import StreamStudioError
from streamstudio.frames import fit_aspect

if TYPE_CHECKING:  # the models load when a stream opens
    from streamstudio.models.acceleration import BatchPlan
    from streamstudio.models.batching import BatchingConfig


def request(**settings) -> argparse.Namespace:
    """A request for an image stream as the command line would make it: every image-pipeline
    option at its default (app/settings.add_pipeline_arguments), `settings` over them (e.g.
    width=256, prompt="...", strength=0.5). Front ends without a command line (the Splats tab)
    open their streams from one, through `build_pipeline`, as the CLI does."""
    from streamstudio.app.settings import add_pipeline_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_pipeline_arguments(parser)
    args = parser.parse_args([])
    unknown = sorted(set(settings) - set(vars(args)))
    if unknown:
        raise TypeError(f"not image-pipeline settings: {', '.join(unknown)}")
    vars(args).update(settings)
    return args


def multiple_of_8(value: float) -> int:
    """`value` rounded to the nearest multiple of 8 (at least 8): a side the networks take."""
    return max(8, int(value / 8 + 0.5) * 8)


def output_size(width: int | None, height: int | None, default: int,
                aspect: float | None = None) -> tuple[int, int]:
    """The stream's (width, height): what was given; what was not, from the input's `aspect`
    (width / height) when known, as a multiple of 8: the longer side `default` when neither is
    given (a 640x360 clip with a 512 model: 512x288); else `default`."""
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
    from streamstudio.app.settings import config_values
    from streamstudio.device import pick_device, pick_dtype, use_threads
    from streamstudio.models.loading import resolve_demo_default
    from streamstudio.pipelines.stream_diffusion import StreamDiffusionConfig

    device = pick_device(args.device)
    dtype = pick_dtype(device, args.dtype)
    use_threads(getattr(args, "threads", None), device)
    comps = resolve_demo_default(args.model, device=device, dtype=dtype, taesd=args.taesd or None,
                                 lcm_lora=getattr(args, "lcm_lora", "auto"))
    if getattr(args, "lora", None):  # before acceleration: engines and compiled graphs see the fused weights
        from streamstudio.models.image.lora import LoraSet

        comps.loras = LoraSet(comps)
        for spec in args.lora:
            comps.notes.append(f"LoRA: {comps.loras.add(spec).source}")
    _add_control_networks(args, comps, device, dtype)
    turbo = comps.step_type == "turbo"
    default_size = comps.default_size or 512  # the model's own: builtin 256, tiny 64
    width, height = output_size(args.width, args.height, default_size, aspect)
    settings = {"guidance_scale": 1.0 if turbo else 1.2, **config_values(args)}  # the table's settings, by name
    config = StreamDiffusionConfig(
        width=width, height=height, mode=mode, steps=(1 if turbo else 2) if args.steps is None else args.steps,
        t_index_list=args.t_index, use_denoising_batch=not args.sequential,
        similarity_filter="similarity_threshold" in settings, **settings,
    ).validate()
    if getattr(args, "acceleration", "none") != "none":
        from streamstudio.models.acceleration import apply_acceleration

        comps = apply_acceleration(comps, args.acceleration, plan=acceleration_plan(args, config, serving))
    for note in comps.notes:
        print(f"note: {note}")
    pipe = new_stream(comps, config, prompt=args.prompt, negative_prompt=args.negative_prompt)
    if getattr(args, "ip_image", None):
        pipe.addons.set_reference(_read_picture(args.ip_image, "--ip-image"))
    if getattr(args, "control_image", None):
        if mode != "txt2img":
            raise StreamStudioError("--control-image is for txt2img (no --input); img2img controls each input frame "
                                    "by itself")
        pipe.addons.set_control_image(_read_picture(args.control_image, "--control-image"))
    return pipe


def new_stream(comps, config, prompt: str = "", negative_prompt: str = ""):
    """A new image stream (its own buffer, noise, filter and prompt state) over loaded networks
    `comps` with `config`: the one place a StreamDiffusion is made (the CLI's through
    `build_pipeline`, a web session's over the shared model, a batch job's per output size)."""
    from streamstudio.pipelines.stream_diffusion import StreamDiffusion

    return StreamDiffusion(comps, config, prompt=prompt, negative_prompt=negative_prompt)


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
        from streamstudio.models.image.controlnet import check_fits, load_controlnet, parse_controlnet

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
        from streamstudio.models.image.ip_adapter import IPAdapter

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
    instead (models.batching.warm_up, from the server's model), so they get no plan here."""
    from streamstudio.models.acceleration import BatchPlan

    if not serving:
        return BatchPlan.for_streams(height=config.height, width=config.width,
                                     steps=len(config.resolved_t_index_list()),
                                     frame_buffer_size=config.frame_buffer_size, cfg_types=[config.cfg_type],
                                     stream_batch=config.use_denoising_batch)
    if args.acceleration == "compile":
        return None
    return stream_plan(config, batching_config(args))


def batching_config(args):
    """Cross-stream batching settings from the command line, or None when it is off."""
    from streamstudio.models.batching import BatchingConfig

    if getattr(args, "no_stream_batching", False):
        return None
    return BatchingConfig(max_rows=getattr(args, "max_batch_rows", 16),
                          max_wait_ms=getattr(args, "batch_wait_ms", 2.0)).validate()


class FittedFrames:
    """A frame processor whose input frames are first cropped or padded to the stream's aspect
    ratio (frames.fit_aspect, the one fit/crop), so the pipeline's resize never stretches them.
    Everything else is the pipeline's."""

    def __init__(self, pipe, fit: str = "crop"):
        self.pipe, self.fit = pipe, fit

    def fit_frame(self, frame):
        cfg = self.pipe.config
        return frame if frame is None else fit_aspect(frame, cfg.width, cfg.height, self.fit)

    def push(self, frame):
        return self.pipe.push(self.fit_frame(frame))

    def __call__(self, frame):
        return self.pipe(self.fit_frame(frame))

    def flush(self):
        return self.pipe.flush()

    def __getattr__(self, name: str):
        return getattr(self.pipe, name)


def stream_plan(config, batching: BatchingConfig | None, cfg_types=None) -> BatchPlan:
    """What the networks will be sent by streams of `config` (a StreamDiffusionConfig) through
    an executor of `batching` (None: no batching). cfg_types: the CFG types streams may switch
    to (default: all four, as web clients may); the config's own comes first."""
    from streamstudio.models.acceleration import BatchPlan
    from streamstudio.pipelines.live_settings import CFG_TYPES

    types = [config.cfg_type, *(t for t in (cfg_types or CFG_TYPES) if t != config.cfg_type)]
    return BatchPlan.for_streams(height=config.height, width=config.width, steps=len(config.resolved_t_index_list()),
                                 frame_buffer_size=config.frame_buffer_size, cfg_types=types,
                                 stream_batch=config.use_denoising_batch,
                                 max_rows=batching.max_rows if batching is not None else None,
                                 pad=batching.pad_to_buckets if batching is not None else None)
