"""The live img2img frame as one replayable graph, with several frames in flight.

`StreamDiffusion.__call__` runs a frame as a chain of eager steps and ends it with a blocking
download, so on a GPU the host waits for every frame and prepares the next only after it: host
and GPU never overlap (issue 45). `FrameGraph` drives the same stream differently:

- static buffers: the frame's uint8 input on the device, the pipeline's buffers (the Stream Batch
  sampler updates its slots in place), and the uint8 output the frame leaves in;
- the whole frame (preprocess, encode, noise, UNet and step, decode, postprocess) captured once
  as one CUDA graph (`torch.cuda.CUDAGraph`) and replayed for every frame, so the host launches
  one graph instead of hundreds of kernels; networks compiled by torch.compile fit inside when
  compiled without their own CUDA graphs (`apply_acceleration(..., cuda_graphs=False)`);
- `depth` frames in flight: the upload goes through a pinned slot per frame in flight, the
  download into another, and each frame's end is a CUDA event. `submit` queues frame n and
  hands back frame n - depth + 1's output, so the host converts and uploads the next frame
  while the GPU runs this one.

The outputs are the stream's own: the same operations on the same buffers in the same order
(tests compare them with `StreamDiffusion.__call__`, on CPU and with the CUDA calls faked).
On a CPU the frame function runs directly, frames are not in flight, but the API is the same.

The similarity filter keeps its place: its decision needs the frame's similarity on the host,
so with the filter on, the upload, preprocess and comparison run on a side stream before the
graph and the host waits for that stream alone (a fraction of a millisecond), never for the
frames in flight; a skipped frame costs no replay and repeats the output before it.

It takes the frames a graph can hold: img2img with latent feedback, the
feature bank and ControlNets off (their per-frame decisions and uploads are host work). Other
frames, and the first frame of a Stream Batch stream (which primes the buffer), run through
`StreamDiffusion.__call__` in turn. A change of seed, steps, guidance or input size
captures the graph again at the next frame (it is keyed on what it was captured with); a new
prompt does not: the condition lives in buffers the graph reads, and a new one is copied in.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext as _nothing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from streamstudio import kernels
from streamstudio.errors import StreamStudioError
from streamstudio.frames import ImagesLike, to_frames
from streamstudio.models.image.image_net import ImageCond
from streamstudio.pipelines.image.stream_batch import PRIMED, Guidance

if TYPE_CHECKING:
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion

Output = np.ndarray | list[np.ndarray]  # a frame's output: (H, W, 3) uint8, or k of them (frame_buffer_size k > 1)

WARMUP_RUNS = 3  # eager runs on a side stream before capture (cuDNN tuning, torch.compile), as PyTorch advises


class CudaCalls:
    """The CUDA calls of the graph path, in one place so tests can fake them on a CPU."""

    def pinned(self, shape: Sequence[int], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def event(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def side_stream(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.Stream(device)

    def on(self, stream):
        """A context in which work goes to `stream`."""
        return torch.cuda.stream(stream)

    def wait_for(self, stream: torch.cuda.Stream, tensor: torch.Tensor, device: torch.device) -> None:
        """The current stream waits for `stream`'s work so far; `tensor` (made there) is kept
        from reuse until the current stream's use of it is done."""
        current = torch.cuda.current_stream(device)
        current.wait_stream(stream)
        tensor.record_stream(current)

    def capture(self, fn: Callable[[], torch.Tensor],
                device: torch.device) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """fn() warmed up on a side stream, then captured; returns (graph, fn's output)."""
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # other threads may use the GPU
            out = fn()
        return graph, out


@dataclass
class _Pending:
    """A frame in flight: its output is in `host` once `done` has fired (or `ready` now)."""

    host: torch.Tensor | None = None  # (k, H, W, 3) uint8, pinned
    done: torch.cuda.Event | None = None  # CUDA event recorded after the download
    ready: Output | None = None  # an output the eager path already has
    repeat: bool = False  # a frame the similarity filter skipped: the output before it again


