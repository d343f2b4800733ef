"""`serve --cluster`: model replicas as Ray actors (one process each), this server the one front end.

The server keeps the web app, WebRTC, WHIP/WHEP, OSC and every session's runner, settings and
sinks; only each stream's frame step runs in a replica actor (app/web/replica_actor.py), which
loads the model once with its own batching executor. docs/cluster.md has the whole story and the
figures:

- **Transport.** One channel per replica (`RemoteReplica`): a dispatcher thread sends the requests
  its streams made since the last round as one batch, by a Ray compiled graph or plain actor calls
  (`--replica-transport`); a round waits briefly for the frames of the replica's other streams.
- **Placement.** Least-loaded healthy replica first; the watcher rebalances, moves a failed
  replica's streams at their next frame with their settings, starts replicas on nodes that join
  or in place of dead ones, and health-checks each replica's network; `drain` takes one out of
  service with no stream lost.
"""


from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import Body
from fastapi.responses import JSONResponse

from streamstudio.app.web.replica_actor import HEALTH_SID, first_error
from streamstudio.app.web.model_guard import ModelGuard
from streamstudio.app.web.placement import ReplicaPlacement
from streamstudio.errors import StreamStudioError
from streamstudio.frames import fit
from streamstudio.app.streams.image import output_size

if TYPE_CHECKING:  # (ray_cluster and ray_rollout import this module)
    from streamstudio.app.web.ray_cluster import RayReplicas
    from streamstudio.app.web.ray_rollout import RollingUpdate
    from streamstudio.app.web.sessions import SessionManager
    from streamstudio.models.image.batching import ClientStats

log = logging.getLogger(__name__)

# A replica that answers no round within this is failed. Deaths (the process, its node) are seen at
# once (Ray's error, the watcher); this is for a replica that hangs, so it is long: a slow round of a
# loaded CPU is not a hang.
STEP_TIMEOUT_S = 60.0
WATCH_S = 2.0  # how often the watcher looks for new nodes and dead replicas
HEALTH_S = 10.0  # how often each replica's network runs a frame of noise (`ReplicaActor._health`)
TRANSPORTS = ("compiled", "calls")
# A round waits for the frames of the replica's other sending streams (one within EXPECT_S), up to
# GATHER_FRACTION of a recent step and GATHER_MAX_S: out of phase, streams took turns and never
# shared a batched call; after one shared round they stay in phase.
EXPECT_S = 1.0
GATHER_FRACTION, GATHER_MAX_S = 0.5, 0.025


