"""Every network call of a shared model on one persistent thread.

cuDNN's autotuner (`torch.backends.cudnn.benchmark`, on for CUDA models: models/image/loading.py)
keeps its cache of chosen convolution plans per thread in PyTorch's cuDNN v8 path, so a
network called from a new thread tunes every convolution again. Web sessions that take turns
on one model each run their frames in their own thread: every new stream re-tuned the whole
UNet and VAE while holding the model's lock, and 4 streams taking turns fell to 0.25 frames a
second in all on the GPU (benchmarks/results/gpu_figures.md, 2026-11-27). Here the calls go
to one worker thread instead (the batching executor of models/image/batching.py does the same for
streams that batch), so the tuning happens once per shape for the model's life.

The caller's inference and grad modes (thread-local in PyTorch) go with each call; an error
raised in the worker is raised in the caller.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import torch

from streamstudio.models.image.image_net import ImageNet, WrappedImageNet


class NetworkThread:
    """One worker thread that runs the calls it is given, one at a time, in order."""

    def __init__(self, name: str = "network"):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._worker: threading.Thread | None = None
        self.calls = 0

    def run(self, fn, *args):
        """fn(*args) on the worker thread, in the caller's inference and grad modes."""
        if threading.current_thread() is self._worker:  # a call from inside a call: already here
            return fn(*args)
        inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

        def job():
            self._worker = threading.current_thread()
            self.calls += 1
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                return fn(*args)

        return self._pool.submit(job).result()

    @property
    def thread_name(self) -> str | None:
        return None if self._worker is None else self._worker.name

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class ThreadedImageNet(WrappedImageNet):
    """The image seam with eps, encode and decode run on `thread` (a NetworkThread)."""

    def __init__(self, inner: ImageNet, thread: NetworkThread):
        super().__init__(inner)
        self.thread = thread

    def eps(self, x, t, cond, bank=None):
        return self.thread.run(self.inner.eps, x, t, cond, bank)

    def encode(self, images):
        return self.thread.run(self.inner.encode, images)

    def decode(self, latents):
        return self.thread.run(self.inner.decode, latents)


def threaded_components(comps, thread: NetworkThread):
    """SDComponents whose image networks run on `thread` (the text encoder stays in the caller's)."""
    return replace(comps, network=ThreadedImageNet(comps.net, thread),
                   notes=[*comps.notes, "network calls on one thread"])
