"""The web app's Splats tab: view a Gaussian-splat scene (upload or the bundled samples) with
orbit / zoom / pan sliders and click-to-orbit on the image, choose resolution, SH degree,
background and render mode (RGB, depth, alpha), scrub or play the time of a 4D scene, and
"Stylize": stream the rendered fly-through into the img2img pipeline, the splat view and the
stylised view side by side. A fly-through can be authored: "Add keyframe" keeps the current view,
"Preview" plays the smooth path through the keyframes, "Save path" writes it as nerfstudio's
camera_path.json and "Load path" reads one (or SuperSplat's animation); Stylize flies it with the
"keyframes" path.

`build_splat_tab()` fills an open `gr.Tab`. The callbacks are plain functions over a
`SplatSession` (one per browser session, in a `gr.State`), tested without a browser.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator
import functools
import inspect
import math
import tempfile

import numpy as np
import torch

from streamstudio import ASSETS
from streamstudio.device import pick_device
from streamstudio.errors import StreamStudioError
from streamstudio.frames import parse_color
from streamstudio.models.splats.gaussians import GaussianScene, load_scene
from streamstudio.pipelines.live_settings import SPLAT_SETTINGS, defaults
from streamstudio.pipelines.splats.splat_render import (PATHS, Keyframe, KeyframePath, SceneFit, SplatRenderConfig,
                                                        camera_path, fitted_camera, render, to_frame, with_camera_model)
from streamstudio.app.settings import widget
from streamstudio.app.streams.image import build_pipeline, multiple_of_8, request
from streamstudio.app.streams.splat_paths import read_path_file
from streamstudio.app.streams.splat_paths import write_path_file
from streamstudio.kernels import splat_cpu
from streamstudio.kernels.splat import pick_impl
from streamstudio.pipelines.live_settings import SETTINGS

log = logging.getLogger(__name__)

SAMPLES = {"Sample scene": ASSETS / "sample_scene.ply", "4D sample (orbiting moons)": ASSETS / "sample_4d.ply"}
CLICK_ORBIT_DEG = 90.0  # a click at the image's edge turns the view this far
PLAY_STEPS = 48
MAX_STYLIZE_FRAMES = 600
KEYFRAMES = "keyframes"  # the fly-through option that follows the authored path
TAB_PATHS = (*PATHS, KEYFRAMES)
PREVIEW_FPS = 12.0
MAX_KEYFRAMES = 200


_VIEW = defaults(SPLAT_SETTINGS)  # the splat table's defaults (pipelines/live_settings.py)


@dataclass
class ViewSettings:
    """Everything the view controls set, in the order the tab hands their values over; the
    defaults and ranges are the splat settings table's (but the time's, each scene's own)."""

    azimuth: float = _VIEW["azimuth"]
    elevation: float = _VIEW["elevation"]
    zoom: float = _VIEW["zoom"]
    pan_x: float = _VIEW["pan_x"]
    pan_y: float = _VIEW["pan_y"]
    width: int = _VIEW["width"]
    height: int = _VIEW["height"]
    sh_degree: int = _VIEW["sh_degree"]
    background: str = _VIEW["background"]
    mode: str = _VIEW["mode"]
    time: float = 0.0  # a 4D scene's: the slider takes each scene's time range
    camera: str = _VIEW["camera"]  # perspective | ortho | fisheye

    def render_config(self, device: str | None = None) -> SplatRenderConfig:
        """The renderer settings; the device is the GPU when there is one (the CUDA kernel)."""
        background = parse_color(self.background, "background colour")
        return SplatRenderConfig(width=int(self.width), height=int(self.height), sh_degree=int(self.sh_degree),
                                 background=background, mode=self.mode.lower(), device=device or str(pick_device()),
                                 camera=(self.camera or "perspective").lower(),
                                 fov_y_deg=120.0 if (self.camera or "").lower() == "fisheye" else _VIEW["fov_y_deg"])


@dataclass
class SplatSession:
    scene: GaussianScene | None = None
    name: str = ""
    fit: SceneFit = field(default_factory=SceneFit)
    stop_requested: bool = False
    loading: bool = False  # Load has the scene and is getting the renderer ready (its first build)
    pipe: object = None  # the img2img stream of this session, made on the first Stylize
    path: KeyframePath | None = None  # the authored fly-through (keyframes), when there is one


