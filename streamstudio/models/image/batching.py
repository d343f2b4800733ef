"""Cross-stream batching: the networks of every live stream run as shared batched calls.

Each live session runs its own StreamDiffusion (its own buffer, prompt, seed, filter) over the
one loaded model. Without batching the sessions take turns on the model under one lock, so
four streams cost four batch-1 UNet calls per frame. With batching, one executor thread runs
every UNet and VAE call, and the calls that arrive together with the same shapes run as one
call: four streams cost about one batch-4 UNet call, which on a GPU takes little more than one
batch-1 call. This is Stream Batch carried across users.

Rows are independent in these networks (no batch statistics), so a stream's frames do not
depend on who it shares a call with, up to floating-point reassociation in the kernels. Each
stream passes its own text embeddings and timesteps per row, so streams with different
prompts, strengths or CFG types batch together; only the shapes must agree (the server's one
size and frame_buffer_size give every stream the same latent shape).

Which calls run next: those of the earliest stage of a frame (VAE encode, then UNet, then VAE
decode; each call names its stage), oldest first. While a stream that is in a frame has no
call queued, the executor waits for it, at most `max_wait_ms`, and chooses again when the call
comes: it joins the batch, or, being of an earlier stage, goes first. A stream that fell
behind thereby catches up with the others at the next stage, so streams that start out of
step fall into step and their calls meet. Only calls of the same network, condition fields and
shapes join (their key); each stream's calls are counted as shared or alone (`ClientStats`, in
its session's stats), so a stream whose calls cannot join the others' says so. Streams between
frames are not waited for. Results are copied out of the batch, so a network
that reuses its output buffers (CUDA graphs) cannot overwrite a stream's result. When a
batched call fails, each of its calls is run again alone, so a bad call fails only its own
stream.

The streams' calls arrive through the image seam (`models/image/image_net.py`): `BatchedImageNet`
wraps the shared model's seam (eager, compiled or TensorRT) and runs its eps, encode and decode
here. Feature banks (temporal consistency, `models/image/feature_bank.py`): a stream whose feature bank
is on hands its eps call its bank rows (`meta`); such calls join other bank calls only (their own
key), and the joined call tells the bank processors which rows are whose (row segments), so
every row reads and writes its own stream's bank. They run the eager UNet without padding (the
bank's attention lengths change as the bank fills; a compiled graph or engine has fixed shapes).

Fixed shapes for compiled networks and TensorRT engines: their calls are padded up to a bucket
(1, 2, 4, 8, 16 rows for max_rows 16; the pad rows repeat the last row and are dropped), and
the first call of a network warms every bucket up on the executor thread (where CUDA graph
trees live), so that a change in the number of streams never compiles a graph or captures a
CUDA graph while streams run. `warm_up` makes that first call at start-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial

import torch

from streamstudio.errors import StreamStudioError
from streamstudio.models.image.acceleration import BatchPlan, bucket_for, bucket_sizes
from streamstudio.models.image.image_net import ImageCond, ImageNet, WrappedImageNet, broadcast, check_bank
from streamstudio.models.image import acceleration

log = logging.getLogger(__name__)


@dataclass
class BatchingConfig:
    max_rows: int = 16  # batch rows per network call at most
    max_wait_ms: float = 2.0  # wait for other streams' calls this long at most, once one is in
    pad_to_buckets: bool | None = None  # pad calls to bucket_sizes(max_rows); None: when the network is
    #                                     compiled or a TensorRT engine (ImageNet.fixed_shapes)
    warm_up: bool = True  # with padding: the first call of a network runs every bucket once first

    @property
    def buckets(self) -> tuple[int, ...]:
        return bucket_sizes(self.max_rows)

    def validate(self) -> "BatchingConfig":
        if self.max_rows < 1:
            raise StreamStudioError(f"max_rows must be at least 1, got {self.max_rows}")
        if not 0.0 <= self.max_wait_ms <= 1000.0:
            raise StreamStudioError(f"max_wait_ms must be in [0, 1000], got {self.max_wait_ms}")
        return self


@dataclass
class BatchStats:
    calls: int = 0  # network calls made
    requests: int = 0  # calls asked for by the streams
    rows: int = 0  # batch rows evaluated
    batched_calls: int = 0  # calls that served more than one request
    retried: int = 0  # requests run alone after their batch failed
    largest: int = 0  # most requests served by one call
    padded_rows: int = 0  # rows added to reach a bucket (computed, then dropped)
    warmup_calls: int = 0  # network calls made to warm buckets up
    sizes: set = field(default_factory=set)  # every batch size a network was called with (pads included)

    @property
    def requests_per_call(self) -> float:
        return self.requests / self.calls if self.calls else 0.0


@dataclass
class ClientStats:
    """One stream's share of the batching (`BatchExecutor.client(stats)`): its network calls that
    ran together with other streams' calls and those that ran alone. `unjoinable` counts calls
    that ran alone while another stream's call of the same stage was waiting and could not join
    (other networks, condition fields or shapes: e.g. a ControlNet stream and a plain one, or
    frames of another size)."""

    shared: int = 0
    alone: int = 0
    unjoinable: int = 0

    def as_dict(self) -> dict:
        total = self.shared + self.alone
        return {"shared_calls": self.shared, "alone_calls": self.alone, "unjoinable_calls": self.unjoinable,
                "shared_fraction": round(self.shared / total, 3) if total else 0.0}


@dataclass(eq=False)  # compared by identity (deque.remove), never by its tensors
class _Request:
    key: tuple
    fn: Callable[..., object]  # a network call (a tensor back), or a job (anything back)
    args: tuple[torch.Tensor, ...]
    rows: int
    stage: int = 0
    pad: bool = False  # pad the call's rows up to a bucket
    job: bool = False  # a function to run on the executor thread, not a network call
    meta: object = None  # per-call data handed to fn as metas=[(first row, meta), ...] (feature-bank rows)
    client: ClientStats | None = None  # the calling stream's counts
    unjoinable: bool = False  # another stream's call of this stage waited beside it with another key
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    error: BaseException | None = None


class BatchExecutor:
    """One thread that runs network calls, batching compatible calls of several streams.

    `run(name, fn, *args, stage=s)` blocks until `fn` has run on the executor thread over
    `args` concatenated with the args of other calls of the same name and shapes (every arg a
    tensor with the batch first), and returns this call's rows of the result. Calls of lower
    stages run first.
    """

    def __init__(self, config: BatchingConfig | None = None, name: str = "model-executor"):
        self.config = (config or BatchingConfig()).validate()
        self.stats = BatchStats()
        self._queue: deque[_Request] = deque()
        self._cond = threading.Condition()
        self._clients = 0
        self._closed = False
        self._warm: set[tuple] = set()  # keys whose buckets are warmed up
        self._local = threading.local()  # the calling thread's ClientStats (client(stats))
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callers
    @contextmanager
    def client(self, stats: ClientStats | None = None):
        """Count a stream as a caller while it runs (the executor waits for that many calls);
        `stats`: where this thread's calls are counted as shared or alone."""
        with self._cond:
            self._clients += 1
        previous = getattr(self._local, "stats", None)
        self._local.stats = stats
        try:
            yield self
        finally:
            self._local.stats = previous
            with self._cond:
                self._clients -= 1
                self._cond.notify_all()

    def run(self, name: str, fn: Callable[..., torch.Tensor], *args: torch.Tensor, stage: int = 0,
            pad: bool = False, meta: object = None) -> torch.Tensor:
        """fn over args batched with other calls like it; pad: pad the joined rows up to a
        bucket (a compiled network or engine sees only the bucket sizes). meta: this call's
        own data (not a tensor); fn then gets `metas=[(first row, meta), ...]` for the joined
        calls (every call of a name must give one, or none)."""
        if threading.current_thread() is self._thread:  # a network calling another: no queue
            return fn(*args) if meta is None else fn(*args, metas=[(0, meta)])
        rows = args[0].shape[0]
        if any(a.shape[0] != rows for a in args):
            raise StreamStudioError(f"{name}: every argument needs the same batch size, got "
                                    f"{[a.shape[0] for a in args]}")
        key = (name, tuple((tuple(a.shape[1:]), a.dtype, a.device) for a in args))
        return self._submit(_Request(key, fn, args, rows, stage, pad=pad, meta=meta,
                                     client=getattr(self._local, "stats", None)))

    def submit(self, fn: Callable[[], object]) -> object:
        """Run fn() on the executor thread (before any queued network call) and return its
        result: start-up work that must happen where the networks run (CUDA graph trees are
        per thread)."""
        if threading.current_thread() is self._thread:
            return fn()
        return self._submit(_Request(("job", id(fn)), fn, (), 0, stage=-1, job=True))

    def _submit(self, request: _Request):
        with self._cond:
            if self._closed:
                raise StreamStudioError("the model executor is shut down")
            self._queue.append(request)
            self._cond.notify_all()
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def close(self, wait: float = 5.0) -> None:
        """Stop the thread; calls still queued fail with a clear error."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(wait)

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ executor thread
    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                batch = self._take()
                if batch is None:
                    return
                self._execute(batch)

    def _take(self) -> list[_Request] | None:
        """The next batch: the oldest call of the earliest stage queued and every queued call
        like it. While some stream in a frame has no call queued yet, wait for it (up to
        max_wait_ms) and choose again when it comes: its call may join this batch, or be of an
        earlier stage and go first, so that the streams fall into step."""
        cfg = self.config
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            deadline = time.monotonic() + cfg.max_wait_ms / 1000.0
            while True:
                if self._closed:
                    for request in self._queue:
                        request.error = StreamStudioError("the model executor is shut down")
                        request.done.set()
                    self._queue.clear()
                    return None
                first = min(self._queue, key=lambda r: r.stage)  # the oldest of the earliest stage
                if first.job:
                    self._queue.remove(first)
                    return [first]
                batch, rows = [first], first.rows  # a call bigger than max_rows runs alone
                for request in self._queue:
                    if request is not first and request.key == first.key and rows + request.rows <= cfg.max_rows:
                        batch.append(request)
                        rows += request.rows
                missing = self._clients - len(self._queue)  # streams in a frame with no call queued
                left = deadline - time.monotonic()
                if rows >= cfg.max_rows or missing <= 0 or left <= 0:
                    for request in batch:
                        self._queue.remove(request)
                    others = [r for r in self._queue if r.stage == first.stage and not r.job and r.key != first.key]
                    for request in (*others, *batch) if others else ():  # they could not join each other
                        request.unjoinable = True
                    return batch
                self._cond.wait(left)

    def _execute(self, batch: list[_Request]) -> None:
        if batch[0].job:
            self._run_job(batch[0])
            return
        try:
            self._call(batch)
        except BaseException as exc:  # noqa: BLE001 - handed to the callers' threads
            if len(batch) == 1:
                batch[0].error = exc
                batch[0].done.set()
                return
            log.warning("a batched call of %d streams failed (%s); running them one by one", len(batch), exc)
            for request in batch:  # run each alone: only the bad one fails
                self.stats.retried += 1
                try:
                    self._call([request])
                except BaseException as err:  # noqa: BLE001
                    request.error = err
                finally:
                    request.done.set()
            return
        for request in batch:
            request.done.set()

    def _run_job(self, request: _Request) -> None:
        try:
            request.result = request.fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            request.error = exc
        finally:
            request.done.set()

    def _call(self, batch: list[_Request]) -> None:
        """One network call over the batch's rows (padded to a bucket when asked); each
        request gets a copy of its rows of the result."""
        first = batch[0]
        rows = sum(r.rows for r in batch)
        size = bucket_for(rows, self.config.buckets) if first.pad else rows
        if first.pad and self.config.warm_up and first.key not in self._warm:
            self._warm_up(first)
        n_args = len(first.args)
        if len(batch) == 1:
            args = [_with_rows(a, size) for a in first.args]
        else:
            args = [_with_rows(torch.cat([r.args[i] for r in batch]), size) for i in range(n_args)]  # (size, ...)
        if first.meta is None:
            out = first.fn(*args)
        else:
            starts = [sum(r.rows for r in batch[:i]) for i in range(len(batch))]
            out = first.fn(*args, metas=[(start, r.meta) for start, r in zip(starts, batch)])
        if not isinstance(out, torch.Tensor) or out.shape[0] != size:
            raise StreamStudioError(f"a batched network returned {getattr(out, 'shape', type(out))} for {size} rows")
        start = 0
        for request in batch:
            request.result = out[start:start + request.rows].clone()  # pad rows are dropped
            start += request.rows
        s = self.stats
        s.calls += 1
        s.requests += len(batch)
        s.rows += rows
        s.padded_rows += size - rows
        s.batched_calls += len(batch) > 1
        s.largest = max(s.largest, len(batch))
        s.sizes.add(size)
        for request in batch:
            counts = request.client
            if counts is not None:
                if len(batch) > 1:
                    counts.shared += 1
                else:
                    counts.alone += 1
                    counts.unjoinable += request.unjoinable

    def _warm_up(self, request: _Request) -> None:
        """Run the request's network once at every bucket size (three times on a GPU, so that
        CUDA graphs are recorded), before the first real call."""
        self._warm.add(request.key)
        on_gpu = any(a.is_cuda for a in request.args)
        for size in self.config.buckets:
            for _ in range(3 if on_gpu else 1):
                try:
                    request.fn(*[_with_rows(a, size) for a in request.args])
                except Exception as exc:  # noqa: BLE001 - a size the network cannot take fails again when sent
                    log.warning("warm-up of %s at batch %d failed: %s", request.key[0], size, exc)
                    break
                self.stats.warmup_calls += 1
        log.info("warmed up %s at batch sizes %s", request.key[0], self.config.buckets)


def _with_rows(a: torch.Tensor, rows: int) -> torch.Tensor:
    """`a` (B, ...) with `rows` rows, contiguous: its first rows, or padded with copies of its
    last row (rows are independent in these networks: pad rows change no other row). Always an
    inference tensor (made on the executor thread, in inference mode): a compiled graph's guards
    tell a tensor made outside inference mode (the stream's timesteps) from one made inside (a
    joined batch), and would compile the same size twice."""
    b = a.shape[0]
    if rows == b:
        return a if a.is_inference() and a.is_contiguous() else a.clone(memory_format=torch.contiguous_format)
    if rows < b:
        return a[:rows].contiguous()
    return torch.cat([a, a[-1:].expand(rows - b, *a.shape[1:])])  # (rows, ...)


# ---------------------------------------------------------------------------------------------
# The image seam, its calls run by the executor
# ---------------------------------------------------------------------------------------------

STAGE_ENCODE, STAGE_UNET, STAGE_DECODE = 0, 1, 2  # the order of a frame's network calls


class BatchedImageNet(WrappedImageNet):
    """The image seam with eps, encode and decode run by `executor`, batched across streams.
    The condition's tensors travel as rows like x (`ImageCond.flatten`); calls join only calls
    with the same condition fields. A call with feature-bank rows runs with the bank calls of
    other streams, each row on its own stream's bank."""

    def __init__(self, inner: ImageNet, executor: BatchExecutor):
        super().__init__(inner)
        self.executor = executor
        self._name = f"net-{id(self)}"
        pad = executor.config.pad_to_buckets
        self.pad = inner.fixed_shapes if pad is None else pad

    @property
    def fixed_shapes(self) -> bool:
        return self.inner.fixed_shapes

    def eps(self, x, t, cond, bank=None):
        t, cond = broadcast(x.shape[0], t, cond, x.device)  # (B,), B rows
        layout, tensors = cond.flatten()
        # contiguous: a compiled graph's guards check strides, and an expanded view (stride 0) and a
        # joined batch of one size would otherwise compile twice
        args = [a.contiguous() for a in (x, t, *tensors)]
        if bank:  # feature banks: joined with other bank calls only, never padded
            check_bank(self)
            return self.executor.run(f"{self._name}-eps-bank-{layout}", partial(self._eps_bank, layout), *args,
                                     stage=STAGE_UNET, meta=tuple(bank))  # (B, 4, h, w)
        return self.executor.run(f"{self._name}-eps-{layout}", partial(self._eps, layout), *args,
                                 stage=STAGE_UNET, pad=self.pad)  # (B, 4, h, w)

    def _eps(self, layout, x, t, *cond):
        return self.inner.eps(x, t, ImageCond.unflatten(layout, cond))

    def _eps_bank(self, layout, x, t, *cond, metas):
        """metas: (first row, that call's bank segments) of each joined call."""
        segments = [(start + first, rows) for start, bank in metas for first, rows in bank]
        return self.inner.eps(x, t, ImageCond.unflatten(layout, cond), segments)

    def encode(self, images):
        return self.executor.run(f"{self._name}-encode", self.inner.encode, images.contiguous(), stage=STAGE_ENCODE,
                                 pad=self.pad)  # (B, 4, H/8, W/8)

    def decode(self, latents):
        return self.executor.run(f"{self._name}-decode", self.inner.decode, latents.contiguous(),
                                 stage=STAGE_DECODE, pad=self.pad)  # (B, 3, H, W)


def batched_components(comps, executor: BatchExecutor):
    """SDComponents whose image networks run through `executor` (the text encoder stays as is)."""
    return replace(comps, network=BatchedImageNet(comps.net, executor),
                   notes=[*comps.notes, f"cross-stream batching (up to {executor.config.max_rows} rows a call)"])


def warm_up(shared, height: int, width: int) -> int:
    """At start-up, before streams run: one call of each network of `shared` (components from
    `batched_components`) through the executor, which warms every bucket of a padded network
    (see BatchExecutor._warm_up). Returns the executor's warm-up calls."""
    executor = shared.net.executor
    one = BatchPlan({"unet": (1,), "vae_encoder": (1,), "vae_decoder": (1,)},
                    {"unet": 1, "vae_encoder": 1, "vae_decoder": 1}, height, width)
    before = executor.stats.warmup_calls
    acceleration.warm_up(shared, one, repeats=1)
    return executor.stats.warmup_calls - before
