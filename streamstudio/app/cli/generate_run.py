"""`streamstudio generate`'s runner: the image pipeline over --num-images empty frames (txt2img)
or the input images (img2img), into a folder of PNGs. Its parser and the checks said before the
model loads are in generate.py."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from streamstudio.app import streams
from streamstudio.app.cli.generate import list_images
from streamstudio.app.cli.requests import image_request
from streamstudio.app.streams import FittedFrames, watch
from streamstudio.streaming.generated import NoInputSource
from streamstudio.streaming.runner import Runner, RunnerConfig
from streamstudio.streaming.sinks import ImageSequenceSink
from streamstudio.streaming.sources import ImageSequenceSource, Source


def image_aspect(path: Path) -> float | None:
    """An image file's width / height, read from its header (None when it cannot be read: the
    source says why when it opens it)."""
    try:
        with Image.open(path) as im:
            width, height = im.size
    except OSError:
        return None
    return width / height if width and height else None


def run(args) -> int:
    """txt2img: a NoInputSource of --num-images frames; img2img: the images as one stream. Both
    run on streaming.Runner into the output folder (generate.check made it), each image named
    after its input."""
    inputs = list_images(Path(args.input)) if args.input else None
    out_dir = Path(args.output)
    if inputs:  # the first image's aspect sizes the output, as render's input does; every image is fitted to it
        aspect = image_aspect(inputs[0])
        pipe = FittedFrames(streams.build_pipeline(image_request(args), "img2img", aspect=aspect), args.fit)
    else:
        pipe = streams.build_pipeline(image_request(args), "txt2img")
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