def load_into(session: SplatSession, upload: str | None, sample: str | None,
              spz_axes: str = "rub") -> tuple[SplatSession, str]:
    """Load the uploaded file, else the chosen sample, into the session (a .spz read with the
    axes `spz_axes`, `gaussians.SPZ_AXES`). Returns (session, info)."""
    if upload:
        path = Path(upload if isinstance(upload, str) else getattr(upload, "name", str(upload)))
    elif sample in SAMPLES:
        path = SAMPLES[sample]
    else:
        raise StreamStudioError("upload a .ply or .splat scene, or choose a sample")
    try:
        scene = load_scene(path, spz_axes=spz_axes)
    except StreamStudioError as exc:  # name the file as the user knows it, not the server's temp path
        raise StreamStudioError(without_folders(str(exc), path)) from None
    session.scene, session.name, session.fit = scene, path.name, SceneFit.of(scene)
    kind = f"4D, t in [{scene.time_range[0]:.2f}, {scene.time_range[1]:.2f}]" if scene.is_4d else "3D"
    return session, f"Loaded **{path.name}**: {len(scene):,} Gaussians, SH degree {scene.sh_degree}, {kind}."


def without_folders(message: str, path: Path) -> str:
    """`message` with `path` (as given, and resolved) written as its file name only: an upload's
    server folder (Gradio's temp folder) means nothing to the user and is not theirs to see."""
    for form in {str(path), str(path.resolve())}:
        message = message.replace(form, path.name)
    return message


def time_slider_range(lo: float, hi: float) -> tuple[float, float, float]:
    """(minimum, maximum, step) of the time slider for a scene's time range: the range widened to
    a round step (about a hundredth of it), so the slider's labels read 0 and 1, not
    0.0007824897766113281."""
    if not hi - lo > 1e-6:  # no span (a 3D scene): a plain 0..1 from its time
        lo = round(lo, 2)
        return lo, lo + 1.0, 0.01
    step = 10.0 ** round(math.log10((hi - lo) / 100))
    digits = max(0, -int(math.floor(math.log10(step))))
    minimum = round(math.floor(lo / step + 1e-6) * step, digits)
    maximum = round(math.ceil(hi / step - 1e-6) * step, digits)
    return minimum, max(maximum, round(minimum + step, digits)), step


BUILDING_CPP = "Building the C++ splat renderer (once, about a minute)…"
NO_SCENE = "Load a scene first: choose a sample or upload a file, then press Load."
STILL_LOADING = "The scene is still loading (the splat renderer is being built): press Stylize when its view shows."


def renderer_build_note(cfg: SplatRenderConfig) -> str | None:
    """What to tell the user while the renderer `cfg` picks gets ready, when its first use may
    build it (the C++ CPU renderer: about a minute, once); None when it answers at once."""
    if cfg.device.split(":")[0] == "cpu" and cfg.impl in ("auto", "cpp") and not splat_cpu.ready():
        return BUILDING_CPP
    return None


def warm_renderer(cfg: SplatRenderConfig) -> str:
    """Have the renderer `cfg` picks built or imported now (the C++ or CUDA extension, on its first
    use in this process), so no frame's time includes the build. Returns the implementation."""
    return pick_impl(cfg.impl, torch.device(cfg.device))


def render_view(session: SplatSession, view: ViewSettings) -> tuple[np.ndarray, str]:
    """One frame of the current view and a line with the frame rate and Gaussian count (the time
    of the render alone: a renderer's one-off build comes before the clock starts)."""
    if session.scene is None:
        raise StreamStudioError("load a scene first")
    cfg = view.render_config()
    cam = fitted_camera(session.fit, cfg, view.azimuth, view.elevation, view.zoom, (view.pan_x, view.pan_y))
    warm_renderer(cfg)
    start = time.perf_counter()
    out = render(session.scene, cam, cfg, view.time if session.scene.is_4d else None)
    took = time.perf_counter() - start
    info = (f"{1 / max(took, 1e-9):.1f} fps ({took * 1000:.0f} ms) · {len(session.scene):,} Gaussians, "
            f"{out.n_visible:,} in view · {cfg.width}x{cfg.height} · {out.impl} renderer")
    if session.scene.is_4d:
        info += f" · t = {view.time:.3f}"
    return to_frame(out, cfg), info


