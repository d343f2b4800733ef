"""A batch through the video pipeline: `render --pipeline video --input DIR|GLOB|a,b|@list.txt --output DIR`
renders each input video-to-video (app/streams/video.py), one output a file, here or on Ray, with
the image batch's job list, resume, failure isolation and output names (app/batch/cluster.py).

A video stream carries state from frame to frame (the StreamDiT buffer's chunks, the causal
model's KV cache), so a file is never cut: one file, one job, rendered by a stream opened for it
(from its seed, as a render of that file alone) over the model the worker loaded once.
Text-to-video takes no input, so it is no batch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamstudio.app.batch.segments import Piece, open_input
from streamstudio.app.batch.worker import Worker
from streamstudio.app.streams.requests import BatchRequest
from streamstudio.app.streams.video import load_video_model, open_video_stream, video_runner
from streamstudio.errors import StreamStudioError

if TYPE_CHECKING:
    import torch

WHOLE = ("a video stream carries state from frame to frame (the StreamDiT buffer, the causal model's KV cache), "
         "so a segment could not start where the whole file's stream is")


def check(request: BatchRequest) -> None:
    """What a video batch refuses before anything loads."""
    if request.segment_frames is not None:
        raise StreamStudioError(f"--segment-frames cuts a file into segments rendered apart; with --pipeline video "
                                f"each file is rendered whole, one job a file: {WHOLE}. Leave --segment-frames out")


class VideoWorker(Worker):
    """The video pipeline's worker: the model loaded once, a stream opened per file."""

    def __init__(self, request: BatchRequest, name: str, board=None):
        super().__init__(request, name, board)
        self._model: Any = None  # (a StreamDiT, a Wan model or a causal model)
        self._meta: dict = {}

    def _load(self) -> None:
        from streamstudio.device import use_threads  # (torch)

        if self._model is None:
            video = self.request.video
            self._model, self._meta = load_video_model(video.model, video.device, video.dtype, base=video.wan_base)
            use_threads(video.threads, self.device)

    @property
    def device(self) -> torch.device:
        return next(self._model.parameters()).device

    def _render(self, piece: Piece, target: Path, on_frame: Callable[[], None]) -> int:
        if piece.part is not None:
            raise StreamStudioError(f"{piece.name}: {WHOLE}")
        self._load()
        request = self.request
        source = open_input(piece.input, request.fps)
        try:
            info = source.info
            if not (info.width and info.height):
                raise StreamStudioError(f"{piece.input} has no frame size")
            stream = open_video_stream(self._model, self._meta, request.video, info.width / info.height)
            runner = video_runner(stream, source, str(target), request.video, fps=request.fps,
                                  max_frames=request.max_frames, no_audio=request.no_audio,
                                  rtmp_timeout=request.rtmp_timeout, on_output=lambda frame, pts: on_frame())
        except BaseException:
            source.close()
            raise
        return runner.run().frames_out


__all__ = ["VideoWorker", "check"]
