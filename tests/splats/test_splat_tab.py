"""The Splats tab's callbacks, without a browser."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from streamstudio.app.web import splat_tab
from streamstudio.app.web.splat_tab import (SplatSession, ViewSettings, click_orbit, load_into, play,
                                        play_times, render_view, stylize)
from streamstudio.errors import StreamStudioError


SMALL = dict(width=48, height=32)


@pytest.fixture(scope="module")
def static_session():
    return load_into(SplatSession(), None, "Sample scene")[0]


@pytest.fixture(scope="module")
def dynamic_session():
    return load_into(SplatSession(), None, "4D sample (orbiting moons)")[0]


def test_load_reports_counts_and_rejects_nothing(static_session, tmp_path):
    _, info = load_into(SplatSession(), None, "Sample scene")
    assert f"{len(static_session.scene):,} Gaussians" in info and "3D" in info
    with pytest.raises(StreamStudioError):
        load_into(SplatSession(), None, None)
    bad = tmp_path / "x.splat"
    bad.write_bytes(b"123")
    with pytest.raises(StreamStudioError, match="multiple of 32"):
        load_into(SplatSession(), str(bad), None)


def test_a_bad_upload_is_named_by_its_file_name_not_the_server_path(tmp_path):
    """Gradio keeps an upload as <temp folder>/<hash>/<the user's file name>: the message names
    the file, never the server's folder."""
    folder = tmp_path / "gradio" / "0123abcd"
    folder.mkdir(parents=True)
    bad = folder / "my scene.ply"
    bad.write_text("not a ply")
    with pytest.raises(StreamStudioError) as err:
        load_into(SplatSession(), str(bad), None)
    assert "my scene.ply" in str(err.value) and str(tmp_path) not in str(err.value), err.value


def test_time_slider_range_is_rounded():
    from streamstudio.app.web.splat_tab import time_slider_range

    assert time_slider_range(0.0007824897766113281, 0.9997) == (0.0, 1.0, 0.01)  # the 4D sample's range
    assert time_slider_range(0.3, 0.7) == (0.3, 0.7, 0.01)
    assert time_slider_range(-3.3, 170.2) == (-4.0, 171.0, 1.0)
    assert time_slider_range(0.0, 0.0) == (0.0, 1.0, 0.01)  # a 3D scene: no span


def test_render_view_modes_background_and_stats(static_session):
    rgb, info = render_view(static_session, ViewSettings(**SMALL, background="#00ff00"))
    assert rgb.shape == (32, 48, 3) and rgb.dtype == np.uint8
    assert "fps" in info and "Gaussians" in info
    assert tuple(rgb[0, 0]) == (0, 255, 0)  # the background shows in the corner
    alpha, _ = render_view(static_session, ViewSettings(**SMALL, mode="alpha"))
    depth, _ = render_view(static_session, ViewSettings(**SMALL, mode="depth"))
    assert (alpha[..., 0] == alpha[..., 1]).all() and alpha.max() > 200 and alpha[0, 0, 0] == 0
    assert not np.array_equal(alpha, depth)
    zoomed, _ = render_view(static_session, ViewSettings(**SMALL, zoom=3.0))
    assert (zoomed > 0).mean() > (alpha > 0).mean()  # closer: the scene fills more of the frame


def test_render_needs_a_scene():
    with pytest.raises(StreamStudioError, match="load a scene"):
        render_view(SplatSession(), ViewSettings(**SMALL))


def test_click_orbits_towards_the_click():
    view = click_orbit(ViewSettings(azimuth=0, elevation=0, **SMALL), 48, 16)
    assert view.azimuth == -90 and view.elevation == 0
    view = click_orbit(ViewSettings(azimuth=0, elevation=0, **SMALL), 24, 0)
    assert view.azimuth == 0 and view.elevation == -89  # clamped