def click_orbit(view: ViewSettings, x: float, y: float) -> ViewSettings:
    """Turn the view towards a clicked pixel (x, y): the farther from the centre, the more."""
    view.azimuth = wrap_degrees(view.azimuth - CLICK_ORBIT_DEG * (2 * x / view.width - 1))
    limits = SPLAT_SETTINGS["elevation"]
    view.elevation = float(np.clip(view.elevation + CLICK_ORBIT_DEG * (2 * y / view.height - 1), limits.low,
                                   limits.high))
    return view


def wrap_degrees(angle: float) -> float:
    return (angle + 180.0) % 360.0 - 180.0


def play_times(session: SplatSession, start: float, steps: int = PLAY_STEPS) -> list[float]:
    """The times a 4D scene is played at, from `start` to the end of its range (one pass)."""
    if session.scene is None or not session.scene.is_4d:
        raise StreamStudioError("play needs a 4D scene; load the 4D sample or a 4D .ply")
    lo, hi = session.scene.time_range
    start = min(max(start, lo), hi)
    if start >= hi - 1e-9:
        start = lo
    return [start + (hi - start) * i / max(steps - 1, 1) for i in range(steps)]


def play(session: SplatSession, view: ViewSettings, steps: int = PLAY_STEPS) -> Iterator[tuple[np.ndarray, str, float]]:
    """Frames of a 4D scene over time: (frame, info, time)."""
    session.stop_requested = False
    for t in play_times(session, view.time, steps):
        if session.stop_requested:
            return
        view.time = t
        frame, info = render_view(session, view)
        yield frame, info, t


def stylize(session: SplatSession, view: ViewSettings, path: str, frames: int, prompt: str, strength: float,
            make_pipe: Callable[[], object], slots=None) -> Iterator[tuple[np.ndarray, np.ndarray, str]]:
    """Render the fly-through along `path` and push each frame into the img2img stream live:
    yields (splat frame, stylised frame, info) per frame; stops on `session.stop_requested`.
    `slots` (the server's SessionManager) counts the stream against --max-streams while it runs."""
    if session.scene is None:
        raise StreamStudioError("load a scene first")
    if not 1 <= frames <= MAX_STYLIZE_FRAMES:
        raise StreamStudioError(f"frames must be 1..{MAX_STYLIZE_FRAMES}")
    key = f"splats-{id(session):x}"
    if slots is not None:
        slots.take_slot(key, "Splats Stylize")  # BusyError when the server is full
    try:
        yield from _stylize(session, view, path, frames, prompt, strength, make_pipe)
    finally:
        if slots is not None:
            slots.free_slot(key)


def _stylize(session, view, path, frames, prompt, strength, make_pipe):
    session.stop_requested = False
    if session.pipe is None:
        session.pipe = make_pipe()
    pipe = session.pipe
    if hasattr(pipe, "set_prompt") and prompt:
        pipe.set_prompt(prompt)
    if hasattr(pipe, "update"):
        pipe.update(strength=float(strength))
    cfg = view.render_config()
    if path == KEYFRAMES:
        cams, times = path_cameras(session, cfg, frames=frames)
    else:
        cams, times = camera_path(path, session.fit, cfg, frames, view.elevation), _times_for(session.scene, frames)
    for i, cam in enumerate(cams):
        if session.stop_requested:
            return
        start = time.perf_counter()
        frame = to_frame(render(session.scene, cam, cfg, times[i]), cfg)
        styled = _run_pipe(pipe, frame)
        took = time.perf_counter() - start
        yield frame, styled, f"frame {i + 1}/{frames} · {1 / max(took, 1e-9):.1f} fps render + stylize"


def stylize_blocker(session: SplatSession | None) -> str | None:
    """Why Stylize cannot start yet (no scene, or Load still getting the renderer ready), or None."""
    if session is not None and session.loading:
        return STILL_LOADING
    if session is None or session.scene is None:
        return NO_SCENE
    return None


