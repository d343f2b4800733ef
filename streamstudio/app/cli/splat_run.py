"""`streamstudio splat`'s runner: `convert IN OUT`, or a Gaussian scene rendered along a camera
path (optionally stylised through the image pipeline) on streaming.Runner into a video or a
folder of PNGs. Its parser and the checks said before torch loads are in splat.py."""

from __future__ import annotations

import logging
import sys
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from streamstudio.app.cli.splat import parse_size, render_settings, scene_path
from streamstudio.app.streams import watch
from streamstudio.app.streams.image import build_pipeline, request
from streamstudio.app.streams.splat_paths import read_path_file
from streamstudio.device import pick_device
from streamstudio.errors import StreamStudioError
from streamstudio.frames import parse_color
from streamstudio.kernels.splat import pick_impl
from streamstudio.models.splats.gaussians import SAVE_FORMATS, load_scene, save_format, save_scene
from streamstudio.pipelines.splats.splat_render import (SceneFit, SplatRenderConfig, camera_path, path_times,
                                                        render_frame, with_camera_model)
from streamstudio.streaming.generated import SplatPathSource
from streamstudio.streaming.processor import IdentityProcessor
from streamstudio.streaming.runner import Runner, RunnerConfig
from streamstudio.streaming.sinks import make_output_folder, open_sink

log = logging.getLogger(__name__)

VIDEO_SUFFIXES = (".mp4", ".mkv", ".mov")


def output_sink(output: str | Path, fps: float):
    """The sink factory for --output (a FILE.mp4/.mkv/.mov, or a FOLDER of frame_00000.png, ...),
    for the runner to open at the first frame's size. A bad or unwritable output fails here, before
    anything is rendered (and no empty file is left behind when the run fails before its first frame)."""
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
    """`splat convert IN OUT`, or the scene rendered along its camera path (splat.check passed)."""
    return convert(args) if args.scene == "convert" else render_scene(args)


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
    impl = pick_impl(cfg.impl, device)
    return f"renderer: {impl}" + (" (auto)" if cfg.impl == "auto" else "")

