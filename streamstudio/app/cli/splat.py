"""`streamstudio splat`: render a Gaussian scene along a camera path to a video or a folder of
PNG frames, optionally stylised frame by frame through the image pipeline (--prompt).

    streamstudio splat sample --path orbit --frames 48 --size 512x512 --output orbit.mp4
    streamstudio splat scene.ply --path fly --output frames/ --prompt "a watercolour painting"
    streamstudio splat sample4d --time-range 0 1 --frames 60 --output moons.mp4
    streamstudio splat scene.ply --path-file camera_path.json --fps 30 --output fly.mp4

    streamstudio splat convert scene.compressed.ply scene.ply
    streamstudio splat convert scene.ply scene.compressed.ply

SCENE is a 3DGS .ply, SuperSplat's compressed .ply, an antimatter15 .splat, Niantic's .spz,
PlayCanvas's .sog (or an unbundled SOG's meta.json), a StreamStudio 4D .ply, or `sample` /
`sample4d` for the bundled scenes. `convert IN OUT` reads any of those and writes OUT by its name:
`*.compressed.ply` (or any .ply with --compressed) SuperSplat's compressed .ply, `*.ply` the 3DGS
.ply (4D scenes keep their 4D properties), `*.splat` (degree-0 colour only), `*.spz` (version 3).

--path-file flies an authored path: nerfstudio's camera_path.json (its viewer's camera path export;
also what the web app's Splats tab saves), SuperSplat's viewer export settings (`animTracks`), a
SuperSplat project (`.ssproj`) or its document.json (`poseSets`). The file's size and frame rate are
the defaults of --size and --fps; --frames spreads that many frames over the path."""

from __future__ import annotations

import argparse
from pathlib import Path

from streamstudio import ASSETS
from streamstudio.app.settings import add_pipeline_arguments, add_setting_flags, config_values, number
from streamstudio.errors import StreamStudioError
from streamstudio.pipelines.live_settings import SPLAT_PATHS, SPLAT_SETTINGS  # no torch: parsing stays quick

SAMPLES = {"sample": "sample_scene.ply", "sample4d": "sample_4d.ply"}
STYLISE_FLAGS = ("--prompt", "--model", "--steps", "--strength", "--seed")  # the image pipeline's, as it declares them


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("splat", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scene", metavar="SCENE", help="a .ply / .splat file, or sample / sample4d; or `convert`")
    p.add_argument("convert_paths", nargs="*", metavar="IN OUT",
                   help="with `convert`: the scene to read and the file to write (.ply, .compressed.ply, .splat, .spz)")
    p.add_argument("--path", choices=SPLAT_PATHS, default="orbit", help="camera path (default orbit)")
    p.add_argument("--path-file", default=None, metavar="FILE",
                   help="fly an authored camera path: nerfstudio camera_path.json, SuperSplat's animation "
                        "(viewer export settings .json, or a .ssproj project); overrides --path")
    p.add_argument("--frames", type=number(int, 1, 10**7), default=None,
                   help="number of frames (default 48; with --path-file the path's seconds x fps)")
    p.add_argument("--size", default=None, help="WxH in pixels (default 512x512, or the path file's size)")
    p.add_argument("--output", default=None,
                   help="FILE.mp4 (.mkv, .mov) or a FOLDER for PNG frames (required, but for `convert`)")
    p.add_argument("--compressed", action="store_true",
                   help="with `convert`: write SuperSplat's compressed .ply whatever OUT's name")
    p.add_argument("--spz-axes", choices=("rub", "rdf"), default="rub",
                   help="the axes a .spz scene holds: rub (the format's own, as Niantic's library writes) or rdf "
                        "(the .ply's, unconverted: PlayCanvas splat-transform writes .spz so; such a scene shows "
                        "upside down as rub) (default rub)")
    p.add_argument("--fps", type=number(float, 0, 1000, low_open=True), default=None,
                   help="video frame rate (default 24, or the path file's)")
    p.add_argument("--time-range", nargs=2, type=number(float, -1e9, 1e9), metavar=("A", "B"), default=None,
                   help="4D scenes: the time of the first and the last frame (default the scene's range)")
    add_setting_flags(p, table=SPLAT_SETTINGS)  # the camera and render flags: --fov, --camera, --elevation, ...
    add_image_flags(p, ("--device",))  # the renderer's and the stylising model's
    style = p.add_argument_group("stylise (img2img on every rendered frame, when a --prompt is given)")
    add_image_flags(style, STYLISE_FLAGS)
    style.add_argument("--side-by-side", action="store_true",
                       help="write the render and the stylised frame side by side")
    return p


def add_image_flags(group, flags) -> None:
    """The image pipeline's options `flags` on `group`, as the one function that declares them
    (app/settings.add_pipeline_arguments) does: same names, types, ranges, defaults and help."""
    source = argparse.ArgumentParser(add_help=False)
    add_pipeline_arguments(source)
    for flag in flags:
        group._add_action(source._option_string_actions[flag])


def render_settings(args) -> dict:
    """The `SplatRenderConfig` fields the command line gave, by name: the splat table's pipeline
    settings (an optional flag not given is left to the config's default)."""
    return config_values(vars(args), SPLAT_SETTINGS)


def parse_size(text: str) -> tuple[int, int]:
    """--size WxH, each side in the splat table's width / height range."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise StreamStudioError(f"--size must look like 512x512, got {text!r}") from None
    side = SPLAT_SETTINGS["width"]
    assert side.low is not None and side.high is not None  # (the table's range)
    if not (side.low <= w <= side.high and side.low <= h <= side.high):
        raise StreamStudioError(f"--size {text} is out of range; use {side.low}..{side.high} pixels a side")
    return w, h


def scene_path(name: str) -> Path:
    return ASSETS / SAMPLES[name] if name in SAMPLES else Path(name)


def check(args) -> None:
    """What splat says before torch loads: one SCENE (or `convert IN OUT`), an --output to render
    to, --compressed only with `convert`."""
    if args.scene == "convert":
        return
    if args.convert_paths:
        raise StreamStudioError(f"unexpected arguments {' '.join(args.convert_paths)}: give one SCENE "
                                "(or `convert IN OUT`)")
    if args.output is None:
        raise StreamStudioError("--output is required: a FILE.mp4 (.mkv, .mov) or a FOLDER for PNG frames")
    if args.compressed:
        raise StreamStudioError("--compressed goes with `convert IN OUT`")
