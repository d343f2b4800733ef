"""The small protocol the streaming layer knows processors by (it never names a pipeline)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class FrameProcessor(Protocol):
    """Frames in and out are RGB uint8 (H, W, 3) numpy arrays.

    - `push(frame)`: frame-aligned; returns the outputs of the inputs that finished with this
      call, in input order (possibly none while a pipeline's buffer fills).
    - `flush()`: returns the outputs of every input still inside, then resets.
    - `__call__(frame)`: live; returns the latest output at once.

    A live run (`Runner` with a live source) calls only `__call__`, an offline run only `push`
    and `flush`: a processor made for one kind of run (a web stream's) may have only those.
    The runner's metrics read the similarity filter's skips from `stats.skipped` when the
    processor has `stats`.
    """

    def push(self, frame: np.ndarray) -> list[np.ndarray]: ...

    def flush(self) -> list[np.ndarray]: ...

    def __call__(self, frame: np.ndarray) -> np.ndarray: ...


class IdentityProcessor:
    """Returns every frame unchanged (benchmarks, tests, plain transcoding)."""

    skip_rate = 0.0

    def push(self, frame: np.ndarray) -> list[np.ndarray]:
        return [frame]

    def flush(self) -> list[np.ndarray]:
        return []

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        return frame
