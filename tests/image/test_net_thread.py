"""One thread for every network call of a shared model (models/image/net_thread.py): sessions that
take turns on a GPU model no longer call the networks from their own threads (cuDNN tunes per
thread), and their frames are the same as without it."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from helpers import frame, wait_output

from streamstudio.app.web.sessions import ServerModel, SessionManager
from streamstudio.models.image.image_net import ImageNet
from streamstudio.models.image.net_thread import NetworkThread
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig


def test_calls_from_many_threads_run_on_one_in_the_callers_modes():
    thread = NetworkThread("net-test")
    seen: list[tuple[str, bool, bool]] = []

    def call(x):
        seen.append((threading.current_thread().name, torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return x + 1

    def caller(i):
        with torch.inference_mode(i % 2 == 0):
            assert thread.run(call, i) == i + 1

    callers = [threading.Thread(target=caller, args=(i,)) for i in range(6)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(10)
    with torch.no_grad():
        thread.run(call, 0)
    assert len({name for name, _, _ in seen}) == 1 and seen[0][0].startswith("net-test")
    assert sorted(inf for _, inf, _ in seen[:6]) == [False] * 3 + [True] * 3  # each caller's own mode
    assert seen[-1][2] is False  # no_grad went along
    assert thread.run(lambda: thread.run(call, 1)) == 2  # a call inside a call does not deadlock
    with pytest.raises(ZeroDivisionError):
        thread.run(lambda: 1 / 0)  # the worker's error reaches the caller
    thread.close()


@pytest.fixture(scope="module")
def comps():
    from streamstudio.models.image.loading import load_components

    torch.set_num_threads(1)
    return load_components("tiny", device="cpu", dtype=torch.float32)


CONFIG = StreamDiffusionConfig(width=64, height=64, steps=2, strength=0.6)


def run_session(model: ServerModel, frames) -> list[np.ndarray]:
    manager = SessionManager(model, max_streams=2, idle_timeout=30.0)
    try:
        session, outs = manager.open("a"), []
        for i, f in enumerate(frames):
            session.submit(f)
            outs.append(wait_output(session, count=i + 1).copy())
        return outs
    finally:
        manager.shutdown()


def test_sessions_taking_turns_call_the_networks_from_one_thread_with_the_same_frames(comps, monkeypatch):
    frames = [frame(value=60 * i, h=64, w=64) for i in range(3)]
    plain = run_session(ServerModel(comps, CONFIG, prompt="a cat", network_thread=False), frames)

    threads: set[str] = set()
    real = type(comps.net).eps

    def recording(self, *args):
        threads.add(threading.current_thread().name)
        return real(self, *args)

    monkeypatch.setattr(type(comps.net), "eps", recording)
    model = ServerModel(comps, CONFIG, prompt="a cat", network_thread=True)
    threaded = run_session(model, frames)
    second = run_session(model, frames)  # another session, another runner thread: the same network thread
    model.close()
    assert threads == {model.thread.thread_name} and model.thread.calls > 0
    for a, b, c in zip(plain, threaded, second):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_a_gpu_model_taking_turns_gets_the_thread_and_a_batching_one_does_not(comps, monkeypatch):
    """The GPU branch, with the device faked: on CUDA the thread is the default when taking turns."""
    from streamstudio.models.image.batching import BatchingConfig

    monkeypatch.setattr(type(comps.net), "device", property(lambda self: torch.device("cuda")))
    turns = ServerModel(comps, CONFIG, network_thread=None)
    batched = ServerModel(comps, CONFIG, batching=BatchingConfig(warm_up=False), network_thread=None)
    assert turns.thread is not None and isinstance(turns._stream_comps.net, ImageNet)
    assert type(turns._stream_comps.net.inner) is type(comps.net)
    assert "network calls on one thread" in turns._stream_comps.notes
    assert batched.thread is None and batched.executor is not None
    turns.close()
    batched.close()
    monkeypatch.undo()
    assert ServerModel(comps, CONFIG).thread is None  # on CPU: no thread unless asked
