"""`serve --cluster`'s Ray side: connecting, starting replica actors where the cluster has room
for them, and how many (app/web/ray_replicas.py keeps the front end's side: the replicas' channels,
placement, moves and drains).

Fixed (the default): one replica per GPU of every node, `--node-replicas` on a node without GPUs,
started again where one died. Elastic (`--max-replicas`): `--min-replicas` at the start, one more
when every replica is full (on a node with room, else asked of Ray's autoscaler), and a replica
that held no stream for `--replica-idle-release` seconds stopped while more than the minimum run
(`ElasticPolicy`, plain arithmetic the watcher consults; docs/cluster.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from streamstudio.app.streams.requests import ServeRequest
from streamstudio.app.web.replica_actor import ReplicaActor, first_error
from streamstudio.app.web.ray_replicas import TRANSPORTS, RayPlacement, RemoteReplica
from streamstudio.app.web.sessions import SessionManager
from streamstudio.errors import StreamStudioError
from streamstudio.app.ray_connect import connect_ray

log = logging.getLogger(__name__)


@dataclass
class ElasticPolicy:
    """How many replicas an elastic cluster wants, from what its replicas hold."""

    min_replicas: int = 1
    max_replicas: int = 1
    release_idle_s: float = 60.0  # a replica without streams this long is stopped (above the minimum)
    _idle_since: dict[int, float] = field(default_factory=dict)  # replica index -> when it last held none

    def check(self) -> "ElasticPolicy":
        if self.min_replicas < 1:
            raise StreamStudioError(f"--min-replicas must be at least 1, got {self.min_replicas}")
        if self.max_replicas < self.min_replicas:
            raise StreamStudioError(f"--max-replicas ({self.max_replicas}) is below --min-replicas "
                                    f"({self.min_replicas})")
        if not self.release_idle_s > 0:
            raise StreamStudioError(f"--replica-idle-release must be over 0 seconds, got {self.release_idle_s}")
        return self

    def grow(self, loads: list[int], per_replica: int, starting: int) -> bool:
        """One replica more: every running one is full, none is starting, the maximum not reached."""
        return (starting == 0 and len(loads) + starting < self.max_replicas
                and all(n >= per_replica for n in loads))

    def release(self, loads: dict[int, int], starting: int, now: float | None = None) -> int | None:
        """The index of a replica to stop: the one idle longest, when it has been idle for
        `release_idle_s` and more than the minimum run (none while one is starting)."""
        now = time.monotonic() if now is None else now
        for index, n in loads.items():
            if n:
                self._idle_since.pop(index, None)
            else:
                self._idle_since.setdefault(index, now)
        for index in [i for i in self._idle_since if i not in loads]:
            del self._idle_since[index]
        if starting or len(loads) <= self.min_replicas:
            return None
        idle = [(since, i) for i, since in self._idle_since.items() if now - since >= self.release_idle_s]
        if not idle:
            return None
        _, index = min(idle)
        del self._idle_since[index]
        return index


def startup(asked_at: float | None, info: dict) -> dict:
    """Where a replica's start-up went, in seconds: `process` from being asked for to its actor's
    code running (Ray placing it, a worker process, this package's imports), `load` (torch, the
    model, its executor), `ready` in all until the front end has its description."""
    if asked_at is None or "init_at" not in info:
        return {}
    ready = time.time() - asked_at
    return {"process_s": round(info["init_at"] - asked_at, 2), "load_s": round(info["load_s"], 2),
            "ready_s": round(ready, 2)}


class RayReplicas:
    """The Ray side of `serve --cluster`: connecting, and starting replica actors where the
    cluster has room for them (one per GPU; `node_replicas` on a node without GPUs). With an
    elastic policy, `target` replicas in all instead of every node's."""

    def __init__(self, request: ServeRequest, address: str | None, node_replicas: int = 1, transport: str = "auto",
                 elastic: ElasticPolicy | None = None):
        import ray

        if transport not in ("auto", *TRANSPORTS):  # said before Ray starts
            raise StreamStudioError(f"--replica-transport {transport!r}: use auto, {' or '.join(TRANSPORTS)}")
        if transport == "compiled" and address is not None and address.startswith("ray://"):
            raise StreamStudioError("--replica-transport compiled needs a driver of the cluster: Ray client (ray://) "
                                    "cannot run compiled graphs; give the cluster's HOST:6379 from one of its nodes")
        self.ray = ray
        self.started = connect_ray(address)
        self.address = address or "a local Ray"
        self.request, self.node_replicas = request, node_replicas
        self.transport = "calls" if address is not None and address.startswith("ray://") else transport
        # (Any: Ray types its actors' remote methods as the plain methods, without `.remote`)
        self._actor_class: Any = ray.remote(ReplicaActor)
        self._count = 0
        self._starting: list[tuple[Any, str, Any]] = []  # (actor handle, node id, the ObjectRef of its info)
        self._started_at: dict[int, float] = {}  # id(actor) -> when it was asked for (its start-up's parts)
        self._retired: dict[str, int] = {}  # node id -> replicas drained there on purpose (not started again)
        self.elastic = elastic
        self.target = elastic.min_replicas if elastic else None  # elastic: the replicas wanted in all
        self.asked_autoscaler = 0  # elastic: resource requests made when no node had room

    def _nodes(self) -> list[dict]:
        return [n for n in self.ray.nodes() if n.get("Alive")]

    @property
    def starting(self) -> int:
        return len(self._starting)

    def start_wanted(self, live: Sequence[RemoteReplica] = (), wait: bool = False) -> list[RemoteReplica]:
        """Start the replicas each live node should have and does not (elastic: up to `target`
        in all, each where the fewest run); with `wait`, return them once loaded (else `check`
        picks them up when ready)."""
        have: dict[str, int] = {}
        for replica in live:
            if replica.failed is None and not replica.draining:
                have[replica.info["node_id"]] = have.get(replica.info["node_id"], 0) + 1
        for _, node_id, _ in self._starting:
            have[node_id] = have.get(node_id, 0) + 1
        nodes = self._nodes()
        if self.target is None:
            for node in nodes:
                for _ in range(self._room(node) - have.get(node["NodeID"], 0)):
                    self._start(node)
        else:
            for _ in range(self.target - sum(have.values())):
                roomy = [n for n in nodes if self._room(n) > have.get(n["NodeID"], 0)]
                emptiest: dict | None = min(roomy, key=lambda n: have.get(n["NodeID"], 0), default=None)
                if emptiest is None:
                    self._ask_autoscaler(nodes)
                    break
                self._start(emptiest)
                have[emptiest["NodeID"]] = have.get(emptiest["NodeID"], 0) + 1
        if not wait:
            return []
        return self._ready(timeout=None)

    def _room(self, node: dict) -> int:
        """Replicas `node` holds at most: one per GPU, else --node-replicas (less those drained there)."""
        return (int(node["Resources"].get("GPU", 0)) or self.node_replicas) - self._retired.get(node["NodeID"], 0)

    def _start(self, node: dict) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        gpus, cpus = int(node["Resources"].get("GPU", 0)), int(node["Resources"].get("CPU", 1))
        strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        options: dict[str, float]
        if gpus:
            options, request, threads = {"num_gpus": 1}, self.request.on("cuda"), None
        else:  # a CPU replica: its share of the node's cores, as torch threads, reserved
            share = self.node_replicas  # (so that Ray's scheduler and autoscaler see the load)
            threads, options, request = max(1, cpus // share), {"num_cpus": cpus / share}, self.request.on("cpu")
        actor = self._actor_class.options(max_restarts=0, scheduling_strategy=strategy,
                                          **options).remote(request, threads)
        self._starting.append((actor, node["NodeID"], actor.info.remote()))
        self._started_at[id(actor)] = time.time()

    def _ask_autoscaler(self, nodes: list[dict]) -> None:
        """Every node is full: ask Ray's autoscaler for a node's worth of a replica (a cluster
        without one ignores it; the watcher tries again as nodes join)."""
        assert self.target is not None  # (elastic: asked for when the target has no room)
        gpu = any(int(n["Resources"].get("GPU", 0)) for n in nodes)
        bundle = {"GPU": 1} if gpu else {"CPU": max(1, min(int(n["Resources"].get("CPU", 1)) for n in nodes)
                                                    // self.node_replicas)}
        try:
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=[bundle] * self.target)
            self.asked_autoscaler += 1
            log.info("every node is full: asked Ray's autoscaler for %d replica(s) of %s", self.target, bundle)
        except Exception as exc:  # noqa: BLE001 - a cluster without an autoscaler
            log.debug("no autoscaler to ask: %s", first_error(exc))

    def _ready(self, timeout: float | None) -> list[RemoteReplica]:
        """The started replicas that have loaded their model (those that failed to are dropped, said once)."""
        ready: list[RemoteReplica] = []
        refs = [ref for _, _, ref in self._starting]
        if not refs:
            return ready
        done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for actor, node_id, ref in list(self._starting):
            if ref not in done:
                continue
            self._starting.remove((actor, node_id, ref))
            try:
                info = self.ray.get(ref)
            except Exception as exc:
                log.error("a model replica on node %s did not start: %s", node_id[:8], first_error(exc))
                continue
            info["startup"] = startup(self._started_at.pop(id(actor), None), info)
            log.info("a model replica on node %s is ready: %s", node_id[:8], info["startup"])
            transport = self.transport
            if transport == "auto":  # (see the module's docstring)
                transport = "compiled" if str(info["device"]).startswith("cuda") else "calls"
            ready.append(RemoteReplica(self._count, actor, info, transport))
            self._count += 1
        return ready

    def check(self, replicas: list[RemoteReplica]) -> list[RemoteReplica]:
        """The watcher's look: replicas on nodes that died are failed at once; nodes with fewer
        replicas than they should have get new ones. Returns the replicas that became ready."""
        alive = {n["NodeID"] for n in self._nodes()}
        for replica in replicas:
            if replica.failed is None and replica.info["node_id"] not in alive:
                replica.fail("its node left the cluster")
        self.start_wanted(replicas)
        return self._ready(timeout=0)

    def retire(self, node_id: str) -> None:
        """One replica fewer wanted on `node_id` (one was drained there); elastic: one fewer in
        all, never below the minimum (a drained node's replica is then started elsewhere)."""
        self._retired[node_id] = self._retired.get(node_id, 0) + 1
        if self.target is not None and self.elastic is not None:  # (elastic: both set)
            self.target = max(self.elastic.min_replicas, self.target - 1)

    def release(self) -> None:
        """Elastic: one replica fewer in all (an idle one stopped)."""
        assert self.elastic is not None and self.target is not None  # (elastic only)
        self.target = max(self.elastic.min_replicas, self.target - 1)

    def shutdown(self) -> None:
        for actor, _, _ in self._starting:
            self.ray.kill(actor)
        if self.started:
            self.ray.shutdown()


def build_manager(request: ServeRequest) -> SessionManager:
    """`serve --cluster auto|local|ray://HOST:10001|HOST:6379`: replicas on that cluster, the
    sessions over them."""
    choice = request.cluster
    try:
        import ray  # noqa: F401
    except ImportError:
        raise StreamStudioError("serve --cluster needs Ray: pip install 'streamstudio[ray]'") from None
    if request.gpus != 1:
        raise StreamStudioError("--gpus and --cluster do not go together: with --cluster every GPU of the cluster "
                                "gets a replica")
    aliases: dict[str | None, str | None] = {"auto": os.environ.get("RAY_ADDRESS") or None, "local": None}
    address = aliases.get(choice, choice)
    elastic = None
    if request.max_replicas is not None:
        elastic = ElasticPolicy(request.min_replicas or 1, request.max_replicas, request.replica_idle_release).check()
    elif request.min_replicas is not None:
        raise StreamStudioError("--min-replicas goes with --max-replicas (elastic replicas)")
    cluster = RayReplicas(request, address, node_replicas=request.node_replicas, transport=request.replica_transport,
                          elastic=elastic)
    try:
        return SessionManager(placement=RayPlacement(cluster, request.max_streams), max_streams=request.max_streams,
                              idle_timeout=request.idle_timeout)
    except BaseException:
        cluster.shutdown()
        raise