class FrameGraph:
    """Live frames of `stream` (a StreamDiffusion) through one captured graph, `depth` in flight.

    graphs: capture a CUDA graph (default: on a CUDA device). `calls` replaces the CUDA calls
    (tests fake them on a CPU)."""

    def __init__(self, stream: StreamDiffusion, depth: int = 2, graphs: bool | None = None,
                 calls: CudaCalls | None = None):
        if depth < 1:
            raise StreamStudioError(f"frames in flight must be at least 1, got {depth}")
        self.stream, self.depth = stream, depth
        self.graphs = stream.device.type == "cuda" if graphs is None else graphs
        self.calls = calls or CudaCalls()
        self.captures = 0  # graphs captured so far (a changed setting captures again)
        self.replays = 0  # frames run through the graph
        self._graph: torch.cuda.CUDAGraph | None = None
        self._key: tuple = ()
        self._input: torch.Tensor | None = None  # (k, H, W, C) uint8 on the device: the graph reads it
        self._output: torch.Tensor | None = None  # (k, H, W, 3) uint8 on the device: the graph writes it
        self._rows = 0  # UNet rows of one graphed frame (the stream's stats count them)
        self._slots = 0
        self._up: list[tuple[torch.Tensor, torch.cuda.Event | None]] = []  # pinned upload slot, its "copied" event
        self._down: list[torch.Tensor] = []  # pinned download slots
        self._pending: deque[_Pending] = deque()
        self._guidance: Guidance | None = None
        self._statics: dict[tuple[str, str], torch.Tensor] = {}  # the condition's buffers the graph reads
        self._x: torch.Tensor | None = None  # with the filter: the preprocessed input the graph reads
        self._side: torch.cuda.Stream | None = None  # with the filter on a GPU: uploads, preprocesses, compares
        self._last_collected: Output | None = None  # the newest output handed back (a skipped frame's output)
        self._produced = False  # a frame has gone in since the stream's buffer was (re)started

    # ------------------------------------------------------------------ which frames a graph takes
    def eligible(self) -> bool:
        """Whether the stream's next frame can run in the graph (else it runs eagerly)."""
        s, c = self.stream, self.stream.config
        if c.mode != "img2img" or c.uses_feedback or c.uses_bank:
            return False
        if s.addons.control is not None:  # per-frame control images and scales: host work
            return False
        return not (s.sampler.stream_batch and s.sampler._buffer is None)  # the first frame primes the buffer

    # ------------------------------------------------------------------ frames in and out
    def submit(self, image: ImagesLike) -> list[Output]:
        """Queue a frame; returns the finished outputs in order (none while the first frames are
        in flight): each a (H, W, 3) uint8 frame, or a list of k for frame_buffer_size k > 1."""
        if not self.eligible():
            out = self.stream(image)
            self._produced = self.stream._last_out is not None
            self._pending.append(_Pending(ready=out))
        else:
            self._pending.append(self._graph_frame(image))
        done = []
        while len(self._pending) > (self.depth - 1 if self.graphs else 0):
            done.append(self._collect(self._pending.popleft()))
        return done

    def __call__(self, image: ImagesLike) -> Output:
        """One frame in, its own output out (no frames in flight)."""
        outs = self.submit(image) + self.drain()
        return outs[-1]

    def drain(self) -> list[Output]:
        """Wait for every frame in flight; their outputs in order."""
        outs = [self._collect(p) for p in self._pending]
        self._pending.clear()
        return outs

    def _collect(self, p: _Pending) -> Output:
        out: Output
        if p.repeat:  # the frames go out in order: the one before this is the newest handed back
            last = self._last_collected
            assert last is not None  # (the first frame is never skipped)
            out = [f.copy() for f in last] if isinstance(last, list) else last.copy()
        elif p.ready is not None:
            out = p.ready
        else:
            if p.done is not None:
                p.done.synchronize()
            assert p.host is not None  # (a frame neither ready nor repeated was downloaded)
            frames = list(p.host.numpy().copy())  # the pinned slot is reused by a later frame
            self.stream._last_out = frames
            out = frames[0] if len(frames) == 1 else frames
        self._last_collected = out
        return out

    # ------------------------------------------------------------------ the graph
    def _graph_frame(self, image: ImagesLike) -> _Pending:
        s = self.stream
        frames = to_frames(image, s.config.frame_buffer_size)  # (k, H, W, C) uint8 on the host
        s.prompts.refresh(s.config.prompt_blend)
        guidance = Guidance(self._static_cond("text", s.prompts.cond(False)),
                            self._static_cond("negative", s.prompts.cond(True)), s.config.effective_cfg,
                            s.config.guidance_scale, s.config.delta)
        key = self._key_for(frames, guidance)
        if not self._same_key(key):
            self._capture(frames, guidance, key)
        slot = self.replays % self._slots
        if s.config.similarity_filter:
            if self._filter_skips(frames, slot):
                s.stats.frames_in += frames.shape[0]
                s.stats.skipped += frames.shape[0]
                return _Pending(repeat=True)
        else:
            self._upload(frames, slot)
        self._produced = True
        if self.graphs:
            assert self._graph is not None and self._output is not None  # (captured above)
            self._graph.replay()
            output = self._output
            s.sampler.unet_rows += self._rows
        else:
            output = self._frame()
        self.replays += 1
        s.stats.frames_in += frames.shape[0]
        s.stats.calls += 1
        s.stats.unet_samples += self._rows
        return self._download(output, slot)

    def _filter_skips(self, frames: torch.Tensor, slot: int) -> bool:
        """The similarity filter's decision for `frames`, as `StreamDiffusion.__call__` makes it
        (the same input, the same draws). On a GPU the upload, preprocess and comparison run on a
        side stream and the host waits for that alone, not for the frames in flight; a frame
        that goes through is then copied into the graph's input."""
        s, c = self.stream, self.stream.config
        side = self._side_stream() if self.graphs else None
        with self.calls.on(side) if side is not None else _nothing(), torch.inference_mode():
            up = self._upload_to_device(frames, slot)
            x = kernels.preprocess(up, c.height, c.width, s.dtype)  # (k, 3, H, W) in [-1, 1]
            if self._produced and s._filter.should_skip(x):  # reads the similarity: syncs this stream only
                return True
            if not self._produced:
                s._filter.should_skip(x)  # the first frame: recorded as the last processed input
        if side is not None:
            self.calls.wait_for(side, x, s.device)
        assert self._x is not None  # (made by _capture)
        with torch.inference_mode():
            self._x.copy_(x)
        return False

    def _side_stream(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = self.calls.side_stream(self.stream.device)
        return self._side

    def _static_cond(self, name: str, cond: ImageCond) -> ImageCond:
        """`cond` with each tensor field copied into a buffer the graph keeps reading: a new prompt
        (or a prompt blend that moves every frame) is a copy into it, not a new graph. A field of
        another shape gets a new buffer (and so a new graph)."""
        fields: dict[str, Any] = {}  # field -> the buffer of that tensor field
        with torch.inference_mode():
            for f in dataclasses.fields(cond):
                value = getattr(cond, f.name)
                if not isinstance(value, torch.Tensor):
                    continue
                buf = self._statics.get((name, f.name))
                if buf is None or buf.shape != value.shape or buf.dtype != value.dtype or buf.device != value.device:
                    buf = self._statics[(name, f.name)] = value.clone()
                elif buf is not value:
                    buf.copy_(value)
                fields[f.name] = buf
        return dataclasses.replace(cond, **fields)

    def _key_for(self, frames: torch.Tensor, guidance: Guidance) -> tuple[tuple, tuple]:
        """What the graph bakes in: objects compared by identity (a new tensor means a new graph;
        the key holds them, so no id is reused while it lives) and values compared by value."""
        sampler = self.stream.sampler
        conds = tuple(getattr(c, f.name) for c in (guidance.text, guidance.negative) for f in dataclasses.fields(c))
        objects = (sampler, sampler._noise, sampler._coef, sampler._buffer, sampler._stock, *conds)
        filtered = bool(self.stream.config.similarity_filter)
        return objects, (guidance.cfg, guidance.scale, guidance.delta, tuple(frames.shape), filtered)

    def _same_key(self, key: tuple[tuple, tuple]) -> bool:
        if not self._key:
            return False
        (objects, values), (old_objects, old_values) = key, self._key
        return values == old_values and all(a is b for a, b in zip(objects, old_objects))

    def _frame(self) -> torch.Tensor:
        """The whole frame on the static input: (k, H, W, C) uint8 -> (k, H, W, 3) uint8."""
        s, c = self.stream, self.stream.config
        assert self._input is not None and self._x is not None and self._guidance is not None  # (by _capture)
        before = s.sampler.unet_rows
        with torch.inference_mode():
            if c.similarity_filter:  # preprocessed before the graph, for the filter's comparison
                x = self._x
            else:
                x = kernels.preprocess(self._input, c.height, c.width, s.dtype)  # (k, 3, H, W) in [-1, 1]
            latents = s.io.encode(x)  # (k, 4, h, w)
            out, _ = s.sampler.advance(latents, PRIMED, self._guidance)  # x0 (k, 4, h, w)
            frames = kernels.postprocess(s.net.decode(out))  # (k, H, W, 3) uint8
        self._rows = s.sampler.unet_rows - before  # UNet rows of one frame (the python runs, not a replay)
        return frames

    def _capture(self, frames: torch.Tensor, guidance: Guidance, key: tuple) -> None:
        s = self.stream
        for p in self._pending:  # frames in flight finish on the old graph before its memory goes
            if p.done is not None:
                p.done.synchronize()
        self._graph, self._output, self._key, self._guidance = None, None, (), guidance
        self._input = torch.empty(frames.shape, dtype=torch.uint8, device=s.device)
        self._input.copy_(frames)
        k, h, w = frames.shape[0], s.config.height, s.config.width
        with torch.inference_mode():  # (k, 3, H, W), laid out as preprocess lays it out (the convolutions'
            #                              algorithms, and so their last bits, follow the layout)
            self._x = torch.zeros_like(kernels.preprocess(self._input, h, w, s.dtype))
        self._slots = self.depth if self.graphs else 1
        self._up = [(self._host(frames.shape), None) for _ in range(self._slots)]
        self._down = [self._host((k, h, w, 3)) for _ in range(self._slots)]
        if self.graphs:
            sampler, rows = s.sampler, s.sampler.unet_rows
            saved = [t.clone() for t in (sampler._buffer, sampler._stock) if t is not None]
            self._graph, self._output = self.calls.capture(self._frame, s.device)
            with torch.inference_mode():  # the warm-up runs advanced the buffer: back as it was
                for t, keep in zip([t for t in (sampler._buffer, sampler._stock) if t is not None], saved):
                    t.copy_(keep)
            sampler.unet_rows = rows  # ... and they were no frames
            self.captures += 1
        self._key = key

    def _host(self, shape: Sequence[int]) -> torch.Tensor:
        return self.calls.pinned(shape) if self.graphs else torch.empty(shape, dtype=torch.uint8)

    def _upload(self, frames: torch.Tensor, slot: int) -> None:
        """The frames into the graph's input."""
        assert self._input is not None  # (made by _capture)
        if not self.graphs:
            self._input.copy_(frames)
            return
        self._input.copy_(self._staged(frames, slot), non_blocking=True)
        self._uploaded(slot)

    def _upload_to_device(self, frames: torch.Tensor, slot: int) -> torch.Tensor:
        """The frames on the device, in a new tensor (on the current stream)."""
        if not self.graphs:
            return frames.to(self.stream.device)
        up = self._staged(frames, slot).to(self.stream.device, non_blocking=True)
        self._uploaded(slot)
        return up

    def _staged(self, frames: torch.Tensor, slot: int) -> torch.Tensor:
        staging, copied = self._up[slot]
        if copied is not None:
            copied.synchronize()  # this slot's last upload (depth frames ago) has left it
        staging.copy_(frames)
        return staging

    def _uploaded(self, slot: int) -> None:
        event = self.calls.event()
        event.record()
        self._up[slot] = (self._up[slot][0], event)

    def _download(self, output: torch.Tensor, slot: int) -> _Pending:
        host = self._down[slot]
        if not self.graphs:
            host.copy_(output)
            return _Pending(host=host)
        host.copy_(output, non_blocking=True)
        event = self.calls.event()
        event.record()
        return _Pending(host=host, done=event)


class LiveGraphStream:
    """A stream as a live frame processor through a FrameGraph (`render --frame-graph`): each call
    puts a frame in and hands back the newest finished output at once, so with `depth` frames in
    flight the output is depth - 1 frames behind its input (the first call waits for its own).
    Offline runs (`push`/`flush`) and every other attribute are the stream's own."""

    def __init__(self, stream: StreamDiffusion, depth: int = 2):
        self.stream = stream
        self.graph = FrameGraph(stream, depth=depth)
        self._latest: Output | None = None

    def __call__(self, frame):
        outs = self.graph.submit(frame)
        if not outs and self._latest is None:
            outs = self.graph.drain()  # the very first frame: nothing older to show
        if outs:
            self._latest = outs[-1]
        return self._latest

    def push(self, frame):
        return self.stream.push(frame)

    def flush(self):
        return self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
