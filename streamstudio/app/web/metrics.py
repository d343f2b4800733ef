"""The server's Prometheus metrics: `GET /metrics` in the text exposition format (0.0.4), for a
Prometheus scrape or any tool that reads it. Behind the control door like every /studio route
(with `--whip-token` or `--auth`, a scrape sends the token: `authorization: {credentials: ...}`).

Streams are labelled by their public name (a WHIP publisher's or `--input`'s name, else the watch
id), never by the id that controls a page's stream. With replicas (`--gpus`, `--cluster`) each
replica's streams and health, and the streams moved off failed replicas and rebalanced."""

from __future__ import annotations

from fastapi.responses import Response

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: object) -> str:
    """A label value escaped as the format asks (backslash, double quote, newline)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Text:
    """Metric families written one after another: HELP and TYPE once, then each sample."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: list[tuple[dict, float]]) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{inner}}} {float(value):g}" if inner else f"{name} {float(value):g}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render(manager, outputs=None) -> str:
    """The metrics of `manager` (sessions.SessionManager or a replica manager) and `outputs`."""
    out = _Text()
    sessions = [s for s in map(manager.get, manager.ids()) if s is not None]
    out.family("streamstudio_streams", "gauge", "Live streams running.", [({}, len(sessions))])
    out.family("streamstudio_max_streams", "gauge", "Live streams the server takes at most.",
               [({}, manager.max_streams)])
    named = [(s.public_name, s.metrics()) for s in sessions]
    out.family("streamstudio_stream_fps", "gauge", "A stream's output frames per second now.",
               [({"stream": n}, m.recent_fps) for n, m in named])
    out.family("streamstudio_stream_latency_ms", "gauge", "A stream's frame-in to frame-out latency now.",
               [({"stream": n}, m.recent_latency_ms) for n, m in named if m.recent_latency_ms is not None])
    out.family("streamstudio_stream_frames_out_total", "counter", "Frames a stream has put out.",
               [({"stream": n}, m.frames_out) for n, m in named])
    out.family("streamstudio_stream_dropped_total", "counter", "Frames a stream dropped (newer ones came).",
               [({"stream": n}, m.dropped) for n, m in named])
    out.family("streamstudio_stream_failed", "gauge", "1 for a stream stopped by an error, until it is freed.",
               [({"stream": s.public_name}, s.error is not None) for s in sessions])
    out.family("streamstudio_peer_connections", "gauge", "WebRTC peer connections by kind.",
               [({"kind": k}, count()) for k, count in manager.peer_counters.items()])
    out.family("streamstudio_pending_connections", "gauge", "Connections holding a slot that do not stream yet.",
               [({}, len(manager.pending_connections()))])
    if outputs is not None:
        out.family("streamstudio_outputs", "gauge", "Running outputs (RTMP, HLS, file, NDI) by kind.",
                   [({"kind": k}, n) for k, n in outputs.counts().items()])
    _replicas(out, manager)
    return out.text()


def _replicas(out: _Text, manager) -> None:
    placement, replicas = manager.placement, manager.placement.stats()
    if replicas is None:
        return
    out.family("streamstudio_replica_streams", "gauge", "Streams placed on a model replica.",
               [({"replica": r["replica"]}, r["sessions"]) for r in replicas])
    out.family("streamstudio_replica_healthy", "gauge", "1 for a replica that runs, 0 for one that failed.",
               [({"replica": r["replica"]}, r["failed"] is None) for r in replicas])
    for name, attr, text in (("streamstudio_stream_moves_total", "moves", "Streams moved off failed replicas."),
                             ("streamstudio_stream_rebalances_total", "rebalances", "Streams moved to even the load."),
                             ("streamstudio_replicas_released_total", "released",
                              "Idle replicas stopped (elastic replicas).")):
        if hasattr(placement, attr):
            out.family(name, "counter", text, [({}, getattr(placement, attr))])


def mount(app, manager, outputs=None) -> None:
    """`GET /metrics` on `app` (FastAPI)."""
    @app.get("/metrics", tags=["studio"])
    async def metrics():
        return Response(render(manager, outputs), media_type=CONTENT_TYPE)
