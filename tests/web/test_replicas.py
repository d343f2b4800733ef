"""`serve --gpus N` (app/web/replicas.py): sessions over N model replicas (CPU replicas of the tiny
model here): least-loaded placement, busy only when every replica is full, a failed replica's
sessions stop with a clear error while the others keep streaming, reconnects go elsewhere."""

from __future__ import annotations

import time

import pytest
import torch
from helpers import frame, wait_output

from streamstudio.models.image.batching import BatchingConfig
from streamstudio.app.web.replicas import LocalReplicas, ReplicaModel, replica_devices
from streamstudio.app.web.sessions import BusyError, SessionManager
from streamstudio.errors import StreamStudioError
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig


@pytest.fixture
def manager(tiny_components_factory):
    torch.set_num_threads(1)
    models = [ReplicaModel(tiny_components_factory(), StreamDiffusionConfig(width=64, height=64, steps=2),
                           prompt="a cat", batching=BatchingConfig()) for _ in range(2)]
    m = SessionManager(placement=LocalReplicas(models, ["cpu", "cpu"], 2), idle_timeout=30.0)
    yield m
    m.shutdown()


def test_sessions_go_to_the_least_loaded_replica_and_busy_only_when_all_are_full(manager):
    sessions = [manager.open(f"s{i}") for i in range(4)]
    assert [manager.placement.replica_of(s.sid).index for s in sessions] == [0, 1, 0, 1]
    assert not manager.has_capacity()
    with pytest.raises(BusyError, match="all 2 model replica"):
        manager.open("s4")
    manager.close("s1")
    assert manager.placement.replica_of(manager.open("s5").sid).index == 1  # the replica with room
    for s in sessions[:1]:
        s.submit(frame())
        wait_output(s)


def test_a_failed_replica_ends_only_its_own_sessions(manager, monkeypatch):
    a, b, c = (manager.open(sid) for sid in ("a", "b", "c"))  # replicas 0, 1, 0
    broken = manager.placement.replicas[1].model.comps.unet

    def fault(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(broken, "forward", fault)
    for s in (a, b, c):
        s.submit(frame())
    wait_output(a)
    deadline = time.monotonic() + 20
    while b.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "model replica 1 (cpu) failed (RuntimeError: CUDA error" in b.error and "reconnect" in b.error
    for n, value in enumerate((40, 80, 120), start=2):  # the other replica's sessions go on
        a.submit(frame(value))
        c.submit(frame(value))
        wait_output(a, n)
    wait_output(c, 2)
    assert a.error is None and c.error is None
    with pytest.raises(BusyError, match="all 1 model replica"):
        manager.open("d")  # replica 0 is full and the failed replica takes nobody
    manager.close("b")
    manager.close("c")
    d = manager.open("d")  # a reconnect: on the healthy replica
    assert manager.placement.replica_of("d").index == 0
    d.submit(frame())
    wait_output(d)
    manager.placement.replicas[0].model.executor.close()  # the last replica's executor ends: nothing takes streams
    manager.close("a")
    with pytest.raises(BusyError, match="every model replica failed"):
        manager.open("f")


def test_replica_devices(monkeypatch):

    assert replica_devices(3, "cpu") == ["cpu"] * 3
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert replica_devices(2, "auto") == ["cuda:0", "cuda:1"]
    with pytest.raises(StreamStudioError, match="--gpus 4, but this machine has 2 CUDA GPU"):
        replica_devices(4, "auto")


def test_serve_gpus_builds_a_replica_per_device():
    from streamstudio.app.cli import build_parser
    from streamstudio.app.cli.requests import serve_request
    from streamstudio.app.web.replicas import build_manager

    args = build_parser(["serve"]).parse_args(["serve", "--model", "tiny", "--gpus", "2", "--device", "cpu",
                                               "--width", "64", "--height", "64", "--max-streams", "3"])
    manager = build_manager(serve_request(args))
    try:
        a, b = manager.placement.replicas
        assert (a.device, b.device, manager.placement.per_replica, manager.max_streams) == ("cpu", "cpu", 3, 6)
        # own model, own batching
        assert a.model.comps is not b.model.comps and a.model.executor is not b.model.executor
        assert manager.model is a.model
    finally:
        manager.shutdown()
