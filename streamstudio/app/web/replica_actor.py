"""One model replica in its own process (a Ray actor, `serve --cluster`): the model loaded once,
with its own batching executor, and the frame steps of the streams the front end placed on it,
run a round at a time (app/web/ray_replicas.py is the front end's side)."""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from streamstudio.app.streams.requests import ServeRequest
from streamstudio.app.web.sessions import ServerModel, StreamProcessor
from streamstudio.errors import StreamStudioError
from streamstudio.models.hub import first_line
from streamstudio.app.streams import build_pipeline

log = logging.getLogger(__name__)

HEALTH_SID = "__health__"  # the health check's own stream: a frame of noise through the network


def first_error(exc: BaseException) -> str:
    """An exception in one line: its type and its message's first line."""
    return f"{type(exc).__name__}: {first_line(exc)}"


class ReplicaActor:
    """One model replica in its own process: the model loaded once (`ServerModel`, its own
    batching executor) and the frame steps of the streams placed on it, by stream id."""

    def __init__(self, request: ServeRequest, threads: int | None = None):
        self.init_at = time.time()  # the process is up and this module imported (a replica's start-up, in parts)
        if threads:
            torch.set_num_threads(threads)
        image = request.image
        pipe = build_pipeline(image, "img2img", serving=True)
        self.model = ServerModel(pipe.comps, pipe.config, prompt=image.prompt, negative_prompt=image.negative_prompt,
                                 latency_probe=request.latency_probe, batching=image.batching)
        self.steps: dict[str, StreamProcessor] = {}
        self._probe: StreamProcessor | None = None  # the health check's step (`health`), made at its first
        self.pool = ThreadPoolExecutor(max_workers=max(1, request.max_streams), thread_name_prefix="replica-stream")
        self.device = str(pipe.comps.device) if hasattr(pipe.comps, "device") else str(image.device)
        self.load_s = time.time() - self.init_at  # torch imported, the model loaded, its executor started

    def info(self) -> dict:
        """What the front end shows and needs: the process, its node, the model's description."""
        import ray

        context = ray.get_runtime_context()
        model = self.model
        return {"pid": os.getpid(), "node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "device": self.device, "name": model.name, "demo": model.is_demo, "config": model.config,
                "prompt": model.prompt, "negative_prompt": model.negative_prompt,
                "fixed_shapes": bool(model._stream_comps.net.fixed_shapes), "init_at": self.init_at,
                "load_s": self.load_s}

    def step(self, batch: list[dict]) -> dict:
        """One round: every request of `batch` (open, apply, frame, close, health; a stream's
        requests in order), the frames run together. Returns {"replies": {sid: reply}, "batching": ...}."""
        t0 = time.perf_counter()
        replies: dict[str, dict] = {}
        frames = []
        for request in batch:
            sid, op = request["sid"], request["op"]
            try:
                if op == "health":  # a frame of noise through the network, at the model's own size
                    frames.append((sid, *self._health()))
                    continue
                if op == "frame":
                    if sid not in self.steps:
                        raise StreamStudioError(f"stream {sid} is not open on this replica")
                    # (a copy: the frame is read from the channel's buffer, which the next round reuses)
                    frame = None if request["frame"] is None else np.array(request["frame"])
                    step = self.steps[sid]  # (kept: a close later in this round removes the stream)
                    frames.append((sid, step, self.pool.submit(step, frame)))
                    continue
                replies[sid] = self._control(sid, op, request)
            except StreamStudioError as exc:
                replies[sid] = {"error": str(exc)}
            except Exception as exc:  # a bug: said in the replica's log, the stream stops
                log.exception("stream %s: %s", sid, op)
                replies[sid] = {"error": f"{op} failed on the replica ({first_error(exc)})"}
        for sid, step, future in frames:
            if sid not in replies:  # (a close in the same round has answered for the stream)
                replies[sid] = self._frame_reply(step, future)
        if HEALTH_SID in replies:
            replies[HEALTH_SID].pop("frame", None)  # (only whether the network ran matters)
        return {"replies": replies, "batching": self.model.batching_stats(), "streams": len(self.steps),
                "step_ms": 1000 * (time.perf_counter() - t0)}

    def _health(self) -> tuple[StreamProcessor, object]:
        """The health check's step and its frame under way: a network fault (a device error, out of
        memory) shows in its reply as one of a stream's frame would (`replica_failed`), even when
        the actor itself still answers. Its similarity filter is off, so the network always runs."""
        width, height = self.model.size
        if self._probe is None:
            self._probe = StreamProcessor(self.model, "img2img", HEALTH_SID)
            self._probe.open((width, height))
            self._probe.apply({"similarity_filter": False})
        noise = np.random.default_rng().integers(0, 256, (height, width, 3), dtype=np.uint8)
        return self._probe, self.pool.submit(self._probe, noise)

    def _control(self, sid: str, op: str, request: dict) -> dict:
        if op == "open":
            step = self.steps[sid] = StreamProcessor(self.model, request["mode"], sid)
            step.open(tuple(request["size"]))
            if request.get("settings"):
                step.apply(request["settings"])
        elif op == "apply":
            if sid not in self.steps:
                raise StreamStudioError(f"stream {sid} is not open on this replica")
            self.steps[sid].apply(request["changes"])
        elif op == "close":
            self.steps.pop(sid, None)
        return {}

    def _frame_reply(self, step: StreamProcessor, future) -> dict:
        try:
            out = future.result()
        except StreamStudioError as exc:
            return {"error": str(exc)}
        except Exception as exc:  # the replica's network: a device fault, out of memory, ...
            log.exception("replica network failed")
            return {"error": f"{type(exc).__name__}: {exc}", "replica_failed": True}
        pipe = step.pipe
        assert pipe is not None  # (a stream steps once opened)
        return {"frame": out, "skipped": pipe.stats.skipped, "skip_rate": float(pipe.skip_rate),
                "latency_frames": pipe.latency_frames}

    def pid(self) -> int:
        return os.getpid()
