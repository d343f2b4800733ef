"""`streamstudio generate`: txt2img images, or img2img over a folder of images as a stream."""

from __future__ import annotations

import argparse
from pathlib import Path

from streamstudio.app.settings import add_pipeline_arguments, add_setting_flags, number
from streamstudio.errors import StreamStudioError
from streamstudio.models.hub import check_model_source
from streamstudio.streaming.sinks import check_not_input, make_output_folder
from streamstudio.streaming.sources import IMAGE_SUFFIXES


def add_parser(subparsers) -> argparse.ArgumentParser:
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


def check(args) -> None:
    """What generate says before the model loads: the model, the inputs, --num-images, an output
    image that would overwrite its input, the output folder (made now)."""
    check_model_source(args.model)  # a hub id that cannot be had: said at once, before torch loads
    inputs = list_images(Path(args.input)) if args.input else None
    if args.num_images < 1:
        raise StreamStudioError("--num-images must be at least 1")
    for f in inputs or ():  # an output image named as its input would overwrite it
        check_not_input(Path(args.output) / (f.stem + ".png"), [f])
    make_output_folder(args.output, "images")
