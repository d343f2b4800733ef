"""The web app's Video tab: streaming text-to-video with mid-stream prompt changes, and
video-to-video from the webcam, on the StreamDiT-style model (the built-in tiny one by default).

`build_video_tab()` fills an open `gr.Tab`. The callbacks are plain functions over a
`VideoSession` (one per browser session, kept in a `gr.State`) so they are tested without a UI.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator

import numpy as np
import torch

from streamstudio.app.commands.render_video import build_stream, load_video_model
from streamstudio.errors import StreamStudioError
from streamstudio.pipelines.stream_video import VideoStream

DEFAULT_PROMPT = "a red circle moving left"
DISPLAY_SIDE = 256
MAX_FRAMES = 2000


@lru_cache(maxsize=4)
def cached_model(model: str | None = None):
    """The model is loaded once per process and shared by sessions (it is only read)."""
    return load_video_model(model)


@dataclass
class VideoSession:
    model: str | None = None  # None = the built-in tiny model
    prompt: str = DEFAULT_PROMPT
    stop_requested: bool = False
    t2v: VideoStream | None = None
    v2v: VideoStream | None = None
    v2v_strength: float = 0.0
    last_frame: np.ndarray | None = None  # newest text-to-video frame
    cam_frame: np.ndarray | None = None  # newest video-to-video frame
    frames_made: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def stream(self, strength: float, seed: int) -> VideoStream:
        model, meta = cached_model(self.model)
        return build_stream(model, meta, self.prompt, strength=strength, seed=seed, width=DISPLAY_SIDE,
                            height=DISPLAY_SIDE)


def generate(session: VideoSession, prompt: str, seed: int = 0, max_frames: int = MAX_FRAMES
             ) -> Iterator[tuple[np.ndarray, str]]:
    """Text-to-video: yield (frame, status) as frames are made, until stopped or `max_frames`."""
    prompt = (prompt or "").strip()
    if not prompt:
        raise StreamStudioError("write a prompt first, e.g. 'a blue square moving up'")
    session.prompt, session.stop_requested = prompt, False
    session.t2v = session.stream(1.0, int(seed))
    session.frames_made = 0
    applied = prompt
    while not session.stop_requested and session.frames_made < max_frames:
        if session.prompt != applied:  # a prompt change made while streaming
            applied = session.prompt
            session.t2v.set_prompt(applied)
        with torch.inference_mode():
            chunk = session.t2v.push(None)
        for frame in chunk[: max_frames - session.frames_made]:
            session.frames_made += 1
            session.last_frame = frame
            yield frame, f"frame {session.frames_made} · {applied}"


def change_prompt(session: VideoSession, prompt: str) -> str:
    """Takes effect on the next chunk of a running stream (and on the webcam stream)."""
    prompt = (prompt or "").strip()
    if not prompt:
        return "prompt unchanged (empty)"
    session.prompt = prompt
    if session.v2v is not None:
        session.v2v.set_prompt(prompt)
    return f"prompt: {prompt}"


def stop(session: VideoSession) -> str:
    session.stop_requested = True
    return f"stopped after {session.frames_made} frames"


def webcam_frame(session: VideoSession, frame: np.ndarray | None, prompt: str, strength: float,
                 seed: int = 0) -> np.ndarray | None:
    """Video-to-video: one webcam frame in, the newest finished frame out (None until the buffer
    has filled). A new strength restarts the stream."""
    if frame is None:
        return session.cam_frame
    if prompt and prompt.strip() and prompt.strip() != session.prompt:
        change_prompt(session, prompt)
    with session.lock:
        if session.v2v is None or abs(session.v2v_strength - strength) > 1e-6:
            session.v2v = session.stream(float(strength), int(seed))
            session.v2v_strength, session.cam_frame = strength, None
        frame = np.ascontiguousarray(frame[..., :3]).astype(np.uint8, copy=False)
        with torch.inference_mode():
            out = session.v2v.push(frame)
    if out:
        session.cam_frame = out[-1]
    return session.cam_frame


def build_video_tab() -> None:
    """The Video tab's components and events, inside an open `gr.Tab`."""
    import gradio as gr

    from streamstudio.app.settings import widget
    from streamstudio.pipelines.live_settings import SETTINGS

    state = gr.State(lambda: VideoSession())
    gr.Markdown("Streaming video diffusion (StreamDiT-style buffer). The built-in model is tiny (32x32 pixels, "
                "trained on CPU on moving coloured shapes): try *a blue square moving up*, then change the colour "
                "while it plays.")
    with gr.Row():
        with gr.Column():
            prompt = widget(SETTINGS["prompt"], DEFAULT_PROMPT, label="Prompt (press Enter to change it mid-stream)",
                            lines=1, elem_id=None)
            seed = widget(SETTINGS["seed"], 0)
            with gr.Row():
                start_btn = gr.Button("Generate", variant="primary")
                stop_btn = gr.Button("Stop")
            status = gr.Textbox(label="Status", interactive=False)
        with gr.Column():
            video = gr.Image(label="Stream", height=DISPLAY_SIDE, width=DISPLAY_SIDE, format="png")
    with gr.Accordion("Video-to-video from the webcam", open=False):
        strength = gr.Slider(0.1, 1.0, value=0.6, step=0.05, label="Strength")
        with gr.Row():
            cam = gr.Image(sources=["webcam"], streaming=True, label="Webcam", type="numpy")
            cam_out = gr.Image(label="Output", height=DISPLAY_SIDE, width=DISPLAY_SIDE)

    def _generate(session, text, seed_value):
        try:
            yield from generate(session, text, int(seed_value or 0))
        except StreamStudioError as exc:
            raise gr.Error(str(exc), print_exception=False) from exc

    start_btn.click(_generate, [state, prompt, seed], [video, status])
    prompt.submit(change_prompt, [state, prompt], status)
    stop_btn.click(stop, state, status)
    cam.stream(lambda s, f, p, st: webcam_frame(s, f, p, st), [state, cam, prompt, strength], cam_out,
               stream_every=0.1, concurrency_limit=4)
