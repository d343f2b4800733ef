"""The threaded runner: frame alignment offline, drops in live mode, failures and Ctrl-C."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pytest
from clips import make_clip, probe

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.processor import IdentityProcessor
from streamstudio.streaming.runner import (
    Closed,
    FrameQueue,
    Runner,
    RunnerConfig,
    percentiles,
    run_stream,
)
from streamstudio.streaming.sink_base import Sink
from streamstudio.streaming.sinks import open_sink
from streamstudio.streaming.sources import (
    ArraySource,
    PatternSource,
    PushSource,
    open_source,
)


class ListSink(Sink):
    def __init__(self, width=16, height=16, fps=10):
        super().__init__("list", width, height, fps)
        self.frames, self.pts = [], []

    def write(self, frame, pts=None):
        self.frames.append(frame)
        self.pts.append(pts)
        self.status.frames_written += 1


class DelayedProcessor:
    """Frame-aligned with a delay of `delay` frames (as Stream Batch), adds 1 to every pixel."""

    def __init__(self, delay=2):
        self.delay, self.buf = delay, []

    def push(self, frame):
        self.buf.append(frame + 1)
        return [self.buf.pop(0)] if len(self.buf) > self.delay else []

    def flush(self):
        out, self.buf = self.buf, []
        return out

    def __call__(self, frame):
        return frame + 1


def indexed_frames(n, h=8, w=8):
    return [np.full((h, w, 3), i, np.uint8) for i in range(n)]


def test_offline_output_frame_i_is_input_frame_i():
    timestamps = [0.0, 0.1, 0.25, 0.3, 0.5, 0.55, 0.9]  # variable frame rate
    src = ArraySource(indexed_frames(7), fps=10, timestamps=timestamps)
    sink = ListSink()
    metrics = run_stream(src, DelayedProcessor(delay=3), sink)
    assert [int(f[0, 0, 0]) for f in sink.frames] == [i + 1 for i in range(7)]
    assert sink.pts == timestamps
    assert (metrics.frames_in, metrics.frames_processed, metrics.frames_out, metrics.dropped) == (7, 7, 7, 0)
    assert sink.status.closed


def test_offline_file_to_file_keeps_count_timing_and_audio(tmp_path):
    clip = make_clip(tmp_path / "in.mp4", n=24, fps=12, audio=True)
    src = open_source(str(clip))
    metrics = run_stream(src, DelayedProcessor(delay=1),
                         lambda w, h: open_sink(str(tmp_path / "out.mp4"), w, h, src.info.fps, src.info.audio))
    assert metrics.frames_out == 24
    out, ref = probe(tmp_path / "out.mp4"), probe(clip)
    assert out.frames == 24 and out.video_pts == pytest.approx(ref.video_pts, abs=1e-3)
    assert out.duration == pytest.approx(ref.duration, abs=0.02)
    assert out.audio_duration == pytest.approx(ref.audio_duration, abs=0.03)


def test_max_frames_stops_early():
    sink = ListSink()
    metrics = run_stream(ArraySource(indexed_frames(20)), IdentityProcessor(), sink, max_frames=5)
    assert metrics.frames_out == 5 and len(sink.frames) == 5


def test_live_mode_drops_oldest_frames_under_a_slow_processor():
    class Slow:
        def __call__(self, frame):
            time.sleep(0.04)
            return frame

    src = PatternSource(32, 32, fps=100, count=60, realtime=True)
    sink = ListSink(32, 32, 100)
    metrics = run_stream(src, Slow(), sink)
    assert metrics.live
    assert metrics.dropped_input > 10
    assert metrics.frames_in == 60
    assert metrics.frames_processed + metrics.dropped_input == metrics.frames_in
    assert metrics.frames_out + metrics.dropped_output == metrics.frames_processed
    assert sink.pts == sorted(sink.pts)  # newest frames, in order
    # latency stays bounded by the small queue: a few processing times, not the whole backlog
    assert metrics.latency_ms["end_to_end"]["p50"] < 400


def test_a_file_played_live_is_paced_at_its_timestamps():
    src = ArraySource(indexed_frames(10), fps=20)  # not a live source: 0.45 s of frames
    sink = ListSink()
    t0 = time.perf_counter()
    metrics = Runner(src, IdentityProcessor(), sink, RunnerConfig(live=True)).run()
    assert time.perf_counter() - t0 >= 0.4
    assert metrics.frames_out == 10 and metrics.dropped == 0


def test_live_mode_reports_filter_skips():
    @dataclass
    class Stats:
        skipped: int = 0

    class Skipper:
        stats = Stats()

        def push(self, frame):
            self.stats.skipped += 1
            return [frame]

        def flush(self):
            return []

    metrics = run_stream(ArraySource(indexed_frames(5)), Skipper(), ListSink())
    assert metrics.filter_skipped == 5


def test_a_failing_processor_stops_the_run_with_a_clear_error_and_closes_the_output(tmp_path):
    class Broken(DelayedProcessor):
        def push(self, frame):
            if int(frame[0, 0, 0]) == 10:
                raise RuntimeError("model exploded")
            return super().push(frame)

    src = ArraySource([np.full((16, 16, 3), i, np.uint8) for i in range(40)], fps=10)
    out = tmp_path / "partial.mp4"
    t0 = time.perf_counter()
    with pytest.raises(StreamStudioError, match="process stage failed: RuntimeError: model exploded"):
        run_stream(src, Broken(delay=0), lambda w, h: open_sink(str(out), w, h, 10))
    assert time.perf_counter() - t0 < 10
    assert 1 <= probe(out).frames <= 10  # the frames before the failure, in a playable file


def test_a_failing_sink_stops_the_run():
    class BadSink(ListSink):
        def write(self, frame, pts=None):
            raise StreamStudioError("disk full")

    with pytest.raises(StreamStudioError, match="disk full"):
        run_stream(PatternSource(16, 16, fps=30, realtime=False), IdentityProcessor(), BadSink())


def test_processor_returning_too_many_frames_is_an_error():
    class Doubler(DelayedProcessor):
        def push(self, frame):
            return [frame, frame]

    with pytest.raises(StreamStudioError, match="more outputs"):
        run_stream(ArraySource(indexed_frames(3)), Doubler(), ListSink())


def test_stop_closes_the_output_and_the_partial_file_plays(tmp_path):
    src = PatternSource(32, 32, fps=25, realtime=True)  # endless
    out = tmp_path / "live.mp4"
    runner = Runner(src, IdentityProcessor(), lambda w, h: open_sink(str(out), w, h, 25)).start()
    time.sleep(0.6)
    runner.stop()
    assert runner.wait(10)
    metrics = runner.metrics()
    assert metrics.interrupted and metrics.frames_out > 3
    assert probe(out).frames == metrics.frames_out


def test_ctrl_c_during_run_closes_the_output(tmp_path, monkeypatch):
    """Ctrl-C reaches the main thread as a KeyboardInterrupt inside run()'s wait loop: it is
    raised there once 20 frames are processed (deterministic; `_thread.interrupt_main` from the
    processor thread was lost now and then late in the full suite). A real SIGINT to a running
    `render` is tests/cli/test_render_cli.py's."""
    class Slow:
        def __init__(self):
            self.n = 0

        def push(self, frame):
            self.n += 1
            time.sleep(0.01)
            return [frame]

        def flush(self):
            return []

    out = tmp_path / "cut.mp4"
    src = ArraySource([np.full((16, 16, 3), i % 256, np.uint8) for i in range(400)], fps=25)
    proc = Slow()
    runner = Runner(src, proc, lambda w, h: open_sink(str(out), w, h, 25))
    real_wait, fired = runner.wait, []

    def wait(timeout=None):
        if proc.n >= 20 and not fired:
            fired.append(proc.n)
            raise KeyboardInterrupt  # what Ctrl-C does to the waiting main thread
        return real_wait(timeout)

    monkeypatch.setattr(runner, "wait", wait)
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert 20 <= proc.n < 400  # stopped soon after the interrupt, not at the end of the input
    written = runner.metrics().frames_out
    assert 1 <= written < 400
    assert probe(out).frames == written