def test_play_steps_through_time(dynamic_session, static_session):
    lo, hi = dynamic_session.scene.time_range
    times = play_times(dynamic_session, lo, 5)
    assert times[0] == lo and abs(times[-1] - hi) < 1e-9 and len(times) == 5
    frames = list(play(dynamic_session, ViewSettings(**SMALL, time=lo), steps=2))
    assert len(frames) == 2 and not np.array_equal(frames[0][0], frames[1][0])
    with pytest.raises(StreamStudioError, match="4D"):
        play_times(static_session, 0.0)


class FakePipe:
    def __init__(self):
        self.frames, self.prompts = [], []

    def set_prompt(self, prompt):
        self.prompts.append(prompt)

    def update(self, **changes):
        self.changes = changes

    def __call__(self, frame):
        self.frames.append(frame)
        return 255 - frame


def test_stylize_streams_render_and_stylised_side_by_side(static_session):
    pipe = FakePipe()
    out = list(stylize(static_session, ViewSettings(**SMALL), "orbit", 3, "ink", 0.6, lambda: pipe))
    assert len(out) == 3 and len(pipe.frames) == 3 and pipe.prompts == ["ink"] and pipe.changes == {"strength": 0.6}
    for frame, styled, info in out:
        assert np.array_equal(styled, 255 - frame) and "frame" in info
    assert not np.array_equal(out[0][0], out[1][0])  # the camera moves


def test_stylize_takes_one_of_the_servers_stream_slots_while_it_runs(static_session):
    from streamstudio.app.web.sessions import BusyError, SessionManager

    manager = SessionManager(model=None, max_streams=1)  # (no Live-tab session is opened here)
    try:
        gen = stylize(static_session, ViewSettings(**SMALL), "orbit", 3, "", 0.5, FakePipe, manager)
        next(gen)
        assert len(manager) == 1 and not manager.has_capacity()
        with pytest.raises(BusyError, match="busy"):  # a Video-tab stream, say, must wait
            manager.take_slot("video-1-t2v", "Video tab")
        assert len(list(gen)) == 2 and len(manager) == 0  # done: freed
        manager.take_slot("video-1-t2v", "Video tab")
        with pytest.raises(BusyError, match="busy"):
            next(stylize(static_session, ViewSettings(**SMALL), "orbit", 3, "", 0.5, FakePipe, manager))
        manager.free_slot("video-1-t2v")
        stopped = stylize(static_session, ViewSettings(**SMALL), "orbit", 3, "", 0.5, FakePipe, manager)
        next(stopped)
        stopped.close()  # the page went away mid-stream
        assert len(manager) == 0
    finally:
        manager.shutdown()


def test_stylize_stops_when_asked(static_session):
    session = SplatSession(scene=static_session.scene, fit=static_session.fit, pipe=FakePipe())
    gen = stylize(session, ViewSettings(**SMALL), "fly", 5, "", 0.5, lambda: None)
    next(gen)
    session.stop_requested = True
    assert list(gen) == []


def test_tab_builds_inside_blocks():
    gr = pytest.importorskip("gradio")
    with gr.Blocks():
        with gr.Tab("Splats"):
            parts = splat_tab.build_splat_tab(get_image_pipeline=lambda: FakePipe())
    assert {"view", "styled", "stylize", "time"} <= set(parts)


def test_tab_makes_enter_in_a_slider_box_re_render():
    """Gradio 5's slider fires `release` (which re-renders) when its number box loses focus, not
    on Enter: the tab installs, on page load, a handler that blurs the box on Enter."""
    gr = pytest.importorskip("gradio")
    with gr.Blocks() as demo:
        with gr.Tab("Splats"):
            splat_tab.build_splat_tab(get_image_pipeline=lambda: FakePipe())
    loads = [d for d in demo.config["dependencies"] if d.get("js") == splat_tab.ENTER_RELEASES_JS]
    assert len(loads) == 1 and loads[0]["targets"][0][1] == "load"
    assert "release" in {t[1] for d in demo.config["dependencies"] for t in d["targets"]}


