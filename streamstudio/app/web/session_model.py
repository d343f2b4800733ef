"""What a web session knows its model and its frame step by (`app/web/sessions.py`): protocols
that `ServerModel` and `StreamProcessor` meet in this process, and `serve --cluster`'s remote
replica (`ray_replicas.RemoteModel`, `RemoteStreamProcessor`) meets without its networks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from streamstudio.app.web.model_guard import ModelGuard
    from streamstudio.models.image.batching import BatchExecutor, ClientStats
    from streamstudio.models.image.components import SDComponents
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig


class PipeView(Protocol):
    """What a session reads of its stream's pipeline (a StreamDiffusion; a remote replica's last
    reply, `ray_replicas._PipeState`)."""

    @property
    def skip_rate(self) -> float: ...

    @property
    def latency_frames(self) -> int | None: ...


class SessionProcessor(Protocol):
    """A session's frame step, the processor of its runner: `StreamProcessor` here, a remote
    replica's `ray_replicas.RemoteStreamProcessor` with `serve --cluster`."""

    fit: str
    calls: ClientStats | None  # this stream's network calls, shared or alone (with batching)

    @property
    def pipe(self) -> PipeView | None: ...  # None until opened

    def open(self, size: tuple[int, int]) -> None: ...

    def apply(self, changes: dict) -> None: ...

    def close(self) -> None: ...

    def __call__(self, frame: np.ndarray) -> np.ndarray: ...


class SessionModel(Protocol):
    """What sessions and the web app use of the model their streams run on: a `ServerModel`
    here, `ray_replicas.RemoteModel` for a replica in another process (`serve --cluster`: no
    networks here, `comps` None)."""

    @property
    def comps(self) -> SDComponents | None: ...

    @property
    def config(self) -> StreamDiffusionConfig: ...

    @property
    def executor(self) -> BatchExecutor | None: ...

    @property
    def guard(self) -> ModelGuard: ...

    @property
    def prompt(self) -> str: ...

    @property
    def negative_prompt(self) -> str: ...

    @property
    def latency_probe(self) -> bool: ...

    @property
    def name(self) -> str: ...

    @property
    def is_demo(self) -> bool: ...

    @property
    def size(self) -> tuple[int, int]: ...

    def stream_size(self, aspect: float | None) -> tuple[int, int]: ...

    def build(self, mode: str, size: tuple[int, int] | None = None) -> StreamDiffusion: ...

    def processor(self, mode: str, sid: str) -> SessionProcessor: ...

    def close(self) -> None: ...

    def lora_listing(self) -> list[tuple[str, float]]: ...

    def set_lora_scales(self, scales: object) -> list[tuple[str, float]]: ...

    def batching_stats(self) -> dict | None: ...