def test_a_stuck_processor_does_not_hang_the_stop():
    class Stuck:
        def __call__(self, frame):
            time.sleep(3)
            return frame

    runner = Runner(PatternSource(16, 16, fps=30), Stuck(), ListSink(), RunnerConfig(join_timeout=0.3)).start()
    time.sleep(0.2)
    runner.stop()
    t0 = time.perf_counter()
    with pytest.raises(StreamStudioError, match="process did not stop within 0.3s"):
        runner.wait(5)
    assert time.perf_counter() - t0 < 3


def test_frame_queue_live_drops_oldest_offline_blocks():
    q = FrameQueue(2, live=True)
    for i in range(5):
        q.put(i)
    assert q.dropped == 3 and q.get() == 3 and q.get() == 4
    q.close()
    with pytest.raises(Closed):
        q.get()
    off = FrameQueue(1, live=False)
    off.put(1)
    t0 = time.perf_counter()
    off.abort()  # a blocked put would return at once after an abort
    assert off.put(2) is False and time.perf_counter() - t0 < 1


def test_percentiles():
    p = percentiles([0.001] * 90 + [0.1] * 10)
    assert p["p50"] == pytest.approx(1.0) and p["p99"] == pytest.approx(100.0)
    assert percentiles([]) == {"p50": 0.0, "p90": 0.0, "p99": 0.0}


