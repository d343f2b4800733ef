"""`streamstudio generate`: txt2img images, or img2img over a folder of images as a stream."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.sources import IMAGE_SUFFIXES

log = logging.getLogger(__name__)


def add_parser(subparsers) -> argparse.ArgumentParser:
    from streamstudio.app.settings import add_pipeline_arguments, add_setting_flags, number

    p = subparsers.add_parser("generate", description=__doc__)
    p.add_argument("--input", default=None, help="an image or a folder of images (img2img, in name order)")
    p.add_argument("--output", required=True, help="folder for the PNGs")
    p.add_argument("--num-images", type=number(int, 1, 100_000), default=1, help="txt2img: how many images (default 1)")
    add_setting_flags(p, names=["fit"])  # the settings table's --fit (pipelines/live_settings.py)
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
    from streamstudio.app.cli.requests import image_request
    from streamstudio.app.streams import FittedFrames, build_pipeline, watch
    from streamstudio.streaming.runner import Runner, RunnerConfig
    from streamstudio.streaming.sinks import ImageSequenceSink, check_not_input, make_output_folder
    from streamstudio.streaming.generated import NoInputSource
    from streamstudio.streaming.sources import ImageSequenceSource, Source

    inputs = list_images(Path(args.input)) if args.input else None
    if args.num_images < 1:
        raise StreamStudioError("--num-images must be at least 1")
    for f in inputs or ():  # an output image named as its input would overwrite it
        check_not_input(Path(args.output) / (f.stem + ".png"), [f])
    out_dir = make_output_folder(args.output, "images")  # before the model loads
    if inputs:  # the first image's aspect sizes the output, as render's input does; every image is fitted to it
        pipe = FittedFrames(build_pipeline(image_request(args), "img2img", aspect=image_aspect(inputs[0])), args.fit)
    else:
        pipe = build_pipeline(image_request(args), "txt2img")
    print(f"model: {pipe.comps.name} ({pipe.step_type} step), t_index_list {pipe.config.resolved_t_index_list()}, "
          f"frame latency {pipe.latency_frames}")
    width, height = pipe.config.width, pipe.config.height
    source: Source
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