# ---------------------------------------------------------------------------- in the front end
class _QuietTeardown(logging.Filter):
    """Ray logs a traceback when a compiled graph's teardown cannot cancel the task of an actor
    that has died: expected here (a failed replica's graph), so said once by `RemoteReplica.fail`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Error cancelling worker task")


_ray_graph_log = logging.getLogger("ray.dag.compiled_dag_node")
_ray_graph_log.setLevel(logging.WARNING)  # (a line per graph set up and torn down otherwise)
_ray_graph_log.addFilter(_QuietTeardown())


class ReplicaLost(Exception):
    """The replica a request went to failed; the request was not answered."""


@dataclass
class RemoteReplica:
    """The front end's handle on one replica actor, in the place `replicas.Replica` has in
    `serve --gpus`: its index, sessions, failure, and the channel its streams' requests go through."""

    index: int
    actor: Any  # its Ray actor handle (ray.actor.ActorHandle: Ray does not type its remote methods)
    info: dict
    transport: str = "compiled"
    sessions: set[str] = field(default_factory=set)
    failed: str | None = None
    batching: dict | None = None
    frames: int = 0
    draining: bool = False  # taken out of placement, its streams moving off (`RayPlacement.drain`)

    def __post_init__(self) -> None:
        self.model = RemoteModel(self)
        self.device, self.node = self.info["device"], self.info["node_ip"]
        self._queue: list[tuple[dict, Future]] = []
        self._wake = threading.Condition()
        self._closed = False
        self._graph = None
        self.overheads: deque[float] = deque(maxlen=100)  # ms of each recent round not spent in the replica's step
        self.step_ms: deque[float] = deque(maxlen=20)  # the replica's recent rounds (the gather window)
        self.probe: Future | None = None  # the health check under way, else the last one (`check_health`)
        self.probes = 0  # health checks passed
        self._last_frame: dict[str, float] = {}  # stream -> when it last sent a frame (`_take_round`)
        self._thread = threading.Thread(target=self._loop, name=f"replica-{self.index}", daemon=True)
        self._thread.start()

    @property
    def name(self) -> str:
        return f"model replica {self.index} ({self.device} on {self.node})"

    def call(self, request: dict, timeout: float = STEP_TIMEOUT_S + 5) -> dict:
        """Send `request` in the next round and wait for its reply; ReplicaLost when the replica failed."""
        future = self.send(request)
        return future.result(timeout=timeout)

    def send(self, request: dict) -> Future:
        future: Future = Future()
        with self._wake:
            if self.failed is not None or self._closed:
                future.set_exception(ReplicaLost(self.failed or f"{self.name} was shut down"))
                return future
            self._queue.append((request, future))
            if request.get("op") == "frame":
                self._last_frame[request["sid"]] = time.monotonic()
            self._wake.notify()
        return future

    def check_health(self) -> None:
        """Send a health check (one at a time): its frame of noise runs through the replica's
        network, and a fault there marks the replica failed as a stream's frame would."""
        if self.probe is not None and not self.probe.done():
            return
        if self.probe is not None and self.probe.exception() is None:
            self.probes += 1
        self.probe = self.send({"sid": HEALTH_SID, "op": "health"})

    def fail(self, why: str) -> None:
        """Mark the replica failed (once): every request waiting or sent later gets ReplicaLost."""
        with self._wake:
            if self.failed is not None:
                return
            self.failed = f"{self.name} failed ({why})"
            waiting, self._queue = self._queue, []
            self._wake.notify()
        log.error("%s; its %d stream(s) move to the other replicas", self.failed, len(self.sessions))
        for _, future in waiting:
            future.set_exception(ReplicaLost(self.failed))

    def close(self, kill: bool = True) -> None:
        """Stop the dispatcher and free the channel; `kill`: the actor too."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=5)
        self._teardown(wait=True, kill=kill)

    # ------------------------------------------------------------------ the dispatcher thread
    def _loop(self) -> None:
        try:
            self._connect()
        except Exception as exc:
            self.fail(f"its channel could not be set up: {first_error(exc)}")
            return
        while True:
            with self._wake:
                while not self._queue and not self._closed and self.failed is None:
                    self._wake.wait()
                if self._closed or self.failed is not None:
                    return
                batch = self._take_round()
            try:
                t0 = time.perf_counter()
                result = self._round([request for request, _ in batch])
                self.overheads.append(1000 * (time.perf_counter() - t0) - result["step_ms"])
                self.step_ms.append(result["step_ms"])
            except Exception as exc:  # the actor died, its node was lost, the channel broke, a timeout
                self.fail(first_error(exc))
                for _, future in batch:
                    future.set_exception(ReplicaLost(self.failed))
                self._teardown()
                return
            self.batching = result.get("batching")
            for request, future in batch:
                reply = dict(result["replies"].get(request["sid"], {}))
                if reply.get("frame") is not None:  # (a copy: the channel's buffer is written again next round)
                    reply["frame"] = np.array(reply["frame"])
                if reply.get("replica_failed"):
                    future.set_exception(ReplicaLost(f"{self.name} failed ({reply['error']})"))
                    self.fail(reply["error"])
                else:
                    self.frames += request["op"] == "frame"
                    future.set_result(reply)
            del result  # frees the channel's buffer for the next round

    def _take_round(self) -> list[tuple[dict, Future]]:
        """The next round's requests (under self._wake, the queue not empty): with a frame in it,
        first up to the gather window for the frames of this replica's other sending streams."""
        now = time.monotonic()
        self._last_frame = {sid: t for sid, t in self._last_frame.items() if sid in self.sessions}
        expected = {sid for sid, t in self._last_frame.items() if now - t < EXPECT_S}
        window = min(GATHER_MAX_S, GATHER_FRACTION * statistics.median(self.step_ms) / 1000) if self.step_ms else 0
        deadline = now + window
        while not self._closed and self.failed is None:
            framed = {r["sid"] for r, _ in self._queue if r["op"] == "frame"}
            if not framed or expected <= framed or time.monotonic() >= deadline:
                break
            self._wake.wait(deadline - time.monotonic())
        batch, self._queue = self._queue, []
        return batch

    def _connect(self) -> None:
        """The compiled graph of the actor's `step` (made once, before the first round)."""
        if self.transport == "compiled":
            from ray.dag import InputNode

            with InputNode() as inp:
                dag = self.actor.step.bind(inp)
            self._graph = dag.experimental_compile(_buffer_size_bytes=1 << 21)  # grows with larger rounds

    def _round(self, batch: list[dict]) -> dict:
        import ray

        if self._graph is not None:
            return ray.get(self._graph.execute(batch), timeout=STEP_TIMEOUT_S)
        return ray.get(self.actor.step.remote(batch), timeout=STEP_TIMEOUT_S)

    def _teardown(self, wait: bool = False, kill: bool = True) -> None:
        """Free the graph's channels and the actor (after a failure in a thread of its own: a lost
        node's teardown may wait)."""
        graph, self._graph = self._graph, None

        def free():
            import ray

            try:
                if graph is not None:
                    graph.teardown()
                if kill:
                    ray.kill(self.actor)
            except Exception as exc:  # a dead actor: nothing left to free
                log.debug("teardown of %s: %s", self.name, exc)

        if wait:
            free()
        else:
            threading.Thread(target=free, name=f"replica-{self.index}-teardown", daemon=True).start()

    def stats(self) -> dict:
        return {"replica": self.index, "model": self.info["name"], "device": self.device, "node": self.node,
                "node_id": self.info["node_id"],
                "pid": self.info["pid"], "sessions": len(self.sessions), "frames": self.frames,
                "healthy": self.failed is None, "failed": self.failed, "health_checks": self.probes,
                "batching": self.batching,
                "transport": self.transport, "overhead_ms": self.overhead_ms(), "startup": self.info.get("startup")}

    def overhead_ms(self) -> float | None:
        """The median time of the recent rounds not spent in the replica's step: the transport both
        ways (the channel, serialisation; across machines, the network)."""
        recent = list(self.overheads)
        return round(statistics.median(recent), 3) if recent else None