def test_push_source_feeds_a_live_run_from_other_code():
    src = PushSource(16, 16, fps=30)
    sink = ListSink()
    runner = Runner(src, IdentityProcessor(), sink).start()
    for i in range(5):
        src.put(np.full((16, 16), i, np.uint8), pts=i / 30)  # grayscale in, RGB out
        time.sleep(0.02)
    src.close()
    assert runner.wait(5)
    assert runner.metrics().frames_out == len(sink.frames) >= 3
    assert sink.frames[-1].shape == (16, 16, 3) and int(sink.frames[-1][0, 0, 0]) == 4
    with pytest.raises(StreamStudioError):
        src.put(np.zeros((16, 16, 3), np.uint8))


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_sink_attached_to_a_running_run_gets_frames_until_detached():
    src = PushSource(16, 16, fps=30)
    runner = Runner(src, IdentityProcessor(), ListSink()).start()
    src.put(np.full((16, 16, 3), 1, np.uint8))
    wait_for(lambda: runner.metrics().frames_out == 1)
    late = ListSink()
    attachment = runner.attach(late)
    assert runner.attachments == [attachment] and late.frames == []  # only what comes after attaching
    for value in (2, 3):
        src.put(np.full((16, 16, 3), value, np.uint8))
        wait_for(lambda: len(late.frames) == value - 1)
    runner.detach(attachment)
    assert not attachment.running and late.status.closed and runner.attachments == []
    src.put(np.full((16, 16, 3), 4, np.uint8))
    wait_for(lambda: runner.metrics().frames_out == 4)
    assert [int(f[0, 0, 0]) for f in late.frames] == [2, 3] and attachment.frames == 2
    assert not attachment.ended and attachment.error is None  # detached, not ended with the run
    src.close()
    assert runner.wait(5)


def test_a_paced_attachment_writes_at_a_constant_rate_and_ends_with_the_run():
    src = PushSource(16, 16, fps=30)
    runner = Runner(src, IdentityProcessor(), ListSink()).start()
    paced = ListSink()
    attachment = runner.attach(paced, fps=50)
    src.put(np.full((16, 16, 3), 7, np.uint8))  # one frame: repeated at 50 fps
    wait_for(lambda: len(paced.frames) >= 10)
    assert all(int(f[0, 0, 0]) == 7 for f in paced.frames) and set(paced.pts) == {None}  # timestamps by the sink
    runner.stop(interrupted=False)
    wait_for(lambda: not attachment.running)
    assert attachment.ended and paced.status.closed and attachment.frames == len(paced.frames)
    with pytest.raises(StreamStudioError, match="ended"):
        runner.attach(ListSink())
    src.close()
    runner.wait(5)


class FailingSink(ListSink):
    def write(self, frame, pts=None):
        raise OSError("disk full")


def test_a_failing_attached_sink_ends_alone():
    src = PushSource(16, 16, fps=30)
    main = ListSink()
    runner = Runner(src, IdentityProcessor(), main).start()
    broken, good = runner.attach(FailingSink()), runner.attach(ListSink())
    src.put(np.zeros((16, 16, 3), np.uint8))
    wait_for(lambda: not broken.running)
    assert "disk full" in broken.error and broken.sink.status.closed and runner.attachments == [good]
    src.put(np.zeros((16, 16, 3), np.uint8))
    wait_for(lambda: len(main.frames) == 2 and good.frames == 2)
    assert runner.error is None and not runner.stopped
    src.close()
    assert runner.wait(5) and good.ended and good.sink.status.closed


def test_recent_metrics_follow_a_live_run():
    src = PushSource(16, 16, fps=30)
    runner = Runner(src, IdentityProcessor(), ListSink()).start()
    assert runner.metrics().recent_latency_ms is None
    for i in range(6):
        src.put(np.zeros((16, 16, 3), np.uint8))
        time.sleep(0.02)
    wait_for(lambda: runner.metrics().frames_out == 6)
    m = runner.metrics()
    assert 5 < m.recent_fps < 200 and m.recent_latency_ms > 0
    src.close()
    runner.wait(5)
