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
import logging
import sys
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from streamstudio import ASSETS
from streamstudio.errors import StreamStudioError
from streamstudio.frames import parse_color
from streamstudio.pipelines.live_settings import SPLAT_PATHS, SPLAT_SETTINGS  # no torch: parsing stays quick

log = logging.getLogger(__name__)

SAMPLES = {"sample": "sample_scene.ply", "sample4d": "sample_4d.ply"}
VIDEO_SUFFIXES = (".mp4", ".mkv", ".mov")
STYLISE_FLAGS = ("--prompt", "--model", "--steps", "--strength", "--seed")  # the image pipeline's, as it declares them


def add_parser(subparsers) -> argparse.ArgumentParser:
    from streamstudio.app.settings import add_setting_flags, number

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
    from streamstudio.app.settings import add_pipeline_arguments

    source = argparse.ArgumentParser(add_help=False)
    add_pipeline_arguments(source)
    for flag in flags:
        group._add_action(source._option_string_actions[flag])


def render_settings(args) -> dict:
    """The `SplatRenderConfig` fields the command line gave, by name: the splat table's pipeline
    settings (an optional flag not given is left to the config's default)."""
    from streamstudio.app.settings import config_values

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


def output_sink(output: str | Path, fps: float):
    """The sink factory for --output (a FILE.mp4/.mkv/.mov, or a FOLDER of frame_00000.png, ...),
    for the runner to open at the first frame's size. A bad or unwritable output fails here, before
    anything is rendered (and no empty file is left behind when the run fails before its first frame)."""
    from streamstudio.streaming.sinks import make_output_folder, open_sink

    path = Path(output)
    if path.suffix.lower() in VIDEO_SUFFIXES:
        make_output_folder(path.parent)
        if path.is_dir():
            raise StreamStudioError(f"--output {path} is a folder; give a file name for the video")
        spec = str(path)
    elif path.suffix:
        raise StreamStudioError(f"--output {path}: use a .mp4/.mkv/.mov file or a folder name")
    else:
        make_output_folder(path)
        spec = str(path / "frame_%05d.png")
    return lambda width, height: open_sink(spec, width, height, fps)


def stylizer(args, width: int, height: int):
    """The frame processor for --prompt: the image pipeline (streams.build_pipeline) with the
    stylise options over the image pipeline's defaults, at the render's size; with
    --side-by-side each render is written beside its stylised frame."""
    from streamstudio.app.streams.image import build_pipeline, request

    settings = request(**{name: getattr(args, name) for name in ("model", "prompt", "steps", "strength", "seed",
                                                                  "device")}, width=width, height=height)
    pipe = build_pipeline(settings, "img2img")
    return SideBySide(pipe) if args.side_by_side else pipe


class SideBySide:
    """A frame processor that hands out each input frame with its processed frame to its right."""

    def __init__(self, pipe: Any) -> None:  # a frame processor (push, flush)
        self.pipe = pipe
        self._inputs: deque[np.ndarray] = deque()  # inputs whose outputs have not come out yet

    def push(self, frame: np.ndarray) -> list[np.ndarray]:
        self._inputs.append(frame)
        return self._beside(self.pipe.push(frame))

    def flush(self) -> list[np.ndarray]:
        return self._beside(self.pipe.flush())

    def _beside(self, outs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.concatenate([self._inputs.popleft(), out], axis=1) for out in outs]


def convert(args) -> int:
    """`splat convert IN OUT`: read any supported scene and write it in the format OUT names."""
    from streamstudio.models.splats.gaussians import SAVE_FORMATS, load_scene, save_format, save_scene
    from streamstudio.streaming.sinks import make_output_folder

    if len(args.convert_paths) != 2:
        raise StreamStudioError("usage: streamstudio splat convert IN OUT [--compressed] (OUT: .ply, "
                                ".compressed.ply, .splat or .spz)")
    source, target = scene_path(args.convert_paths[0]), Path(args.convert_paths[1])
    fmt = save_format(target)
    if args.compressed:
        if fmt not in ("ply", "compressed"):
            raise StreamStudioError(f"--compressed writes a .ply; {target} does not end in .ply")
        fmt = "compressed"
    if fmt is None:
        raise StreamStudioError(f"cannot write {target}: OUT must end in .ply (3DGS), .compressed.ply (SuperSplat's "
                                f"compressed .ply), .splat or .spz")
    scene = load_scene(source, spz_axes=args.spz_axes)
    if fmt in ("compressed", "spz") and scene.is_4d:
        raise StreamStudioError(f"{source} is a 4D scene; {SAVE_FORMATS[fmt]} holds 3D scenes only: "
                                "write it as .ply")
    if fmt == "splat" and scene.antialiased:
        log.warning("%s cannot say the scene is antialiased; render it with --antialiased", target)
    if fmt == "splat" and (scene.sh_degree > 0 or scene.is_4d):
        log.warning("%s keeps only the degree-0 colour%s", target, " and drops the 4D time" if scene.is_4d else "")
    make_output_folder(target.resolve().parent)
    try:
        save_scene(scene, target, fmt)
    except OSError as exc:
        raise StreamStudioError(f"cannot write {target}: {exc.strerror or exc}") from exc
    print(f"wrote {len(scene)} Gaussians (SH degree {scene.sh_degree}{', 4D' if scene.is_4d else ''}) from "
          f"{source} to {target} ({SAVE_FORMATS[fmt]}, {target.stat().st_size} bytes)")
    return 0


