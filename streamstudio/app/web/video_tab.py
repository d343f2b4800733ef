"""The web app's Video tab: streaming text-to-video with mid-stream prompt changes, and
video-to-video from the webcam, on the StreamDiT-style model (the built-in tiny one by default).

Each of the tab's streams is a `streaming.Runner` over a `PushSource`, as a web session of the
image model is: the webcam's frames are handed in (the newest replaces one still waiting) and the
newest output comes back at once; text to video hands in one request at a time and gets each
frame in order. Their frames run in the loaded model's `ModelGuard` frame context and prompt
changes, applied between frames, in its text context. `build_video_tab()` fills an open `gr.Tab`.
The callbacks are plain functions over a `VideoSession` (one per browser session, kept in a
`gr.State`) so they are tested without a UI.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from streamstudio.app.streams.video import VideoFrames, build_stream, load_video_model
from streamstudio.app.web.model_guard import ModelGuard
from streamstudio.errors import StreamStudioError
from streamstudio.streaming.runner import Runner, RunnerConfig
from streamstudio.streaming.sinks import NullSink
from streamstudio.streaming.sources import DEFAULT_FPS, PushSource
from streamstudio.app.settings import video_controls, video_values, widget
from streamstudio.models.video.causal_checkpoint import BUILTIN_CAUSAL, is_causal_folder
from streamstudio.models.video.stream_dit import BUILTIN_CHECKPOINT, read_checkpoint_config
from streamstudio.pipelines.live_settings import SETTINGS, VIDEO_SETTINGS

if TYPE_CHECKING:
    from streamstudio.app.web.sessions import SessionManager
    from streamstudio.models.video.causal_checkpoint import CausalModel
    from streamstudio.models.video.stream_dit import StreamDiT
    from streamstudio.models.video.wan import WanModel

DEFAULT_PROMPT = "a red circle moving left"
DISPLAY_SIDE = 256
MAX_FRAMES = 2000


@dataclass(frozen=True)
class VideoModel:
    """A loaded video model, shared by every session's streams (only read), and its one guard."""

    model: StreamDiT | WanModel | CausalModel
    meta: dict
    guard: ModelGuard = field(default_factory=ModelGuard, compare=False)


@lru_cache(maxsize=4)
def cached_model(model: str | None = None) -> VideoModel:
    """The model is loaded once per process and shared by sessions."""
    return VideoModel(*load_video_model(model))


def builtin_solver() -> str:
    """The built-in model's solver (its checkpoint's `sampling.solver`): the tab's Step at start."""
    return read_checkpoint_config(BUILTIN_CHECKPOINT)["sampling"].get("solver", "euler")


class GuardedFrames(VideoFrames):
    """A tab stream's processor (`processor(frame)`, one output per input): `VideoFrames` with its
    network calls in the model guard's frame context. Text to video (`text`): the handed-in frame
    only asks for the next frame. Video to video: the newest finished frame, black until the
    buffer has filled (`finished` counts the frames made)."""

    def __init__(self, stream, guard: ModelGuard, text: bool):
        super().__init__(stream)
        self.guard, self.text = guard, text
        self.finished = 0
        self._last: np.ndarray | None = None

    def push(self, frame: np.ndarray | None) -> list[np.ndarray]:
        with self.guard.frame():
            out = super().push(frame)
        self.finished += len(out)
        return out

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        out = self.push(None if self.text else frame)
        if out:
            self._last = out[-1]
        if self._last is None:
            size = self.stream.out_size
            assert size is not None  # (build_stream gives every stream its output size)
            height, width = size
            return np.zeros((height, width, 3), np.uint8)
        return self._last

    def set_prompt(self, prompt: str) -> None:
        with self.guard.text():
            self.stream.set_prompt(prompt)


