"""The shared model's guard: how the sessions' frames, prompt encodings and weight changes take
turns on one loaded model (or share its batching executor), and a pipeline wrapped in it for a tab
that drives one itself (the Splats tab)."""

from __future__ import annotations

import contextlib
import threading


class ModelGuard:
    """The one guard of the shared model, with three contexts:

    - `frame(stats)`: held while a stream runs a frame. With cross-stream batching the stream
      counts as a caller of the executor (whose one thread runs every UNet and VAE call, and waits
      briefly for the calls of the streams inside a frame to batch them; `stats`, an
      `models.image.batching.ClientStats`, counts the stream's calls shared or alone); without it, the
      model's lock, so streams take turns.
    - `text()`: held while the text encoder and tokenizer run (prompt changes) and while a
      stream is built: always the lock, as they run in the caller's thread.
    - `exclusive()`: no frame runs inside it (those under way finish first, new ones wait):
      for changes of the shared weights (LoRA scales), so no frame runs on half-changed weights."""

    def __init__(self, executor=None):
        self._executor = executor  # models.image.batching.BatchExecutor, or None: take turns
        self._lock = threading.Lock()
        self._frames = threading.Condition()  # (with batching) frames under way, and a change waiting
        self._running = 0
        self._changing = False

    @contextlib.contextmanager
    def frame(self, stats=None):
        if self._executor is None:
            with self._lock:
                yield
            return
        with self._frames:
            while self._changing:
                self._frames.wait()
            self._running += 1
        try:
            with self._executor.client(stats):
                yield
        finally:
            with self._frames:
                self._running -= 1
                self._frames.notify_all()

    @contextlib.contextmanager
    def text(self):
        with self._lock:
            yield

    @contextlib.contextmanager
    def exclusive(self):
        with self._lock:  # prompt encodings and (without batching) frames are out
            if self._executor is None:
                yield
                return
            with self._frames:
                self._changing = True
                while self._running:
                    self._frames.wait()
            try:
                yield
            finally:
                with self._frames:
                    self._changing = False
                    self._frames.notify_all()


class GuardedPipeline:
    """A stream over the shared model for a tab that drives a pipeline itself (the Splats tab),
    next to the sessions: its frames run in the guard's frame context, every other call
    (prompt, settings) in its text context."""

    def __init__(self, pipe, guard: ModelGuard):
        self._pipe, self._guard = pipe, guard

    def __call__(self, *args, **kwargs):
        with self._guard.frame():
            return self._pipe(*args, **kwargs)

    def __getattr__(self, name: str):
        attr = getattr(self._pipe, name)
        if not callable(attr):
            return attr

        def guarded(*args, **kwargs):
            with self._guard.text():
                return attr(*args, **kwargs)

        return guarded