class RemoteModel:
    """What the web app reads of a model (`ServerModel`'s description: name, size, defaults), for a
    replica in another process; its streams' steps are `RemoteStreamProcessor`s. Model-wide
    changes that need the weights in this process (LoRA scales, the Splats tab's own stream, an
    IP-Adapter reference) are refused with a clear error."""

    comps = None
    executor = None
    latency_probe = False

    def __init__(self, replica: RemoteReplica):
        self.replica = replica
        self.placement: RayPlacement | None = None  # set when the replica joins it
        self.config = replica.info["config"]
        self.name, self.is_demo = replica.info["name"], replica.info["demo"]
        self.prompt, self.negative_prompt = replica.info["prompt"], replica.info["negative_prompt"]
        self.guard = ModelGuard()

    @property
    def size(self) -> tuple[int, int]:
        return self.config.width, self.config.height

    def stream_size(self, aspect: float | None) -> tuple[int, int]:
        if aspect is None or self.replica.info["fixed_shapes"]:
            return self.size
        return output_size(None, None, max(self.size), aspect)

    def processor(self, mode: str, sid: str) -> "RemoteStreamProcessor":
        assert self.placement is not None  # (a replica's streams open once it joined a placement)
        return RemoteStreamProcessor(self.placement, self.replica, mode, sid)

    def build(self, *args, **kwargs):
        raise StreamStudioError("with --cluster the model runs in the replicas, so this tab's stream is not "
                                "available; serve without --cluster to use it")

    def batching_stats(self) -> dict | None:
        return self.replica.batching

    def lora_listing(self) -> list:
        return []

    def set_lora_scales(self, scales: object):
        raise StreamStudioError("LoRA scales cannot be changed on a --cluster server (the replicas load them "
                                "from --lora at start)")

    def close(self) -> None:
        pass


@dataclass
class _PipeState:
    """What a session reads of its stream's pipeline, from the replica's last reply."""

    skip_rate: float = 0.0
    latency_frames: int | None = None
    skipped: int = 0

    @property
    def stats(self):
        return self