@pytest.mark.slow  # loads diffusers and the tiny demo model
def test_stylize_with_the_real_image_pipeline(static_session):
    from streamstudio.app.web.splat_tab import default_pipe_factory

    session = SplatSession(scene=static_session.scene, fit=static_session.fit)
    out = list(stylize(session, ViewSettings(width=64, height=64), "fly", 2, "ink", 0.6, default_pipe_factory(64, 64)))
    assert len(out) == 2
    frame, styled, _ = out[-1]
    assert styled.shape == (64, 64, 3) and styled.dtype == np.uint8 and not np.array_equal(frame, styled)


def test_keyframes_from_the_view_preview_save_load_and_stylize(static_session, tmp_path):
    import json

    from streamstudio.app.web.splat_tab import (add_keyframe, clear_keyframes, load_path, path_info, preview_path,
                                            save_path)

    session = SplatSession(scene=static_session.scene, fit=static_session.fit)
    assert "No keyframes" in path_info(session)
    with pytest.raises(StreamStudioError, match="no keyframes"):
        list(preview_path(session, ViewSettings(**SMALL)))
    add_keyframe(session, ViewSettings(azimuth=0, **SMALL), 1.0)
    info = add_keyframe(session, ViewSettings(azimuth=90, zoom=1.5, **SMALL), 1.0)
    assert "2 keyframes" in info and "1.0 s" in info
    frames = list(preview_path(session, ViewSettings(**SMALL), fps=4.0))
    assert len(frames) == 4 and frames[0][0].shape == (32, 48, 3)
    first, _ = render_view(session, ViewSettings(azimuth=0, **SMALL))  # the first keyframe is that view
    assert np.array_equal(frames[0][0], first)
    saved = save_path(session, ViewSettings(**SMALL), tmp_path, fps=10.0)
    doc = json.loads(open(saved).read())
    assert len(doc["keyframes"]) == 2 and len(doc["camera_path"]) == 10 and doc["render_width"] == 48
    clear_keyframes(session)
    assert session.path is None
    assert "2 keyframes" in load_path(session, saved)
    pipe = FakePipe()
    out = list(stylize(session, ViewSettings(**SMALL), "keyframes", 3, "", 0.5, lambda: pipe))
    assert len(out) == 3 and np.array_equal(out[0][0], first) and not np.array_equal(out[0][0], out[-1][0])


def test_keyframes_of_a_4d_scene_keep_their_time(dynamic_session, tmp_path):
    from streamstudio.app.web.splat_tab import add_keyframe, path_cameras

    session = SplatSession(scene=dynamic_session.scene, fit=dynamic_session.fit)
    lo, hi = session.scene.time_range
    add_keyframe(session, ViewSettings(time=lo, **SMALL), 1.0)
    add_keyframe(session, ViewSettings(time=hi, **SMALL), 1.0)
    _, times = path_cameras(session, ViewSettings(**SMALL).render_config("cpu"), fps=4.0)
    assert times[0] == pytest.approx(lo) and times[2] == pytest.approx((lo + hi) / 2, abs=0.05 * (hi - lo))


# ----------------------------------------------------------------------------- the tab's handlers, as Gradio calls them

def tab_handler(event_name: str, button: str):
    """(the function the built tab runs on `button`'s `event_name`, its input values as the page
    starts them, with Width x Height set to 48x32): the handler Gradio calls, without a browser."""
    gr = pytest.importorskip("gradio")
    with gr.Blocks() as demo:
        with gr.Tab("Splats"):
            parts = splat_tab.build_splat_tab(get_image_pipeline=lambda: FakePipe())
    target = parts[button]._id
    fn = next(f for f in demo.fns.values() if (target, event_name) in f.targets)
    small = {"Width": 48, "Height": 32}
    values = [small.get(getattr(c, "label", None), getattr(c, "value", None)) for c in fn.inputs]
    return fn.fn, values


BUILD_S = 1.5  # the stand-in build's seconds


