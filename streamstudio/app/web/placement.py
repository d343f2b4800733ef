"""Where the one `SessionManager` (app/web/sessions.py) puts a new session: its `Placement` decides
which model it runs on and answers for the limit on streams, room, the busy message, the models and
their stats. `OneModel` (`serve`); over replicas, by `ReplicaPlacement` (least-loaded, `per_replica`
streams each): `replicas.LocalReplicas` (`serve --gpus N`, app/web/replicas.py) and
`ray_replicas.RayPlacement` (`serve --cluster`, app/web/ray_replicas.py). A placement's own lock is
taken inside the manager's, never around it."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:  # (the manager imports this module)
    from streamstudio.app.web.session_model import SessionModel
    from streamstudio.app.web.sessions import SessionManager

log = logging.getLogger(__name__)


class Placement(Protocol):
    """What the manager asks of its placement (every call but `attach` under the manager's lock)."""

    def attach(self, manager: SessionManager) -> None: ...  # the manager it places for, once, at its start
    def limit(self) -> int: ...  # live streams at most, in all (the manager's `max_streams`)
    def has_room(self) -> bool: ...  # whether `place` would place a new session now
    def place(self, sid: str) -> SessionModel | None: ...  # the model stream `sid` runs on; None: no room
    def release(self, sid: str) -> None: ...  # stream `sid` has ended
    def busy_message(self) -> str: ...
    def models(self) -> list[SessionModel]: ...  # every model the sessions run on
    def stats(self) -> list[dict] | None: ...  # each replica's (None: one model)
    def shutdown(self) -> None: ...  # after the manager closed every session


class OneModel:
    """Every session on `model`, `max_streams` at once; `owns_model`: shutdown closes the model."""

    def __init__(self, model: SessionModel, max_streams: int, owns_model: bool = False):
        self.model, self.max_streams, self.owns_model = model, max_streams, owns_model

    def attach(self, manager: SessionManager) -> None:
        pass

    def limit(self) -> int:
        return self.max_streams

    def has_room(self) -> bool:
        return True

    def place(self, sid: str) -> SessionModel | None:
        return self.model

    def release(self, sid: str) -> None:
        pass

    def busy_message(self) -> str:
        return (f"StreamStudio is busy: all {self.max_streams} live stream slot(s) are in use. "
                f"Try again in a minute (the server's admin can raise --max-streams).")

    def models(self) -> list[SessionModel]:
        return [self.model]

    def stats(self) -> list[dict] | None:
        return None

    def shutdown(self) -> None:
        if self.owns_model:
            self.model.close()


class PlacedReplica(Protocol):
    """What placing sessions reads of a replica: `replicas.Replica` in this process,
    `ray_replicas.RemoteReplica` for `serve --cluster`'s replica actors."""

    index: int
    sessions: set[str]
    failed: str | None

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> SessionModel: ...


R = TypeVar("R", bound=PlacedReplica)


class ReplicaPlacement(Generic[R]):
    """Sessions over replicas of kind R: the least-loaded healthy replica with room (`per_replica`
    streams each) takes a new one; the busy message only when every healthy replica is full."""

    def __init__(self, replicas: list[R], per_replica: int):
        self.replicas, self.per_replica = replicas, per_replica
        self.manager: SessionManager | None = None
        self._placed: dict[str, R] = {}  # stream id -> its replica
        self._lock = threading.Lock()

    def attach(self, manager: SessionManager) -> None:
        self.manager = manager

    def healthy(self) -> list[R]:
        """Replicas that take streams."""
        return [r for r in self.replicas if r.failed is None]

    def has_room(self) -> bool:
        with self._lock:
            return self._pick() is not None

    def _pick(self) -> R | None:  # (under self._lock)
        room = [r for r in self.healthy() if len(r.sessions) < self.per_replica]
        return min(room, key=lambda r: (len(r.sessions), r.index), default=None)

    def place(self, sid: str) -> SessionModel | None:
        with self._lock:
            replica = self._pick()
            if replica is None:
                return None
            self._assign(sid, None, replica)
        log.info("stream %s on %s (%d of %d)", sid, replica.name, len(replica.sessions), self.per_replica)
        return replica.model

    def release(self, sid: str) -> None:
        with self._lock:
            self._assign(sid, self._placed.get(sid), None)

    def _assign(self, sid: str, old: R | None, new: R | None) -> None:  # (under self._lock)
        """Stream `sid` counts on `new` (None: on no replica) instead of `old`."""
        if old is not None:
            old.sessions.discard(sid)
        if new is None:
            self._placed.pop(sid, None)
        else:
            new.sessions.add(sid)
            self._placed[sid] = new

    def replica_of(self, sid: str) -> R | None:
        return self._placed.get(sid)

    def busy_message(self) -> str:
        healthy = self.healthy()
        if not healthy:
            return ("StreamStudio cannot take live streams: every model replica failed "
                    f"({self.replicas[0].failed}); the server's admin must restart it.")
        return (f"StreamStudio is busy: all {len(healthy)} model replica(s) are full ({self.per_replica} live "
                f"stream(s) each). Try again in a minute (the server's admin can raise --max-streams or --gpus).")

    def models(self) -> list[SessionModel]:
        return [r.model for r in self.replicas]