class RemoteStreamProcessor:
    """A stream's frame step run by a replica actor: the frame fitted to the stream's size here,
    stepped there. Keeps every setting it applied, so that when its replica fails it opens the
    stream again on another one (`RayPlacement.move`) and goes on."""

    def __init__(self, placement: RayPlacement, replica: RemoteReplica, mode: str, sid: str):
        self.placement, self.replica, self.mode, self.sid = placement, replica, mode, sid
        self.pipe: _PipeState | None = None
        self.fit = "crop"
        self.calls: ClientStats | None = None  # (a replica's batching counts are the replica's)
        self.notice: str | None = None
        self._size: tuple[int, int] | None = None
        self._settings: dict = {}
        self._wanted: RemoteReplica | None = None  # where the placement rebalances it to, at the next frame

    @property
    def stats(self):
        return self.pipe

    def move_to(self, replica: RemoteReplica) -> None:
        """Move to `replica` at the next frame boundary (`RayPlacement.rebalance`)."""
        self._wanted = replica

    def open(self, size: tuple[int, int]) -> None:
        if self.pipe is None:
            self._size = size
            self._request({"op": "open", "mode": self.mode, "size": size, "settings": {}})
            self.pipe = _PipeState()

    def apply(self, changes: dict) -> None:
        changes = dict(changes)
        self.fit = changes.pop("fit", self.fit)
        if self.mode == "txt2img":
            changes.pop("strength", None)
        if changes:
            self._request({"op": "apply", "changes": changes})
            self._settings.update(changes)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        if self._wanted is not None:
            self._switch()
        assert self._size is not None and self.pipe is not None  # (opened first)
        width, height = self._size  # (txt2img: the frame only asks for the next image)
        image = None if self.mode == "txt2img" else fit(frame, width, height, self.fit)
        reply = self._request({"op": "frame", "frame": image})
        self.pipe.skip_rate, self.pipe.skipped = reply["skip_rate"], reply["skipped"]
        self.pipe.latency_frames = reply["latency_frames"]
        return reply["frame"]

    def close(self) -> None:
        if self.pipe is not None:
            self.replica.send({"sid": self.sid, "op": "close"})  # not waited for

    def _request(self, request: dict) -> dict:
        request["sid"] = self.sid
        try:
            reply = self.replica.call(request)
        except ReplicaLost as exc:
            self._move(str(exc))
            reply = self.replica.call(request)  # (a second loss in a row stops the stream)
        if "error" in reply:
            raise StreamStudioError(reply["error"])
        return reply

    def _switch(self) -> None:
        """A planned move between two frames: opened on the new replica with its size and settings,
        then closed on the old one, where it stays if the new one cannot take it."""
        target, self._wanted = self._wanted, None
        old = self.replica
        if target is None or target is old or target.failed is not None:
            return
        try:
            target.call({"sid": self.sid, "op": "open", "mode": self.mode, "size": self._size,
                         "settings": dict(self._settings)})
        except (ReplicaLost, StreamStudioError) as exc:
            self.placement.placed(self.sid, target, old)
            log.warning("stream %s stays on %s: %s", self.sid, old.name, exc)
            return
        self.replica = target
        old.send({"sid": self.sid, "op": "close"})
        self.notice = f"rebalanced from {old.name} to {target.name}"
        log.info("stream %s rebalanced from %s to %s", self.sid, old.name, target.name)

    def _move(self, why: str) -> None:
        """Open this stream on another healthy replica, with its size and settings."""
        old = self.replica
        self.replica = self.placement.move(self.sid, old, why)
        if self.pipe is not None:
            self.replica.call({"sid": self.sid, "op": "open", "mode": self.mode, "size": self._size,
                               "settings": dict(self._settings)})
        self.notice = f"{why}; the stream moved to {self.replica.name}"
        log.warning("stream %s moved from %s to %s", self.sid, old.name, self.replica.name)


