"""The latency offset of a stream's audio features (issue 48): audio is read this much later than
it was captured, so a change lands on the beat the audience hears. By default it is the stream's
measured glass-to-glass latency, per stream, updated as it changes:

- the server's part, measured: a frame's time from its arrival to its output (the runner's
  `recent_latency_ms`: the mean over its last 30 outputs);
- the path to the viewer: half the round-trip time the WHEP viewers' RTCP receiver reports give
  (their mean, when any has reported), plus VIEWER_PLAYOUT_S assumed for the viewer's jitter
  buffer, decoding and display (a receiver report carries the RTT and the interarrival jitter, not
  the jitter buffer's delay: aiortc cannot know it). Without a report (the page's own WebRTC view,
  or no viewer yet) the path is VIEWER_PLAYOUT_S alone.

Before the stream's first output nothing is measured: ASSUMED_SERVER_S is taken for the server's
part. An offset that is set wins: a stream's own (`"latency_ms"` in its modulations), else the
server's (`serve --audio-latency-ms`). `offset(stream)` says the figure in use and where it came
from ("set", "measured", or "assumed")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

VIEWER_PLAYOUT_S = 0.05  # assumed: a viewer's jitter buffer, decoding and display (not reported over RTCP)
ASSUMED_SERVER_S = 0.05  # assumed for frame in -> frame out before a stream's first output
REFRESH_S = 0.5  # a measured offset is looked at again this often (not at every frame)
REPORT_TTL_S = 10.0  # a viewer's RTT older than this is no longer counted (the viewer went silent)


class LatencyOffsets:
    """Each stream's audio latency offset. `sessions(name)` gives a stream's session (its
    `metrics()` and `modulations`), or None; `set_s` is the server's own setting (None: measured)."""

    def __init__(self, sessions: Callable[[str], object] | None = None, set_s: float | None = None):
        self.sessions, self.set_s = sessions, set_s
        self._rtt: dict[str, dict[str, tuple[float, float]]] = {}  # stream -> viewer -> (RTT s, when)
        self._cache: dict[str, tuple[float, dict]] = {}  # stream -> (when, the measured offset)
        self._lock = threading.Lock()

    def viewer_rtt(self, stream: str, viewer: str, rtt_s: float | None) -> None:
        """A viewer's round-trip time from its RTCP receiver reports (None: gone, or none yet)."""
        with self._lock:
            viewers = self._rtt.setdefault(stream, {})
            if rtt_s is None:
                viewers.pop(viewer, None)
            else:
                viewers[viewer] = (float(rtt_s), time.monotonic())

    def forget(self, stream: str) -> None:
        with self._lock:
            self._rtt.pop(stream, None)
            self._cache.pop(stream, None)

    def seconds(self, stream: str) -> float:
        return self.offset(stream)["ms"] / 1000.0

    def offset(self, stream: str) -> dict:
        """{"ms", "source": "set" | "measured" | "assumed", and how it was made up}."""
        session = self.sessions(stream) if self.sessions is not None else None
        own = getattr(getattr(session, "modulations", None), "latency_ms", None)
        if own is not None:
            return {"ms": float(own), "source": "set", "by": "the stream's modulations (latency_ms)"}
        if self.set_s is not None:
            return {"ms": round(1000.0 * self.set_s, 1), "source": "set", "by": "serve --audio-latency-ms"}
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(stream)
        if cached is not None and now - cached[0] < REFRESH_S:
            return cached[1]
        said = self._measure(stream, session, now)
        with self._lock:
            self._cache[stream] = (now, said)
        return said

    def _measure(self, stream: str, session, now: float) -> dict:
        metrics = getattr(session, "metrics", None)
        server_ms = getattr(metrics(), "recent_latency_ms", None) if callable(metrics) else None
        with self._lock:
            rtts = [rtt for rtt, when in self._rtt.get(stream, {}).values() if now - when < REPORT_TTL_S]
        playout_ms = 1000.0 * VIEWER_PLAYOUT_S
        if rtts:
            half_rtt_ms = 1000.0 * sum(rtts) / len(rtts) / 2
            path = (f"RTT/2 {half_rtt_ms:.1f} ms (RTCP receiver reports of {len(rtts)} WHEP viewer(s)) + "
                    f"{playout_ms:.0f} ms assumed for the viewer's jitter buffer and display")
        else:
            half_rtt_ms = 0.0
            path = f"no viewer's RTCP report: {playout_ms:.0f} ms assumed for the viewer's jitter buffer and display"
        path_ms = half_rtt_ms + playout_ms
        source = "measured" if server_ms is not None else "assumed"
        if server_ms is None:
            server_ms = 1000.0 * ASSUMED_SERVER_S
        return {"ms": round(server_ms + path_ms, 1), "source": source, "server_ms": round(server_ms, 1),
                "path_ms": round(path_ms, 1), "path": path}