# ----------------------------------------------------------------------------- authored paths

def add_keyframe(session: SplatSession, view: ViewSettings, gap_seconds: float = 2.0) -> str:
    """Keep the current view as the path's next keyframe, `gap_seconds` after the last one."""
    if session.scene is None:
        raise StreamStudioError("load a scene first")
    if not 0.05 <= gap_seconds <= 600:
        raise StreamStudioError("seconds between keyframes must be 0.05..600")
    cfg = view.render_config("cpu")
    cam = fitted_camera(session.fit, cfg, view.azimuth, view.elevation, view.zoom, (view.pan_x, view.pan_y))
    if session.path is None:
        session.path = KeyframePath([])
    keys = session.path.keyframes
    if len(keys) >= MAX_KEYFRAMES:
        raise StreamStudioError(f"a path holds at most {MAX_KEYFRAMES} keyframes")
    key = Keyframe.from_camera(cam, keys[-1].time + gap_seconds if keys else 0.0)
    if session.scene.is_4d:
        lo, hi = session.scene.time_range
        key.scene_time = (view.time - lo) / (hi - lo) if hi > lo else 0.0
    keys.append(key)
    session.path.seconds = None  # the duration follows the keyframes again
    return path_info(session)


def clear_keyframes(session: SplatSession) -> str:
    session.path = None
    return path_info(session)


def path_info(session: SplatSession) -> str:
    path = session.path
    if path is None or not path.keyframes:
        return "No keyframes: set a view and press **Add keyframe**."
    n = len(path.keyframes)
    return (f"**{n} keyframe{'s' if n != 1 else ''}**, {path.duration:.1f} s"
            f"{' (loop)' if path.loop else ''}" + ("" if n > 1 else " · add another to make a path"))


def path_cameras(session: SplatSession, cfg: SplatRenderConfig, fps: float = PREVIEW_FPS,
                 frames: int | None = None) -> tuple[list, list[float | None]]:
    """The authored path's cameras at `fps` (or `frames` over its length) and their 4D times."""
    if session.scene is None:
        raise StreamStudioError("load a scene first")
    if session.path is None or not session.path.keyframes:
        raise StreamStudioError("the path has no keyframes: add some with Add keyframe, or load a path")
    pairs = session.path.cameras(cfg.width, cfg.height, fps, frames)
    cams = [with_camera_model(c, cfg, session.fit) for c, _ in pairs]
    if not session.scene.is_4d:
        return cams, [None] * len(cams)
    lo, hi = session.scene.time_range
    times = [t for _, t in pairs if t is not None]
    if len(times) < len(pairs):  # (a keyframe without a time)
        return cams, _times_for(session.scene, len(cams))
    return cams, [lo + (hi - lo) * t for t in times]


def preview_path(session: SplatSession, view: ViewSettings, fps: float = PREVIEW_FPS,
                 max_frames: int = MAX_STYLIZE_FRAMES) -> Iterator[tuple[np.ndarray, str]]:
    """Frames along the authored path (at `fps`, at most `max_frames`): (frame, info)."""
    session.stop_requested = False
    cfg = view.render_config()
    cams, times = path_cameras(session, cfg, fps)
    if len(cams) > max_frames:
        cams, times = path_cameras(session, cfg, frames=max_frames)
    for i, (cam, t) in enumerate(zip(cams, times)):
        if session.stop_requested:
            return
        start = time.perf_counter()
        assert session.scene is not None  # (path_cameras needs one)
        frame = to_frame(render(session.scene, cam, cfg, t), cfg)
        took = time.perf_counter() - start
        yield frame, f"path frame {i + 1}/{len(cams)} · {1 / max(took, 1e-9):.1f} fps"


def save_path(session: SplatSession, view: ViewSettings, folder: str | Path, fps: float = 30.0) -> str:
    """Write the authored path as nerfstudio's camera_path.json in `folder`; returns its path."""
    if session.path is None or not session.path.keyframes:
        raise StreamStudioError("the path has no keyframes to save")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return str(write_path_file(session.path, folder / "camera_path.json", int(view.width), int(view.height), fps))