class RayPlacement(ReplicaPlacement[RemoteReplica]):
    """The placement over replica actors that come and go (`SessionManager.placement`): least-loaded
    among the healthy ones (`--max-streams` each), a failed replica's streams moved to the others, the
    cluster watched for new nodes and dead replicas by a thread that starts when the manager attaches
    (it moves the manager's streams, and ends with the manager's `stopping`)."""

    def __init__(self, cluster: RayReplicas, max_streams: int = 4):
        self.cluster = cluster
        replicas = cluster.start_wanted(wait=True)
        if not replicas:
            raise StreamStudioError(f"no model replica could start on the Ray cluster ({cluster.address})")
        super().__init__(list(replicas), max_streams)
        self.moves = self.rebalances = 0  # streams moved off failed replicas / to even the load (/metrics)
        self.released = 0  # elastic: idle replicas stopped
        self.update: RollingUpdate | None = None  # the rolling update under way or last made (app/web/ray_rollout.py)
        self.stopping = threading.Event()  # the manager's, once attached
        for replica in replicas:
            replica.model.placement = self
        self._watch = threading.Thread(target=self._watch_loop, name="replica-watcher", daemon=True)

    def attach(self, manager: SessionManager) -> None:
        super().attach(manager)
        self.stopping = manager.stopping
        self._watch.start()

    def limit(self) -> int:
        """Every healthy replica's streams together."""
        return self.per_replica * max(1, len(self.healthy()))

    def healthy(self) -> list[RemoteReplica]:
        return [r for r in self.replicas if r.failed is None and not r.draining]

    def _processor(self, sid: str) -> object:
        """The frame step of the manager's stream `sid` (None: no such stream)."""
        return getattr(self.manager and self.manager.get(sid), "processor", None)

    def drain(self, index: int, retire: bool = True) -> list[str]:
        """Take replica `index` out of service with no stream lost: its streams move to the others
        at their next frames, then it stops and is not started again (`retire`; else the watcher
        starts its replacement from the cluster's request: a rolling update, app/web/ray_rollout.py).
        Returns the streams that move; StreamStudioError when there is no such replica or the
        others have no room."""
        with self._lock:
            replica = next((r for r in self.healthy() if r.index == index), None)
            if replica is None:
                raise StreamStudioError(f"no running model replica {index}")
            others = [r for r in self.healthy() if r is not replica]
            if len(replica.sessions) > sum(self.per_replica - len(r.sessions) for r in others):
                raise StreamStudioError(f"the other replicas have no room for {replica.name}'s "
                                        f"{len(replica.sessions)} stream(s); try when fewer streams run")
            replica.draining = True
            if retire:  # at once: the watcher must not start another there meanwhile
                self.cluster.retire(replica.info["node_id"])
            moves = []
            for sid in sorted(replica.sessions):
                target = min((r for r in others if len(r.sessions) < self.per_replica),
                             key=lambda r: (len(r.sessions), r.index))
                self._assign(sid, replica, target)
                moves.append((sid, target))
        for sid, target in moves:
            processor = self._processor(sid)
            if isinstance(processor, RemoteStreamProcessor):
                processor.move_to(target)
        threading.Thread(target=self._retire, args=(replica, [sid for sid, _ in moves]), daemon=True).start()
        log.info("draining %s: %d stream(s) move off it", replica.name, len(moves))
        return [sid for sid, _ in moves]

    def _retire(self, replica: RemoteReplica, sids: list[str], timeout: float = 30.0) -> None:
        """Stop a drained replica once its streams have moved (one that sent no frame within
        `timeout` moves at its next, as off a failed replica)."""
        deadline = time.monotonic() + timeout
        on_it = lambda sid: getattr(self._processor(sid), "replica", None)  # noqa: E731
        while time.monotonic() < deadline and not self.stopping.is_set() and any(on_it(s) is replica for s in sids):
            time.sleep(0.1)
        replica.close(kill=True)
        with self._lock:
            self.replicas.remove(replica)
        log.info("%s drained and stopped", replica.name)

    def busy_message(self) -> str:
        if not self.healthy():
            return ("StreamStudio cannot take live streams: no model replica is running on the cluster; it "
                    "starts new ones as nodes join (see `ray status`)")
        policy, healthy = self.cluster.elastic, len(self.healthy())
        if policy is not None and healthy + self.cluster.starting < policy.max_replicas or self.cluster.starting:
            return (f"StreamStudio is busy: all {healthy} model replica(s) are full ({self.per_replica} live "
                    "stream(s) each) and another is starting; try again in a minute.")
        return super().busy_message()

    def move(self, sid: str, old: RemoteReplica, why: str) -> RemoteReplica:
        """Place stream `sid`, whose replica `old` failed, on another healthy replica with room."""
        with self._lock:
            old.sessions.discard(sid)
            replica = self._pick()
            self._assign(sid, None, replica)
            if replica is None:
                raise StreamStudioError(f"{why}; no other model replica has room, reconnect in a minute")
            self.moves += 1
            return replica

    def placed(self, sid: str, old: RemoteReplica, new: RemoteReplica) -> None:
        """Stream `sid` counts on `new` instead of `old` (a move planned, or one undone)."""
        with self._lock:
            self._assign(sid, old, new)

    def rebalance(self) -> list[tuple[str, RemoteReplica, RemoteReplica]]:
        """While a healthy replica holds two streams more than another (one that joined or came
        back sits idle), move one of its streams there at its next frame (`_switch`)."""
        moves = []
        with self._lock:
            healthy = self.healthy()
            while len(healthy) > 1:
                heavy = max(healthy, key=lambda r: len(r.sessions))
                light = min(healthy, key=lambda r: (len(r.sessions), r.index))
                movable = [sid for sid in sorted(heavy.sessions) if self._movable(sid)]
                if len(heavy.sessions) - len(light.sessions) <= 1 or not movable:
                    break
                sid = movable[0]
                self._assign(sid, heavy, light)
                moves.append((sid, heavy, light))
            self.rebalances += len(moves)
        for sid, _, light in moves:
            processor = self._processor(sid)
            if isinstance(processor, RemoteStreamProcessor):  # (every stream here: `_movable` read its _wanted)
                processor.move_to(light)
        return moves

    def _movable(self, sid: str) -> bool:  # (under self._lock)
        return getattr(self._processor(sid), "_wanted", 0) is None

    def _watch_loop(self) -> None:
        checked = time.monotonic()
        while not self.stopping.wait(WATCH_S):
            if time.monotonic() - checked >= HEALTH_S:
                checked = time.monotonic()
                for replica in self.healthy():
                    replica.check_health()
            try:
                if self.cluster.elastic is not None:
                    self._elastic_step()
                for replica in self.cluster.check(self.replicas):
                    replica.model.placement = self
                    with self._lock:
                        self.replicas.append(replica)
                    log.info("%s joined (%d replica(s) healthy)", replica.name, len(self.healthy()))
                self.rebalance()
            except Exception:  # pragma: no cover - keep watching
                log.exception("replica watcher")

    def _elastic_step(self) -> None:
        """Elastic replicas (`ray_cluster.ElasticPolicy`): one more when every one is full, an
        idle one stopped after its idle time while more than the minimum run."""
        policy, cluster = self.cluster.elastic, self.cluster
        assert policy is not None  # (the watcher steps only an elastic cluster)
        with self._lock:
            healthy = self.healthy()
            if policy.grow([len(r.sessions) for r in healthy], self.per_replica, cluster.starting):
                cluster.target = len(healthy) + 1
                log.info("every replica is full (%d): starting another (at most %d)", len(healthy),
                         policy.max_replicas)
                return
            index = policy.release({r.index: len(r.sessions) for r in healthy}, cluster.starting)
            replica = next((r for r in healthy if r.index == index), None)
            if replica is None:
                return
            replica.draining = True  # no stream is placed on it from now on
            cluster.release()
            self.replicas.remove(replica)
            self.released += 1
        replica.close(kill=True)
        log.info("%s held no stream for %.0f s: stopped (%d replica(s) run)", replica.name, policy.release_idle_s,
                 len(self.healthy()))

    def shutdown(self) -> None:
        for replica in self.replicas:
            replica.close()
        self.cluster.shutdown()

    def stats(self) -> list[dict]:
        return [r.stats() for r in self.replicas]


