"""`serve --gpus N`: N model replicas in the server, one per GPU, each with its own batching
executor; live sessions are placed on the least-loaded replica that is healthy and has room.

- The busy message appears only when every healthy replica is full (`--max-streams` is per replica).
- A replica whose network fails with an error that is not a user's (a CUDA fault, out of memory)
  is marked failed: its sessions stop with one clear error ("model replica 1 (cuda:1) failed ...;
  reconnect to continue on another replica"), no new session goes to it, and the other replicas'
  sessions keep streaming. A reconnect (a new session) lands on a healthy replica.
- The replicas live in the server's process (their executors are threads): an error a replica's
  network raises ends only that replica, but a crash that takes the process down (a segfault,
  a lost CUDA context that aborts) takes every replica with it; `serve --cluster local` runs each
  replica in a process of its own (app/web/ray_replicas.py).
- On a machine without N GPUs, `--gpus N --device cpu` makes N CPU replicas (tests).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from streamstudio.app.streams.requests import ServeRequest
from streamstudio.app.web.placement import ReplicaPlacement
from streamstudio.app.web.sessions import ServerModel, SessionManager
from streamstudio.errors import StreamStudioError
from streamstudio.app.streams import build_pipeline

log = logging.getLogger(__name__)


@dataclass
class Replica:
    """One model replica: its device, its sessions, and why it failed (None: healthy)."""

    index: int
    model: ReplicaModel
    device: str
    sessions: set[str] = field(default_factory=set)
    failed: str | None = None

    @property
    def name(self) -> str:
        return f"model replica {self.index} ({self.device})"


class ReplicaModel(ServerModel):
    """A ServerModel whose streams report a failure of its network as the replica's (the
    replica is marked failed and the stream stops with a clear error)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.replica: Replica | None = None
        # (replica, exception) -> the error its streams stop with; set by the manager
        self.on_failure: Callable[[Replica, BaseException], str] | None = None

    def build(self, *args, **kwargs):
        return _ReplicaPipeline(super().build(*args, **kwargs), self)


class _ReplicaPipeline:
    """A stream's pipeline on a replica: a frame whose network call fails with anything but a
    user's error fails the replica."""

    def __init__(self, pipe, model: ReplicaModel):
        self._pipe, self._model = pipe, model

    def __call__(self, *args, **kwargs):
        replica = self._model.replica
        if replica is not None and replica.failed is not None:
            raise StreamStudioError(replica.failed)
        try:
            return self._pipe(*args, **kwargs)
        except StreamStudioError:
            raise
        except Exception as exc:  # the replica's network: a device fault, out of memory, ...
            if self._model.on_failure is None or replica is None:
                raise
            raise StreamStudioError(self._model.on_failure(replica, exc)) from exc

    def __getattr__(self, name: str):
        return getattr(self._pipe, name)


class LocalReplicas(ReplicaPlacement[Replica]):
    """The placement over several replicas in this process (`SessionManager.placement`): least-loaded,
    `per_replica` streams each, a failed replica's sessions ended alone; shutdown closes the models."""

    def __init__(self, models: list[ReplicaModel], devices: list[str], per_replica: int):
        if not models:
            raise StreamStudioError("--gpus must be at least 1")
        super().__init__([Replica(i, m, d) for i, (m, d) in enumerate(zip(models, devices))], per_replica)
        for replica in self.replicas:
            replica.model.replica = replica
            replica.model.on_failure = self._fail
        self._fail_lock = threading.Lock()

    def limit(self) -> int:
        return self.per_replica * len(self.replicas)

    def healthy(self) -> list[Replica]:
        """Replicas that take streams; one whose batching executor has stopped is failed too."""
        for replica in self.replicas:
            executor = replica.model.executor
            if replica.failed is None and executor is not None and executor.closed:
                replica.failed = (f"{replica.name} stopped (its batching executor ended); reconnect to continue "
                                  "on another replica")
        return [r for r in self.replicas if r.failed is None]

    def _fail(self, replica: Replica, exc: BaseException) -> str:
        """Mark `replica` failed (once); returns the error its sessions stop with."""
        with self._fail_lock:
            if replica.failed is None:
                replica.failed = (f"{replica.name} failed ({type(exc).__name__}: {exc}); reconnect to continue "
                                  "on another replica")
                log.error("%s failed; its %d stream(s) stop, the other replicas go on", replica.name,
                          len(replica.sessions), exc_info=exc)
        return replica.failed

    def shutdown(self) -> None:
        for replica in self.replicas:
            replica.model.close()

    def stats(self) -> list[dict]:
        return [{"replica": r.index, "device": r.device, "sessions": len(r.sessions), "failed": r.failed}
                for r in self.replicas]


def replica_devices(n: int, device: str = "auto") -> list[str]:
    """The device of each of --gpus N replicas: cuda:0 .. cuda:N-1, or N CPU replicas with --device cpu."""
    if n < 1:
        raise StreamStudioError("--gpus must be at least 1")
    if device == "cpu":
        return ["cpu"] * n
    import torch

    have = torch.cuda.device_count()
    if have < n:
        raise StreamStudioError(f"--gpus {n}, but this machine has {have} CUDA GPU(s); give --gpus {max(1, have)} "
                                f"(or --device cpu for CPU replicas)")
    return [f"cuda:{i}" for i in range(n)]


def build_manager(request: ServeRequest) -> SessionManager:
    """`serve --gpus N`: a replica of the model on each device, and the manager over them."""
    image = request.image
    devices, models = replica_devices(request.gpus, image.device), []
    for device in devices:
        pipe = build_pipeline(request.on(device).image, "img2img", serving=True)
        models.append(ReplicaModel(pipe.comps, pipe.config, prompt=image.prompt, negative_prompt=image.negative_prompt,
                                   latency_probe=request.latency_probe, batching=image.batching))
    return SessionManager(placement=LocalReplicas(models, devices, request.max_streams),
                          max_streams=request.max_streams * len(models), idle_timeout=request.idle_timeout)