def run(args) -> int:
    if args.scene == "convert":
        return convert(args)
    if args.convert_paths:
        raise StreamStudioError(f"unexpected arguments {' '.join(args.convert_paths)}: give one SCENE "
                                "(or `convert IN OUT`)")
    if args.output is None:
        raise StreamStudioError("--output is required: a FILE.mp4 (.mkv, .mov) or a FOLDER for PNG frames")
    if args.compressed:
        raise StreamStudioError("--compressed goes with `convert IN OUT`")
    return render_scene(args)


def scene_times(scene, path_times_: list[float | None], time_range: tuple[float, float] | None) -> list[float | None]:
    """4D scene times of path frames whose normalised time (0..1, nerfstudio's render_time) is given;
    frames without one are spread evenly over the range (None for a 3D scene)."""
    if not scene.is_4d:
        return [None] * len(path_times_)
    lo, hi = time_range if time_range is not None else scene.time_range
    given = [t for t in path_times_ if t is not None]
    if len(given) < len(path_times_):  # (a frame without a time)
        n = len(path_times_)
        return [lo + (hi - lo) * i / max(n - 1, 1) for i in range(n)]
    return [lo + (hi - lo) * float(t) for t in given]


def render_scene(args) -> int:
    from streamstudio.app.streams.splat_paths import read_path_file
    from streamstudio.app.streams import watch
    from streamstudio.device import pick_device
    from streamstudio.models.splats.gaussians import load_scene
    from streamstudio.pipelines.splats.splat_render import (SceneFit, SplatRenderConfig, camera_path, path_times,
                                                            render_frame, with_camera_model)
    from streamstudio.streaming.processor import IdentityProcessor
    from streamstudio.streaming.runner import Runner, RunnerConfig
    from streamstudio.streaming.generated import SplatPathSource

    keyed = read_path_file(args.path_file) if args.path_file else None
    if args.size is not None:
        width, height = parse_size(args.size)
    elif keyed is not None and keyed.width and keyed.height:
        width, height = parse_size(f"{keyed.width}x{keyed.height}")
    else:
        width, height = 512, 512
    fps = args.fps if args.fps is not None else (keyed.fps if keyed is not None and keyed.fps else 24.0)
    if args.frames is not None and args.frames < 1:
        raise StreamStudioError("--frames must be at least 1")
    if not 0 < fps <= 1000:
        raise StreamStudioError(f"--fps must be a positive frame rate up to 1000, got {fps:g}")
    if keyed is not None and args.fov is not None:
        log.warning("--fov ignored: the path file gives each camera's field of view")
    device = pick_device(args.device)
    background = parse_color(args.background, "--background")
    cfg = SplatRenderConfig(width=width, height=height, background=background, device=str(device),
                            **render_settings(args))  # --fov, --sh-degree, --mode, --renderer, --camera, ...
    cfg.check()
    scene = load_scene(scene_path(args.scene), spz_axes=args.spz_axes)
    time_range = tuple(args.time_range) if args.time_range else None
    if time_range is not None and not scene.is_4d:
        log.warning("--time-range ignored: %s is a 3D scene", args.scene)
    if keyed is not None:
        pairs = keyed.cameras(width, height, fps, args.frames)
        fit = SceneFit.of(scene)
        cameras = [with_camera_model(cam, cfg, fit) for cam, _ in pairs]
        times = scene_times(scene, [t for _, t in pairs], time_range)
    else:
        frames = 48 if args.frames is None else args.frames
        cameras = camera_path(args.path, SceneFit.of(scene), cfg, frames, args.elevation)
        times = path_times(scene, frames, time_range)
    open_output = output_sink(args.output, fps)  # an output that cannot be written fails here, early
    print(render_header(args, scene, cfg, device, len(cameras), fps), file=sys.stderr, flush=True)
    print(renderer_line(cfg, device), file=sys.stderr, flush=True)
    processor = stylizer(args, width, height) if args.prompt else IdentityProcessor()
    source = SplatPathSource(lambda camera, t: render_frame(scene, camera, cfg, t), cameras, times, fps, width,
                             height, description=f"{args.scene} along its camera path")
    runner = Runner(source, processor, open_output, RunnerConfig(live=False))
    metrics = watch(runner, len(cameras), desc="splat")
    print(f"wrote {metrics.frames_out} frames of {len(scene)} Gaussians to {args.output} "
          f"({metrics.frames_out / max(metrics.elapsed, 1e-9):.1f} frames/s)")
    return 0


def render_header(args, scene, cfg, device, frames: int, fps: float) -> str:
    """What splat is about to do, printed before anything slow (building the rasteriser, the
    first frame): the scene, its Gaussians, the size, frames and device."""
    kind = f"4D, times {scene.time_range[0]:g}..{scene.time_range[1]:g}" if scene.is_4d else "3D"
    style = f", stylised with model {args.model} (prompt {args.prompt!r})" if args.prompt else ""
    return (f"splat: {args.scene} ({len(scene)} Gaussians, SH degree {scene.sh_degree}, {kind}) -> {args.output}: "
            f"{frames} frame(s) at {cfg.width}x{cfg.height} @ {fps:g} fps, {cfg.camera} camera, mode {cfg.mode}, "
            f"device {device}{style}")


def renderer_line(cfg, device) -> str:
    """The rasteriser auto picks (finding it may build the C++/CUDA extension, once)."""
    from streamstudio.kernels.splat import pick_impl

    impl = pick_impl(cfg.impl, device)
    return f"renderer: {impl}" + (" (auto)" if cfg.impl == "auto" else "")