def load_path(session: SplatSession, file: str | Path) -> str:
    """Read a camera path (nerfstudio camera_path.json, SuperSplat's animation) as the session's keyframes."""
    path = read_path_file(file, prefer="keyframes")
    path.check()
    session.path = path
    return path_info(session)


def _times_for(scene: GaussianScene, frames: int) -> list[float | None]:
    """A 4D scene plays its whole time range over the fly-through."""
    if not scene.is_4d:
        return [None] * frames
    lo, hi = scene.time_range
    return [lo + (hi - lo) * i / max(frames - 1, 1) for i in range(frames)]


def _run_pipe(pipe, frame: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        out = pipe(frame)  # live mode: the latest output
    return out[0] if isinstance(out, list) else out


def default_pipe_factory(width: int, height: int) -> Callable[[], object]:
    """An img2img stream of its own (sd-turbo with a CUDA GPU, else the built-in model), when the app gives none."""

    def make():
        with torch.inference_mode():  # the stream opened as the CLI's are: a request with the pipeline's defaults
            return build_pipeline(request(width=max(64, multiple_of_8(width)), height=max(64, multiple_of_8(height)),
                                          steps=1, strength=0.5), "img2img")

    return make


# ----------------------------------------------------------------------------- the UI

def uploaded_path(upload) -> str | None:
    """The path of a file a client uploaded through Gradio, checked to lie in Gradio's upload
    folder: a request that names any other server file is refused, whatever Gradio let through."""
    if not upload:
        return None
    from gradio.utils import get_upload_folder

    path = Path(upload if isinstance(upload, str) else getattr(upload, "name", str(upload))).resolve()
    if not path.is_relative_to(Path(get_upload_folder()).resolve()):
        raise StreamStudioError("that file was not uploaded here; upload the scene again")
    if not path.is_file():
        raise StreamStudioError("the upload is gone (uploads are kept a few minutes); upload the scene again")
    return str(path)


def build_splat_tab(get_image_pipeline: Callable[[], object] | None = None, slots=None) -> dict:
    """Fill the open `gr.Tab` with the Splats panel; returns its components by name. `slots` (the
    server's SessionManager) counts a Stylize stream against --max-streams with the other tabs'."""
    import gradio as gr

    v = ViewSettings()
    state = gr.State(None)  # a SplatSession, made on the first load
    _enter_releases_sliders()
    with gr.Row():
        with gr.Column(scale=1, elem_id="splat-controls"):
            sample = gr.Dropdown(list(SAMPLES), value=list(SAMPLES)[0], label="Sample scene")
            upload = gr.File(label="…or upload a .ply / .splat / .spz / .sog", elem_id="splat-upload",
                             file_types=[".ply", ".splat", ".spz", ".sog"], type="filepath")
            spz_axes = gr.Radio([("RUB (spz's own)", "rub"), ("RDF (splat-transform)", "rdf")], value="rub",
                                label="Axes of a .spz (upside down? try the other)", elem_id="splat-spz-axes")
            load_btn = gr.Button("Load", variant="primary")
            scene_info = gr.Markdown("No scene loaded.")
            # the splat table's controls (pipelines/live_settings.SPLAT_SETTINGS): ranges, steps, labels
            azimuth, elevation, zoom, pan_x, pan_y = (view_control(name, v) for name in
                                                      ("azimuth", "elevation", "zoom", "pan_x", "pan_y"))
            with gr.Row():
                width, height = view_control("width", v), view_control("height", v)
            sh_degree = view_control("sh_degree", v)
            background = gr.ColorPicker(v.background, label=SPLAT_SETTINGS["background"].label)
            mode = view_control("mode", v)
            camera = view_control("camera", v)
            t_slider = gr.Slider(0, 1, v.time, step=0.01, label="Time (4D scenes)")
            play_btn = gr.Button("▶ Play")
        with gr.Column(scale=2):
            with gr.Row():
                view_img = gr.Image(label="Splat view (click to orbit)", type="numpy", interactive=False,
                                    elem_id="splat-view", elem_classes=["scaled-up"])
                styled_img = gr.Image(label="Stylized", type="numpy", interactive=False, elem_id="splat-styled",
                                      elem_classes=["scaled-up"])
            stats = gr.Markdown("")
            with gr.Row():
                prompt = gr.Textbox("a watercolour painting, soft light", label="Stylize prompt", scale=3)
                # the image table's strength: its range is the one the pipeline checks
                strength = widget(SETTINGS["strength"], SETTINGS["strength"].default, label="Strength", scale=1)
            with gr.Row():
                path = gr.Dropdown(list(TAB_PATHS), value="fly", label="Fly-through path")
                frames = gr.Number(48, precision=0, label="Frames")
                stylize_btn = gr.Button("Stylize", variant="primary")
                stop_btn = gr.Button("Stop")
            with gr.Accordion("Camera path: author a fly-through (nerfstudio camera_path.json)", open=False):
                path_md = gr.Markdown(path_info(SplatSession()))
                with gr.Row():
                    gap = gr.Number(2.0, label="Seconds after the last keyframe")
                    loop = gr.Checkbox(False, label="Loop")
                    add_btn = gr.Button("Add keyframe")
                    clear_btn = gr.Button("Clear keyframes")
                with gr.Row():
                    preview_btn = gr.Button("▶ Preview path")
                    save_btn = gr.Button("Save path")
                    path_out = gr.File(label="Saved camera_path.json", interactive=False)
                    path_in = gr.File(label="Load a path (nerfstudio .json, SuperSplat .json / .ssproj)",
                                      file_types=[".json", ".ssproj"], type="filepath")

    sliders = [azimuth, elevation, zoom, pan_x, pan_y, width, height, sh_degree, background, mode, t_slider, camera]

    def view_of(*vals) -> ViewSettings:
        azimuth_, elevation_, zoom_, pan_x_, pan_y_, width_, height_, sh_, background_, mode_, t_, camera_ = vals
        return ViewSettings(azimuth_, elevation_, zoom_, pan_x_, pan_y_, width_, height_, sh_, background_,
                            mode_.lower(), t_, camera_.lower())

    def on_load(session, up, smp, axes, *vals):
        session, info = load_into(session or SplatSession(), uploaded_path(up), smp, axes)
        lo, hi, step = time_slider_range(*session.scene.time_range)
        view = view_of(*vals)
        view.time = lo
        t_range = gr.update(minimum=lo, maximum=hi, step=step, value=lo, interactive=session.scene.is_4d)
        note = renderer_build_note(view.render_config())
        if note:  # the first Load of the process builds the renderer: say so first, then build it
            session.loading = True
            try:
                yield session, info, gr.update(), f"⏳ {note}", t_range
                warm_renderer(view.render_config())
            finally:
                session.loading = False
        frame, line = render_view(session, view)  # times the frame alone
        yield session, info, frame, line, t_range

    def on_change(session, *vals):
        if session is None or session.scene is None:
            return gr.update(), "Load a scene to see it."
        return render_view(session, view_of(*vals))

    def on_click(session, az, el, zm, px, py, w, h, sh, bg, md, t, cm, evt):
        if session is None or session.scene is None:
            raise StreamStudioError("load a scene first")
        x, y = evt.index
        view = click_orbit(view_of(az, el, zm, px, py, w, h, sh, bg, md, t, cm), float(x), float(y))
        frame, line = render_view(session, view)
        return frame, line, view.azimuth, view.elevation

    on_click.__annotations__["evt"] = gr.SelectData  # the module's annotations are strings

    def on_play(session, *vals):
        session = session or SplatSession()
        for frame, line, t in play(session, view_of(*vals)):
            yield frame, line, t

    def on_stylize(session, pth, n, text, st, *vals):
        why = stylize_blocker(session)
        if why:  # pressed before Load finished: say what to do, no error
            gr.Warning(why)
            yield gr.update(), gr.update(), f"⚠️ {why}"
            return
        view = view_of(*vals)
        make = get_image_pipeline or default_pipe_factory(view.width, view.height)
        for frame, styled, line in stylize(session, view, pth, int(n), text, st, make, slots):
            yield frame, styled, line

    def on_add(session, gp, lp, *vals):
        if session is None or session.scene is None:
            raise StreamStudioError("load a scene first")
        add_keyframe(session, view_of(*vals), float(gp or 2.0))
        session.path.loop = bool(lp)
        return session, path_info(session)

    def on_clear(session):
        if session is None:
            return session, path_info(SplatSession())
        return session, clear_keyframes(session)

    def on_loop(session, lp):
        if session is not None and session.path is not None:
            session.path.loop = bool(lp)
            return path_info(session)
        return gr.update()

    def on_preview(session, *vals):
        session = session or SplatSession()
        for frame, line in preview_path(session, view_of(*vals)):
            yield frame, line

    def on_save(session, *vals):
        session = session or SplatSession()
        return save_path(session, view_of(*vals), tempfile.mkdtemp(prefix="streamstudio-path-"))

    def on_path_upload(session, up):
        if not up:
            return session, gr.update(), gr.update()
        session = session or SplatSession()
        info = load_path(session, uploaded_path(up))
        return session, info, session.path.loop

    def on_stop(session):
        if session is not None:
            session.stop_requested = True
        return session

    # A bad file shows one message, its toast (naming the file, not the server's temp path), not an
    # "Error" pill over each output as well; the scene loaded before stays loaded and in view.
    load_btn.click(_guard(on_load), [state, upload, sample, spz_axes, *sliders],
                   [state, scene_info, view_img, stats, t_slider], show_progress="hidden")
    for comp in sliders:
        event = comp.release if isinstance(comp, gr.Slider) else comp.change
        event(_guard(on_change), [state, *sliders], [view_img, stats])
    view_img.select(_guard(on_click), [state, *sliders], [view_img, stats, azimuth, elevation])
    play_btn.click(_guard(on_play), [state, *sliders], [view_img, stats, t_slider])
    stylize_btn.click(_guard(on_stylize), [state, path, frames, prompt, strength, *sliders],
                      [view_img, styled_img, stats])
    stop_btn.click(on_stop, [state], [state])
    add_btn.click(_guard(on_add), [state, gap, loop, *sliders], [state, path_md])
    clear_btn.click(_guard(on_clear), [state], [state, path_md])
    loop.change(_guard(on_loop), [state, loop], [path_md])
    preview_btn.click(_guard(on_preview), [state, *sliders], [view_img, stats])
    save_btn.click(_guard(on_save), [state, *sliders], [path_out])
    path_in.upload(_guard(on_path_upload), [state, path_in], [state, path_md, loop])
    return {"state": state, "view": view_img, "styled": styled_img, "stats": stats, "load": load_btn,
            "stylize": stylize_btn, "play": play_btn, "time": t_slider, "add_keyframe": add_btn,
            "preview_path": preview_btn, "save_path": save_btn, "load_path": path_in}


def view_control(name: str, view: ViewSettings):
    """The Gradio control of the splat table's setting `name`, showing `view`'s value."""
    return widget(SPLAT_SETTINGS[name], getattr(view, name))


# Pressing Enter in a slider's number box: Gradio 5's slider fires `release` (what re-renders)
# on the box's blur only, and nothing on Enter; so Enter blurs the box.
ENTER_RELEASES_JS = """() => {
  if (window.__splatEnter) return;
  window.__splatEnter = true;
  document.addEventListener('keydown', (e) => {
    const box = e.target;
    if (e.key === 'Enter' && box instanceof HTMLInputElement && box.type === 'number'
        && box.closest('#splat-controls')) box.blur();
  }, true);
}"""


def _enter_releases_sliders() -> None:
    """Install ENTER_RELEASES_JS when the page loads (on the app the tab is built in)."""
    from gradio.context import get_blocks_context

    blocks = get_blocks_context()
    root = getattr(blocks, "root_block", None) if blocks is not None else None
    if root is not None:
        root.load(None, None, None, js=ENTER_RELEASES_JS)


def _guard(fn):
    """User errors become a Gradio error message in this session; the app keeps serving."""
    import gradio as gr

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except StreamStudioError as exc:
                raise gr.Error(str(exc), print_exception=False) from exc
        return gen

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except StreamStudioError as exc:
            raise gr.Error(str(exc), print_exception=False) from exc
    return call
