"""Opening an image stream: a request (the model, its size, the settings, the add-ons, as the
command line or a web session gives them) becomes a `StreamDiffusion` on a loaded model. Every
front end opens its image streams here: generate, render, serve's model, bench, the batch jobs
and the Splats tab. `FittedFrames` fits frames of another aspect ratio to the stream's."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from streamstudio.app.streams.requests import Addons, ImageRequest
from streamstudio.errors import StreamStudioError
from streamstudio.frames import fit_aspect

if TYPE_CHECKING:  # the models load when a stream opens
    from streamstudio.models.image.acceleration import BatchPlan
    from streamstudio.models.image.batching import BatchingConfig


def request(**settings) -> ImageRequest:
    """An image-stream request with `settings` over the defaults: ImageRequest's fields (width=256,
    model="tiny") and the image table's settings by their flag's name (strength=0.5, guidance=1.2).
    Front ends without a command line (the Splats tab) open their streams from one, through
    `build_pipeline`, as the CLI does."""
    from streamstudio.app.settings import config_values, pipeline_dests

    own = {f.name for f in fields(ImageRequest)} - {"settings", "addons", "batching"}
    unknown = sorted(set(settings) - own - set(pipeline_dests()))
    if unknown:
        raise TypeError(f"not image-pipeline settings: {', '.join(unknown)}")
    return ImageRequest(**{k: v for k, v in settings.items() if k in own}, settings=config_values(settings))


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
        assert height is not None  # (neither given: returned above)
        return multiple_of_8(height * aspect), height
    return width, multiple_of_8(width / aspect)


def build_pipeline(request: ImageRequest, mode: str, serving: bool = False, aspect: float | None = None):
    """Load the model `request` names and build a stream with its settings. `serving`: the
    stream is the web app's template (its networks run behind the batching executor).
    `aspect`: the input's width / height, for the size when the request gives none."""
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig

    check_references(request.addons)
    comps = load_components(request)
    turbo = comps.step_type == "turbo"
    # default size: builtin 256, tiny 64
    width, height = output_size(request.width, request.height, comps.default_size or 512, aspect)
    settings = {"guidance_scale": 1.0 if turbo else 1.2, **request.settings}  # the table's settings, by name
    config = StreamDiffusionConfig(
        width=width, height=height, mode=mode, steps=(1 if turbo else 2) if request.steps is None else request.steps,
        t_index_list=request.t_index, use_denoising_batch=not request.sequential,
        similarity_filter="similarity_threshold" in settings, **settings,
    ).validate()
    if request.frame_graph and (serving or request.acceleration == "tensorrt"):
        raise StreamStudioError("--frame-graph captures one stream's whole frame: not with serve's shared networks or "
                                "TensorRT engines (which capture their own graphs); use --acceleration compile or none")
    if request.acceleration != "none":
        from streamstudio.models.image.acceleration import apply_acceleration

        inner: dict[str, Any] = {"cuda_graphs": False} if request.frame_graph else {}  # no graph in the frame's graph
        comps = apply_acceleration(comps, request.acceleration, plan=acceleration_plan(request, config, serving),
                                   **inner)
    for note in comps.notes:
        print(f"note: {note}")
    pipe = new_stream(comps, config, prompt=request.prompt, negative_prompt=request.negative_prompt)
    if request.frame_graph:
        from streamstudio.pipelines.image.frame_graph import LiveGraphStream

        pipe = LiveGraphStream(pipe)
    if request.addons.ip_image:
        pipe.addons.set_reference(read_picture(request.addons.ip_image, "--ip-image"))
    if request.addons.control_image:
        if mode != "txt2img":
            raise StreamStudioError("--control-image is for txt2img (no --input); img2img controls each input frame "
                                    "by itself")
        pipe.addons.set_control_image(read_picture(request.addons.control_image, "--control-image"))
    return pipe


def load_components(request: ImageRequest):
    """The model `request` names, on its device and in its dtype (torch's CPU threads set), with
    its add-ons: what streams run on and engines are built from (the same weights: the same
    engine cache keys)."""
    from streamstudio.device import pick_device, pick_dtype, use_threads
    from streamstudio.models.image.loading import resolve_demo_default

    device = pick_device(request.device)
    dtype = pick_dtype(device, request.dtype)
    use_threads(request.threads, device)
    comps = resolve_demo_default(request.model, device=device, dtype=dtype, taesd=request.taesd or None,
                                 lcm_lora=request.lcm_lora)
    add_addons(request.addons, comps, device, dtype)
    if request.fp8:
        if request.acceleration == "tensorrt":
            raise StreamStudioError("--fp8 runs the UNet's products in FP8 in torch; TensorRT engines are built from "
                                    "its float weights: use --acceleration compile or none with --fp8")
        from streamstudio.models.image.fp8 import apply_fp8

        comps = apply_fp8(comps)
    return comps


