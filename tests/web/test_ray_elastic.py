"""Elastic replicas on Ray (`serve --cluster --max-replicas`, app/web/ray_cluster.py, issue 47): the
policy's arithmetic, and on a local Ray one replica that grows to two when it is full and goes
back to one when the second has held no stream for its idle time."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from helpers import frame, wait_for_sync

from streamstudio.app.web.ray_cluster import ElasticPolicy
from streamstudio.app.web.sessions import BusyError
from streamstudio.errors import StreamStudioError

pytestmark = pytest.mark.timeout(300)


def test_grow_only_when_every_replica_is_full_below_the_maximum_and_none_is_starting():
    policy = ElasticPolicy(min_replicas=1, max_replicas=3, release_idle_s=10).check()
    assert policy.grow([2, 2], per_replica=2, starting=0)
    assert not policy.grow([2, 1], per_replica=2, starting=0)  # room left on one
    assert not policy.grow([2, 2], per_replica=2, starting=1)  # one is on its way
    assert not policy.grow([2, 2, 2], per_replica=2, starting=0)  # at the maximum


def test_release_the_longest_idle_replica_after_its_idle_time_never_below_the_minimum():
    policy = ElasticPolicy(min_replicas=1, max_replicas=3, release_idle_s=10).check()
    assert policy.release({0: 1, 1: 0, 2: 0}, starting=0, now=100.0) is None  # idle from now on
    assert policy.release({0: 1, 1: 0, 2: 1}, starting=0, now=105.0) is None  # 2 got a stream: its clock stops
    assert policy.release({0: 1, 1: 0, 2: 0}, starting=0, now=109.0) is None  # 1 idle 9 s
    assert policy.release({0: 1, 1: 0, 2: 0}, starting=1, now=111.0) is None  # not while one starts
    assert policy.release({0: 1, 1: 0, 2: 0}, starting=0, now=112.0) == 1  # idle 12 s, 2 only 3 s
    assert policy.release({0: 0}, starting=0, now=500.0) is None  # the minimum stays however idle
    for bad, words in (((0, 2), "at least 1"), ((3, 2), "below --min-replicas")):
        with pytest.raises(StreamStudioError, match=words):
            ElasticPolicy(*bad).check()


def test_min_replicas_alone_is_refused(monkeypatch):
    pytest.importorskip("ray")
    from streamstudio.app.cli import build_parser
    from streamstudio.app.cli.requests import serve_request
    from streamstudio.app.web.ray_cluster import build_manager

    args = build_parser().parse_args(["serve", "--model", "tiny", "--cluster", "local", "--min-replicas", "2"])
    with pytest.raises(StreamStudioError, match="goes with --max-replicas"):
        build_manager(serve_request(args))



def test_a_full_cluster_grows_by_a_replica_and_an_idle_one_is_released():
    """One CPU replica of the tiny model, one stream each, at most two: a second stream is told
    another replica is starting, gets it once it is ready, and after that stream ends its replica
    stops again (idle 2 s); the first stream runs on throughout."""
    pytest.importorskip("ray")
    import live_server
    from streamstudio.app.web import ray_replicas

    watch, ray_replicas.WATCH_S = ray_replicas.WATCH_S, 0.3
    server = live_server.start("--cluster", "local", "--node-replicas", "2", "--max-replicas", "2",
                               "--replica-idle-release", "2", "--max-streams", "1", "--device", "cpu")
    stop = threading.Event()
    try:
        manager, placement = server.manager, server.manager.placement
        assert len(placement.replicas) == 1 and placement.cluster.target == 1  # the minimum at the start
        a = manager.open("ea")

        def pump():
            k = 0
            while not stop.is_set():
                a.submit(frame((9 * k) % 256, 64, 64))
                k += 1
                time.sleep(0.05)

        feeder = threading.Thread(target=pump, daemon=True)
        feeder.start()
        assert wait_for_sync(lambda: a.processed >= 2, 90)
        with pytest.raises(BusyError, match="another is starting"):
            manager.open("eb")
        assert wait_for_sync(lambda: len(placement.healthy()) == 2, 120), placement.stats()
        b = manager.open("eb")
        assert placement.replica_of("eb") is not placement.replica_of("ea")
        startup = placement.replica_of("eb").stats()["startup"]  # where its start-up went
        assert set(startup) == {"process_s", "load_s", "ready_s"} and 0 < startup["load_s"] < startup["ready_s"]
        b.submit(frame(40, 64, 64))
        assert wait_for_sync(lambda: b.processed >= 1, 60) and b.error is None
        manager.close("eb")
        assert wait_for_sync(lambda: len(placement.replicas) == 1, 30), placement.stats()
        assert placement.released == 1 and placement.cluster.target == 1
        seen = a.processed
        assert wait_for_sync(lambda: a.processed >= seen + 3, 30) and a.error is None
        replicas = httpx.get(server.url + "/studio/status", timeout=10).json()["replicas"]
        assert len([r for r in replicas if r["healthy"]]) == 1
        assert "streamstudio_replicas_released_total 1" in httpx.get(server.url + "/metrics", timeout=10).text
    finally:
        stop.set()
        server.close()
        ray_replicas.WATCH_S = watch


def test_a_rolling_update_replaces_every_replica_with_no_stream_dropped():
    """Two CPU replicas of the tiny model, a stream on each, fed throughout: `POST
    /studio/replicas/update {"model": "builtin"}` drains one replica, the watcher starts its
    replacement with the built-in model, then the other; both streams keep producing frames and
    end on built-in replicas with their settings; a bad update is refused at once."""
    pytest.importorskip("ray")
    import live_server
    from streamstudio.app.web import ray_replicas

    watch, ray_replicas.WATCH_S = ray_replicas.WATCH_S, 0.3
    server = live_server.start("--cluster", "local", "--node-replicas", "2", "--max-streams", "2",
                               "--device", "cpu")
    stop = threading.Event()
    try:
        manager, placement = server.manager, server.manager.placement
        a, b = manager.open("ua"), manager.open("ub")
        b.request({"seed": 11})

        def pump():
            k = 0
            while not stop.is_set():
                for s in (a, b):
                    s.submit(frame((5 * k) % 256, 64, 64))
                k += 1
                time.sleep(0.05)

        feeder = threading.Thread(target=pump, daemon=True)
        feeder.start()
        assert wait_for_sync(lambda: a.processed >= 2 and b.processed >= 2, 90)
        old = {r.index for r in placement.replicas}
        bad = httpx.post(server.url + "/studio/replicas/update", json={"width": 512}, timeout=10)
        assert bad.status_code == 400 and "cannot change width" in bad.json()["error"]
        r = httpx.post(server.url + "/studio/replicas/update", json={"model": "builtin"}, timeout=10)
        assert r.status_code == 202, r.text
        again = httpx.post(server.url + "/studio/replicas/update", json={"model": "tiny"}, timeout=10)
        assert again.status_code == 409
        state = placement.update.wait(240)
        assert state == {"status": "done", "changes": {"model": "builtin"}, "replaced": 2, "of": 2, "error": None}
        replicas = httpx.get(server.url + "/studio/status", timeout=10).json()
        assert [r["model"] for r in replicas["replicas"]] == ["builtin", "builtin"]
        assert not old & {r.index for r in placement.replicas} and replicas["update"]["status"] == "done"
        seen = a.processed, b.processed
        assert wait_for_sync(lambda: a.processed >= seen[0] + 3 and b.processed >= seen[1] + 3, 60)
        assert a.error is None and b.error is None and b.stats()["settings"]["seed"] == 11
        assert replicas["model"] == "builtin"  # new streams' banner
    finally:
        stop.set()
        server.close()
        ray_replicas.WATCH_S = watch
