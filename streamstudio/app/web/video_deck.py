"""Deck B on the video pipeline (issue 48, app/web/decks.py): an image stream's deck B may be the
StreamDiT video pipeline (`pipelines/video/stream_video.VideoStream`) or a causal model
(`pipelines/video/causal_video.CausalVideoStream`, issue 49), through app/streams/video.py's
`VideoFrames`, video-to-video, fed the stream's frames one by one: so a WebRTC or WHIP stream
plays either video pipeline after a switch to such a deck.

The video pipeline hands its frames out late and in chunks (the builtin model: nothing for its
buffer's first frames, then one per input; others: a chunk of c frames every c inputs).
`VideoDeckProcessor` keeps what it made in a queue and starts handing out one frame per input
only once the queue holds a whole chunk (it is `ready` then): from there a chunk comes in every
c inputs and c go out, so the queue never runs dry and every input gives exactly one output,
nothing dropped, nothing repeated, across the switch too. Until then deck A's frames are the
stream's (a switch asked for early waits for it).

After a switch the stream's model is a `VideoDeckModel`: the video model's name and the image
model's defaults for what the session reads, no add-ons, no batching. The stream takes its prompt
and fit from then on, and a causal model's strength (video-to-video's noise level, from its next
chunk); the image table's other settings are refused (said in the stream's notice).
Not yet: Wan checkpoints (text-to-video only here).

A stream may also play the video pipeline from its first frame: `serve --live-pipeline video`
makes the server's model a `VideoDeckModel` of `--video-model`, whose `processor` is a
`VideoLiveProcessor`: the stream's own video stream over the shared network, built at the
stream's size when its first frame comes (video-to-video; a txt2img stream is text-to-video),
black frames until the first chunk is out, then one frame per input as above.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

import numpy as np

from streamstudio.app.streams.requests import ImageRequest
from streamstudio.app.streams.video import (DEFAULT_STRENGTH, VideoFrames, build_stream, load_video_model,
                                           video_output_size)
from streamstudio.app.web.model_guard import ModelGuard
from streamstudio.device import pick_device
from streamstudio.errors import StreamStudioError
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig

if TYPE_CHECKING:
    import torch

    from streamstudio.app.web.sessions import StreamProcessor
    from streamstudio.models.image.batching import ClientStats

TAKES = ("prompt", "fit", "strength")  # the stream's settings a video deck takes (strength: causal models)


class VideoDeckModel:
    """A video deck's model as a session sees it (`session_model.SessionModel`): its name, the
    image model's config and prompts as the defaults the web app reads; no add-ons, no batching."""

    comps = None
    executor = None
    latency_probe = False
    is_demo = False

    def __init__(self, name: str, network, meta: dict, config: StreamDiffusionConfig, prompt: str):
        self.name, self.network, self.meta = name, network, meta
        self.config, self.prompt, self.negative_prompt = config, prompt, ""
        self.guard = ModelGuard()

    @property
    def size(self) -> tuple[int, int]:
        return self.config.width, self.config.height

    def stream_size(self, aspect: float | None) -> tuple[int, int]:
        return self.size

    def build(self, *args, **kwargs):
        raise StreamStudioError("this stream plays a video deck: the image pipeline is not built on it")

    def processor(self, mode: str, sid: str) -> VideoLiveProcessor:
        """The frame step of a stream that plays this model from its first frame."""
        return VideoLiveProcessor(self, mode, sid)

    def close(self) -> None:
        """(The video model is freed with its last stream.)"""

    def lora_listing(self) -> list[tuple[str, float]]:
        return []

    def set_lora_scales(self, scales: object) -> list[tuple[str, float]]:
        raise StreamStudioError("a video deck has no LoRA")

    def batching_stats(self) -> dict | None:
        return None


@dataclass
class VideoStats:
    """What the runner and the session read of a video deck's steps (no similarity filter)."""

    skipped: int = 0


class VideoPipe:
    """A video deck's `session_model.PipeView`: no frame skipped; its latency (input frames before
    its first output) once known."""

    def __init__(self, stream):
        self.stream, self.stats = stream, VideoStats()
        self.skip_rate = 0.0
        self.latency_frames: int | None = None