def new_stream(comps, config, prompt: str = "", negative_prompt: str = ""):
    """A new image stream (its own buffer, noise, filter and prompt state) over loaded networks
    `comps` with `config`: the one place a StreamDiffusion is made (the CLI's through
    `build_pipeline`, a web session's over the shared model, a batch job's per output size)."""
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion

    return StreamDiffusion(comps, config, prompt=prompt, negative_prompt=negative_prompt)


def read_picture(path: str, flag: str):
    """An image file as HxWx3 uint8 RGB, or a clear error naming the flag."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, UnidentifiedImageError) as exc:
        raise StreamStudioError(f"{flag} {path!r} is not a readable image ({exc})") from exc


def check_references(addons: Addons) -> None:
    """A stream's IP-Adapter and its reference picture come together."""
    if addons.ip_adapter and not addons.ip_image:
        raise StreamStudioError("--ip-adapter needs a reference image: --ip-image FILE")
    if addons.ip_image and not addons.ip_adapter:
        raise StreamStudioError("--ip-image is the reference of an IP-Adapter: give --ip-adapter too")


def add_addons(addons: Addons, comps, device, dtype) -> None:
    """LoRA, ControlNet, IP-Adapter into `comps`, before acceleration (engines and compiled graphs
    see the fused weights and the add-ons' inputs), with the preprocessors and scales every stream
    on them starts from (a web session's too). Streams and engine builds both add them here."""
    nets, preps = addons.controlnets, addons.control_preprocessors
    if len(preps) > len(nets):
        raise StreamStudioError(f"{len(preps)} --control-preprocessor for {len(nets)} --controlnet; give one per net")
    if addons.loras:
        from streamstudio.models.image.lora import LoraSet

        comps.loras = LoraSet(comps)
        for spec in addons.loras:
            comps.notes.append(f"LoRA: {comps.loras.add(spec).source}")
    if nets:
        _add_controlnets(nets, preps, comps, device, dtype)
    if addons.ip_adapter:
        from streamstudio.models.image.ip_adapter import IPAdapter

        comps.ip_adapter = IPAdapter(comps, addons.ip_adapter)
        comps.notes.append(f"IP-Adapter: {comps.ip_adapter.source} (scale {comps.ip_adapter.scale:g})")


def _add_controlnets(nets: list[str], preps: list[str], comps, device, dtype) -> None:
    from streamstudio.models.image.controlnet import check_fits, load_controlnet, parse_controlnet
    from streamstudio.pipelines.image.control import Preprocessor

    specs = [parse_controlnet(text) for text in nets]
    kinds = [preps[i] if i < len(preps) else "canny" for i in range(len(specs))]
    for kind in kinds:
        Preprocessor(kind)  # a wrong name fails here, before any network loads
    comps.controlnets = [load_controlnet(spec.source, device, dtype) for spec in specs]
    for net in comps.controlnets:
        check_fits(net, comps.unet)
    comps.control_defaults = [(kind, spec.scale) for kind, spec in zip(kinds, specs)]
    comps.notes += [f"ControlNet: {spec.source} ({kind}, scale {spec.scale:g})" for kind, spec in zip(kinds, specs)]


def acceleration_plan(request: ImageRequest, config, serving: bool):
    """The batches the accelerated networks will be sent (TensorRT engines are built for them and
    capture each; compiled networks are warmed up at each), or None.

    generate and render: one stream of `config`, on this thread. serve: streams of any CFG type
    through the batching executor; compiled networks are warmed up on the executor's thread
    instead (models.image.batching.warm_up, from the server's model), so they get no plan here."""
    from streamstudio.models.image.acceleration import BatchPlan

    if not serving:
        return BatchPlan.for_streams(height=config.height, width=config.width,
                                     steps=len(config.resolved_t_index_list()),
                                     frame_buffer_size=config.frame_buffer_size, cfg_types=[config.cfg_type],
                                     stream_batch=config.use_denoising_batch)
    if request.acceleration == "compile":
        return None
    return stream_plan(config, request.batching)


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
    from streamstudio.models.image.acceleration import BatchPlan
    from streamstudio.pipelines.live_settings import CFG_TYPES

    types = [config.cfg_type, *(t for t in (cfg_types or CFG_TYPES) if t != config.cfg_type)]
    return BatchPlan.for_streams(height=config.height, width=config.width, steps=len(config.resolved_t_index_list()),
                                 frame_buffer_size=config.frame_buffer_size, cfg_types=types,
                                 stream_batch=config.use_denoising_batch,
                                 max_rows=batching.max_rows if batching is not None else None,
                                 pad=batching.pad_to_buckets if batching is not None else None)