@pytest.fixture
def slow_first_cpp_build(monkeypatch):
    """The C++ renderer's first load() made slow (a stand-in for its ~44 s build) and then "not
    available" (the vectorised torch path renders), on a CPU device; no real build runs."""
    import torch

    from streamstudio.kernels import splat_cpu

    calls = []

    def load(verbose: bool = False):
        if not calls:
            time.sleep(BUILD_S)
        calls.append(time.perf_counter())
        return None

    monkeypatch.setattr(splat_cpu, "load", load)
    monkeypatch.setattr(splat_cpu, "ready", lambda: bool(calls), raising=False)
    monkeypatch.setattr(splat_tab, "pick_device", lambda *a, **k: torch.device("cpu"))
    return calls


def frame_ms(line: str) -> float:
    return float(re.search(r"\((\d+) ms\)", line).group(1))


def test_the_renderers_build_is_not_counted_as_a_frame(static_session, slow_first_cpp_build):
    """The first render of a process builds the C++ renderer (about 44 s here): the fps line
    after it is the frame's render time, not build + render."""
    _, line = render_view(static_session, ViewSettings(**SMALL))
    assert slow_first_cpp_build, "the renderer was not asked for"
    assert frame_ms(line) < 1000 * BUILD_S / 2, line


def test_load_says_it_builds_the_renderer_then_shows_the_frames_own_time(slow_first_cpp_build):
    """Load, the first in the process: a status saying the C++ renderer is being built comes
    before the build starts; the fps line after it excludes the build."""
    on_load, values = tab_handler("click", "load")
    steps = on_load(*values)
    first = next(steps)  # (state, scene info, view, stats, time slider)
    assert not slow_first_cpp_build, "the build started before the status was shown"
    session, info, _, status, _ = first
    assert "Building the C++ splat renderer" in status and "once" in status
    assert "Loaded **sample_scene.ply**" in info and session.loading
    *_, last = steps
    session, _, frame, line, _ = last
    assert slow_first_cpp_build and not session.loading
    assert isinstance(frame, np.ndarray) and frame.shape == (32, 48, 3)
    assert "fps" in line and frame_ms(line) < 1000 * BUILD_S / 2, line
    # built: the next Load says nothing of a build and shows its frame at once
    assert len(list(on_load(session, *values[1:]))) == 1


def test_stylize_before_a_scene_is_loaded_says_what_to_do(monkeypatch):
    """Stylize pressed while Load still runs: no bare "Error", a warning and a status that say
    to load a scene (no scene in the state yet) or that it is still loading (the renderer builds)."""
    gr = pytest.importorskip("gradio")
    warned = []
    monkeypatch.setattr(gr, "Warning", lambda message, *a, **k: warned.append(message))
    on_stylize, values = tab_handler("click", "stylize")
    assert values[0] is None  # the state before the first Load has answered
    out = list(on_stylize(*values))  # raises nothing (a gr.Error is the red "Error")
    assert len(out) == 1 and "Load a scene first" in out[0][2] and warned[-1] in out[0][2]
    loading = SplatSession(loading=True)  # Load's first answer: the scene, the renderer still building
    out = list(on_stylize(loading, *values[1:]))
    assert "still loading" in out[0][2] and "still loading" in warned[-1]


def test_the_build_note_shows_only_while_the_cpp_renderer_may_build(monkeypatch):
    import dataclasses

    from streamstudio.app.web.splat_tab import BUILDING_CPP, renderer_build_note
    from streamstudio.kernels import splat_cpu

    cfg = ViewSettings(**SMALL).render_config("cpu")
    monkeypatch.setattr(splat_cpu, "_tried", False)  # as in a fresh process
    monkeypatch.delenv(splat_cpu.DISABLE_ENV, raising=False)
    assert not splat_cpu.ready() and renderer_build_note(cfg) == BUILDING_CPP
    assert renderer_build_note(dataclasses.replace(cfg, impl="fast")) is None  # nothing to build
    monkeypatch.setenv(splat_cpu.DISABLE_ENV, "1")  # switched off: load() answers at once
    assert splat_cpu.ready() and renderer_build_note(cfg) is None
    monkeypatch.delenv(splat_cpu.DISABLE_ENV)
    monkeypatch.setattr(splat_cpu, "_tried", True)  # loaded once in this process
    assert renderer_build_note(cfg) is None