class TabStream:
    """One stream of the tab: a Runner over a `PushSource` (`submit`) with the stream's
    `GuardedFrames`, the session's prompt (`prompt()`) applied between frames when it changed,
    and the newest output kept by its view (`latest()`, `wait(count)`)."""

    def __init__(self, vm: VideoModel, prompt: Callable[[], str], *, settings: dict, seed: int, text: bool):
        self.prompt, self.applied = prompt, prompt()
        stream = build_stream(vm.model, vm.meta, self.applied, **settings, seed=seed, width=DISPLAY_SIDE,
                              height=DISPLAY_SIDE)
        self.frames = GuardedFrames(stream, vm.guard, text)
        self._tick = np.zeros((DISPLAY_SIDE, DISPLAY_SIDE, 3), np.uint8)  # text to video: "the next frame"
        self._source = PushSource(DISPLAY_SIDE, DISPLAY_SIDE, maxsize=1, description="the Video tab")
        self._view = NullSink("the page's view", DISPLAY_SIDE, DISPLAY_SIDE, DEFAULT_FPS)
        self._outputs = 0
        self._made = threading.Condition()
        self.on_close: Callable[[], None] | None = None  # once, at close (the session's slot freed)
        self.runner = Runner(self._source, self.frames, self._view, RunnerConfig(live=True, queue_size=1),
                             on_input=self._between_frames, on_output=self._output).start()

    def submit(self, frame: np.ndarray | None = None) -> None:
        """Hand in a webcam frame (RGB uint8), or ask a text-to-video stream for its next frame
        (nothing once the stream was closed)."""
        try:
            self._source.put(self._tick if frame is None else frame)
        except StreamStudioError:
            if self.running:  # (closed meanwhile: the frame is not wanted)
                raise

    def wait(self, count: int, timeout: float | None = None) -> bool:
        """Wait until `count` outputs have come out in all; False when the stream stopped first
        (or `timeout` s passed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._made:
            while self._outputs < count and not self.runner.stopped:  # (a failure stops it unannounced)
                left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
                if left <= 0:
                    break
                self._made.wait(left)
            return self._outputs >= count

    @property
    def solver(self) -> str:
        """How the stream moves a frame one level (euler, ab2, heun)."""
        buffer = getattr(self.frames.stream.cfg, "buffer", None)  # (a causal stream has no buffer levels)
        return buffer.solver if buffer is not None else "euler"

    def latest(self) -> np.ndarray | None:
        """The newest finished frame (None until the stream's buffer has filled)."""
        return self._view.last if self.frames.finished else None

    @property
    def running(self) -> bool:
        return not self.runner.stopped

    def close(self) -> None:
        self._source.close()
        self.runner.stop(interrupted=False)
        with self._made:
            self._made.notify_all()
        done, self.on_close = self.on_close, None
        if done is not None:
            done()

    def _between_frames(self, pts: float) -> None:  # the runner's processing thread
        prompt = self.prompt()
        if prompt != self.applied:  # a prompt change made while streaming: from the next chunk on
            self.frames.set_prompt(prompt)
            self.applied = prompt

    def _output(self, frame: np.ndarray, pts: float) -> None:  # the runner's output thread
        with self._made:
            self._outputs += 1
            self._made.notify_all()


@dataclass
class VideoSession:
    model: str | None = None  # None = the built-in tiny model
    prompt: str = DEFAULT_PROMPT
    t2v: TabStream | None = None
    v2v: TabStream | None = None
    v2v_settings: dict | None = None  # the video table's settings the webcam stream was made with
    frames_made: int = 0
    slots: SessionManager | None = None  # the server's sessions: each stream takes one of --max-streams

    def stream(self, settings: dict, seed: int, text: bool) -> TabStream:
        """A new stream with the video table's `settings` ({"strength": 0.6}) (the caller closed the
        one it replaces); BusyError when the server is full."""
        key = f"video-{id(self):x}-{'t2v' if text else 'v2v'}"
        if self.slots is not None:
            self.slots.take_slot(key, "Video tab")
        try:
            stream = TabStream(cached_model(self.model), lambda: self.prompt, settings=settings, seed=seed, text=text)
        except BaseException:
            if self.slots is not None:
                self.slots.free_slot(key)
            raise
        slots = self.slots
        if slots is not None:
            stream.on_close = lambda: slots.free_slot(key)
        return stream

    def close(self) -> None:
        """End the session's streams (the browser session is gone)."""
        for stream in (self.t2v, self.v2v):
            if stream is not None:
                stream.close()


def generate(session: VideoSession, prompt: str, seed: int = 0, max_frames: int = MAX_FRAMES,
             solver: str | None = None) -> Iterator[tuple[np.ndarray | None, str]]:
    """Text-to-video: yield (frame, status) as frames are made, until stopped or `max_frames`;
    `solver` (the tab's Step; None: the checkpoint's) is how a frame moves one level."""
    prompt = (prompt or "").strip()
    if not prompt:
        raise StreamStudioError("write a prompt first, e.g. 'a blue square moving up'")
    session.prompt = prompt
    if session.t2v is not None:
        session.t2v.close()
    session.t2v = t2v = session.stream({"strength": 1.0, "solver": solver}, int(seed), text=True)  # from pure noise
    session.frames_made = 0
    try:
        while session.frames_made < max_frames:
            t2v.submit()
            if not t2v.wait(session.frames_made + 1):
                break  # stopped (Stop, or a failure: raised below)
            session.frames_made += 1
            yield t2v.latest(), f"frame {session.frames_made} · {t2v.applied} · {t2v.solver} step"
        if t2v.runner.error is not None:
            raise t2v.runner.error
    finally:
        t2v.close()


def change_prompt(session: VideoSession, prompt: str) -> str:
    """Takes effect on the next chunk of a running stream (and on the webcam stream)."""
    prompt = (prompt or "").strip()
    if not prompt:
        return "prompt unchanged (empty)"
    session.prompt = prompt
    return f"prompt: {prompt}"


def stop(session: VideoSession) -> str:
    if session.t2v is not None:
        session.t2v.close()
    return f"stopped after {session.frames_made} frames"


def webcam_frame(session: VideoSession, frame: np.ndarray | None, prompt: str, settings: dict,
                 seed: int = 0) -> np.ndarray | None:
    """Video-to-video: hand in one webcam frame, get the newest finished frame back at once (None
    until the buffer has filled). `settings`: the Video tab's controls of the video table
    ({"strength": 0.6, "solver": "euler"}); a change restarts the stream."""
    if prompt and prompt.strip() and prompt.strip() != session.prompt:
        change_prompt(session, prompt)
    if frame is not None:
        if session.v2v is None or not session.v2v.running or session.v2v_settings != settings:
            if session.v2v is not None:
                session.v2v.close()
            session.v2v, session.v2v_settings = session.stream(dict(settings), int(seed), text=False), dict(settings)
        session.v2v.submit(np.ascontiguousarray(frame[..., :3]).astype(np.uint8, copy=False))
    return None if session.v2v is None else session.v2v.latest()


def model_choices(extra: str | None = None) -> list[tuple[str, str]]:
    """The Video tab's models (label, name): the built-in StreamDiT, the built-in causal model
    (when its checkpoint is installed) and `extra` (serve --video-model)."""
    choices = [("StreamDiT (built-in)", "builtin")]
    if is_causal_folder(BUILTIN_CAUSAL):
        choices.append(("Causal, KV cache (built-in)", "builtin-causal"))
    if extra and extra not in {name for _, name in choices}:
        choices.append((extra, extra))
    return choices


def choose_model(session: VideoSession, name: str) -> str:
    """Streams opened from now on use model `name` (the running ones stop)."""
    session.model = None if name == "builtin" else name
    for stream in (session.t2v, session.v2v):
        if stream is not None:
            stream.close()
    session.v2v = None
    return f"model: {name}"


def build_video_tab(slots=None, extra_model: str | None = None) -> None:
    """The Video tab's components and events, inside an open `gr.Tab`; `slots` (the server's
    SessionManager) counts its streams against --max-streams with the other tabs'; `extra_model`
    is offered beside the built-in models."""
    import gradio as gr

    # its threads end with the page
    state = gr.State(lambda: VideoSession(slots=slots), delete_callback=VideoSession.close)
    gr.Markdown("Streaming video diffusion (StreamDiT-style buffer). The built-in model is tiny (32x32 pixels, "
                "trained on CPU on moving coloured shapes): try *a blue square moving up*, then change the colour "
                "while it plays.")
    with gr.Row():
        with gr.Column():
            prompt = widget(SETTINGS["prompt"], DEFAULT_PROMPT, label="Prompt (press Enter to change it mid-stream)",
                            lines=1, elem_id=None)
            seed = widget(SETTINGS["seed"], 0)
            choices = model_choices(extra_model)
            model = gr.Radio(choices, value=choices[0][1], label="Model (the StreamDiT buffer, or a causal "
                             "model's chunks over its KV cache)", elem_id="video-model")
            step = video_controls(["solver"], {"solver": builtin_solver()})["solver"]  # both streams'
            with gr.Row():
                start_btn = gr.Button("Generate", variant="primary", elem_id="video-generate")
                stop_btn = gr.Button("Stop", elem_id="video-stop")
            status = gr.Textbox(label="Status", interactive=False, elem_id="video-status")
        with gr.Column():
            video = gr.Image(label="Stream", height=DISPLAY_SIDE, width=DISPLAY_SIDE, format="png")
    with gr.Accordion("Video-to-video from the webcam", open=False):
        controls = video_controls([n for n in VIDEO_SETTINGS if n != "solver"])  # Strength, and what is added there
        with gr.Row():
            cam = gr.Image(sources=["webcam"], streaming=True, label="Webcam", type="numpy")
            cam_out = gr.Image(label="Output", height=DISPLAY_SIDE, width=DISPLAY_SIDE)

    def _generate(session, text, seed_value, solver):
        try:
            yield from generate(session, text, int(seed_value or 0),
                                solver=video_values(["solver"], [solver])["solver"])
        except StreamStudioError as exc:
            raise gr.Error(str(exc), print_exception=False) from exc

    def _webcam(session, frame, text, solver, *values):
        try:
            return webcam_frame(session, frame, text, video_values(["solver", *controls], [solver, *values]))
        except StreamStudioError as exc:  # the server is full: said on the page, as the Live tab says it
            raise gr.Error(str(exc), print_exception=False) from exc

    model.change(choose_model, [state, model], status)
    start_btn.click(_generate, [state, prompt, seed, step], [video, status])
    prompt.submit(change_prompt, [state, prompt], status)
    stop_btn.click(stop, state, status)
    # Gradio's own cap is generous; the session manager's slots say "busy"
    limit = 2 * slots.max_streams + 2 if slots is not None else 4
    cam.stream(_webcam, [state, cam, prompt, step, *controls.values()], cam_out, stream_every=0.1,
               concurrency_limit=limit)