class VideoDeckProcessor:
    """Deck B's frame step on the video pipeline (see the module's docstring): `warm(frame)` gives
    its frame for the input, or None before it is ready; as a session's processor (after the
    switch), `processor(frame)`."""

    def __init__(self, model: VideoDeckModel, stream, sid: str):
        self.model, self.sid, self.mode = model, sid, "img2img"
        self.calls: ClientStats | None = None  # (no batching)
        self.queue: deque[np.ndarray] = deque()
        self.ready = False
        self.pushed = 0
        self.pipe: VideoPipe | None = None
        if stream is not None:
            self._take(stream)

    def _take(self, stream) -> None:
        self.frames = VideoFrames(stream)
        self.pipe = VideoPipe(stream)
        self.chunk = stream.chunk_frames_out

    @property
    def fit(self) -> str:
        return self.frames.fit

    @fit.setter
    def fit(self, value: str) -> None:
        self.frames.fit = value

    def open(self, size: tuple[int, int]) -> None:
        """(Built at load.)"""

    def close(self) -> None:
        self.queue.clear()

    def is_ready(self, warmed: int) -> bool:
        return self.ready

    @property
    def stats(self) -> VideoStats:
        """(What the runner's metrics read: no frame skipped.)"""
        return self.pipe.stats if self.pipe is not None else VideoStats()

    def apply(self, changes: dict) -> None:
        """The prompt, fit and a causal model's strength; any other setting is refused (the image
        table's are not the video pipeline's)."""
        other = sorted(set(changes) - set(TAKES))
        if "fit" in changes:
            self.fit = changes["fit"]
        if "prompt" in changes:
            with self.model.guard.text():
                self.frames.stream.set_prompt(changes["prompt"])
        if "strength" in changes:
            self.set_strength(float(changes["strength"]))
        if other:
            raise StreamStudioError(f"a video deck takes {', '.join(TAKES[:-1])} and {TAKES[-1]} only, "
                                    f"not {', '.join(other)}")

    def set_strength(self, strength: float) -> None:
        """Video-to-video's noise level from the next chunk on: a causal model's stream takes it live
        (its cache kept); the StreamDiT buffer's levels are fixed when its stream opens."""
        stream = self.frames.stream
        if not hasattr(stream, "set_strength"):
            raise StreamStudioError("the StreamDiT video pipeline fixes its strength when the stream opens (its "
                                    "buffer's levels); a causal model (builtin-causal) takes strength live")
        with self.model.guard.frame():
            stream.set_strength(strength)

    def warm(self, frame: np.ndarray) -> np.ndarray | None:
        with self.model.guard.frame():
            made = self.frames.push(frame)
        self.pushed += 1
        self.queue.extend(made)
        if not self.ready and len(self.queue) >= self.chunk:
            assert self.pipe is not None  # (a stream was taken: frames were made)
            self.ready = True
            self.pipe.latency_frames = self.pushed - 1
        return self.queue.popleft() if self.ready else None

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        out = self.warm(frame)
        if out is None:  # (a chunk late: the pipeline's cadence broke)
            raise StreamStudioError(f"stream {self.sid}: the video deck gave no frame for an input")
        return out


class VideoLiveProcessor(VideoDeckProcessor):
    """A stream that plays the video pipeline from its first frame (`VideoDeckModel.processor`):
    its video stream is built at the stream's size by `open`; black frames until it is ready."""

    def __init__(self, model: VideoDeckModel, mode: str, sid: str):
        super().__init__(model, None, sid)
        self.mode = mode
        self._fit = "crop"
        self.size = model.size

    @property
    def fit(self) -> str:
        return self.frames.fit if self.pipe is not None else self._fit

    @fit.setter
    def fit(self, value: str) -> None:
        self._fit = value
        if self.pipe is not None:
            self.frames.fit = value

    def open(self, size: tuple[int, int]) -> None:
        """Build the stream's video stream at `size` (width, height), once (in the runner's thread)."""
        if self.pipe is not None:
            return
        model, self.size = self.model, size
        strength = 1.0 if self.mode == "txt2img" else cast(float, DEFAULT_STRENGTH)
        with model.guard.text():
            stream = build_stream(model.network, model.meta, model.prompt, strength=strength, seed=model.config.seed,
                                  width=size[0], height=size[1])
        self._take(stream)
        self.frames.fit = self._fit

    def apply(self, changes: dict) -> None:
        if self.pipe is None:  # (settings asked for before the first frame: the stream starts with them)
            self.open(self.size)
        super().apply(changes)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        if self.pipe is None:
            self.open(self.size)
        if self.mode == "txt2img":  # text-to-video: the frame only asks for the next one
            with self.model.guard.frame():
                return self.frames.push(None)[0]
        out = self.warm(frame)
        return np.zeros((self.size[1], self.size[0], 3), np.uint8) if out is None else out


def build_video_deck(model_name: str, prompt: str | None, a: StreamProcessor | VideoDeckProcessor,
                     size: tuple[int, int],
                     device: torch.device, dtype: torch.dtype) -> VideoDeckProcessor:
    """Deck B on the video pipeline: `model_name` (the builtin StreamDiT, a checkpoint folder, a causal
    model: the built-in causal one, a causal folder, a released generator) on
    deck A's device and dtype, video-to-video at the table's strength, its output `size`."""
    network, meta = load_video_model(model_name, device, dtype)
    assert a.pipe is not None  # (the stream has had a frame: Decks.load checked)
    text = a.model.prompt if prompt is None else prompt
    seed = a.model.config.seed if isinstance(a, VideoDeckProcessor) else a.pipe.config.seed
    stream = build_stream(network, meta, text, strength=cast(float, DEFAULT_STRENGTH), seed=seed,
                          width=size[0], height=size[1])
    config = replace(a.model.config, width=size[0], height=size[1])
    return VideoDeckProcessor(VideoDeckModel(f"{model_name} (video)", network, meta, config, text), stream, a.sid)


def live_video_model(model_name: str | None, image: ImageRequest) -> VideoDeckModel:
    """`serve --live-pipeline video`: the video model (`model_name`, None: the built-in StreamDiT)
    every live stream plays from its first frame, on the image request's device and dtype; the
    streams' size is the model's output size (or --width / --height), their prompt --prompt, their
    seed the table's."""
    device = pick_device(image.device)
    network, meta = load_video_model(model_name, device, image.dtype)
    width, height = video_output_size(network, meta, image.width, image.height)
    seed = int(image.settings.get("seed", StreamDiffusionConfig.seed))
    config = StreamDiffusionConfig(width=width, height=height, seed=seed)
    return VideoDeckModel(f"{model_name or 'builtin'} (video)", network, meta, config, image.prompt)
