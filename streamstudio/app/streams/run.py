"""Running a stream to its end from the command line: a progress bar of the frames written
(offline) or a stats line once a second (live), Ctrl-C closing the output; and the RTMP
output's timeouts from the command line."""

from __future__ import annotations

import sys
import time

from streamstudio.errors import StreamStudioError


def rtmp_config(seconds: float | None):
    """The RTMP output's timeouts from --rtmp-timeout `seconds` (None: the sink's defaults)."""
    from streamstudio.streaming.rtmp import RtmpConfig

    return None if seconds is None else RtmpConfig(connect_timeout=seconds, io_timeout=seconds)


def expected_frames(count: int | None, max_frames: int | None) -> int | None:
    """How many frames a run will write, for its progress bar (None: not known)."""
    if count and max_frames:
        return min(count, max_frames)
    return count or max_frames


def watch(runner, total: int | None, live: bool = False, desc: str = "render", unit: str = "frame"):
    """Run `runner` to its end and return its RunMetrics, with a progress bar of the frames
    written (tqdm on stderr; offline runs) or a live stats line once a second (live runs). Every
    front end's run goes through here. Ctrl-C stops the run, closing its output, then goes on."""
    try:
        runner.start()
        if live:
            _watch_live(runner)
        else:
            _watch_offline(runner, total, desc, unit)
    except KeyboardInterrupt:
        runner.stop()
        try:
            runner.wait(runner.config.join_timeout * 3)
        except StreamStudioError as exc:  # the interrupt is what goes on; the stage's error is said
            print(f"\nerror: {exc}", file=sys.stderr)
        raise
    return runner.metrics()


def _watch_offline(runner, total: int | None, desc: str, unit: str) -> None:
    from tqdm import tqdm

    with tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True) as bar:
        done = False
        while not done:
            done = runner.wait(0.25)
            bar.update(runner.metrics().frames_out - bar.n)


def _watch_live(runner) -> None:
    last = 0.0
    while not runner.wait(0.25):
        if time.perf_counter() - last >= 1.0:
            last = time.perf_counter()
            print(f"\r{_live_line(runner.metrics())}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


def _live_line(m) -> str:
    lat = m.latency_ms.get("end_to_end", {})
    return (f"in {m.input_fps:5.1f} fps | out {m.output_fps:5.1f} fps | latency p50 {lat.get('p50', 0):6.1f} ms "
            f"p90 {lat.get('p90', 0):6.1f} ms | dropped {m.dropped} | skipped {m.filter_skipped} | lost {m.sink_lost}")