def mount(app, placement: RayPlacement) -> None:
    """`POST /studio/replicas/{index}/drain`: 202 and the streams that move; 409 no room, 404 no
    replica. `POST /studio/replicas/update` (JSON: what changes, e.g. {"model": ...}): a rolling
    update (app/web/ray_rollout.py), 202 with its state; 409 while one runs, 400 for a bad change."""
    from streamstudio.app.web.ray_rollout import RollingUpdate

    @app.post("/studio/replicas/update", tags=["studio"], status_code=202)
    async def update(changes: dict = Body(default=None)):  # noqa: B008 - FastAPI's way to take the JSON body
        current = placement.update
        if current is not None and current.status == "running":
            return JSONResponse({"status": "failed", "error": "a rolling update is under way",
                                 "update": current.state()}, status_code=409)
        try:
            placement.update = started = RollingUpdate(placement, changes)
        except StreamStudioError as exc:
            return JSONResponse({"status": "failed", "error": str(exc)}, status_code=400)
        return JSONResponse({"status": "updating", "update": started.state()}, status_code=202)

    @app.post("/studio/replicas/{index}/drain", tags=["studio"], status_code=202)
    async def drain(index: int):
        try:
            moving = placement.drain(index)
        except StreamStudioError as exc:
            status = 404 if str(exc).startswith("no running") else 409
            return JSONResponse({"status": "failed", "error": str(exc)}, status_code=status)
        return JSONResponse({"status": "draining", "replica": index, "moving": moving}, status_code=202)

