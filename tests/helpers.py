"""Test data shared by several test files (imported as `helpers`; pytest puts tests/ on the path)."""

from __future__ import annotations

import collections
import threading
import time

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from streamstudio.models.image.image_net import WrappedImageNet


def half_points(step: int = 7) -> np.ndarray:
    """float32 inputs v with fl(fl(v + 1) * 127.5) exactly k + 0.5, for k = 0, step, 2 step...
    below 255: the rounding ties of postprocess."""
    found = []
    for k in range(0, 255, step):
        v = np.float32((k + 0.5) / 127.5 - 1.0)
        for _ in range(64):
            y = (v + np.float32(1.0)) * np.float32(127.5)
            if y == k + 0.5:
                found.append(v)
                break
            v = np.nextafter(v, np.float32(np.inf) if y < k + 0.5 else np.float32(-np.inf), dtype=np.float32)
    return np.array(found, dtype=np.float32)


def random_gaussians(n: int, seed: int = 0, spread: float = 0.6, log_scale: float = -2.5, dtype=torch.float64,
                     sh_k: int = 0):
    """n random Gaussians in front of an identity camera: (means, quats, scales, opacities,
    colours), colours RGB (n, 3) in [0, 1] or, with sh_k > 0, SH coefficients (n, sh_k, 3)."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(n, 3, generator=g, dtype=dtype) * spread
    means[:, 2] += 3.0
    quats = torch.randn(n, 4, generator=g, dtype=dtype)
    scales = torch.exp(log_scale + 0.4 * torch.randn(n, 3, generator=g, dtype=dtype))
    opac = torch.rand(n, generator=g, dtype=dtype) * 0.95 + 0.02
    if sh_k:
        colors = torch.randn(n, sh_k, 3, generator=g, dtype=dtype) * 0.3
    else:
        colors = torch.rand(n, 3, generator=g, dtype=dtype)
    return means, quats, scales, opac, colors


# ------------------------------------------------------------------ splat scenes (format tests)
SH_C0 = 0.28209479177387814


def random_scene(n: int, degree: int, seed: int = 0):
    """n random Gaussians around the origin with SH of `degree`, DC colours in range."""
    from streamstudio.models.splats.gaussians import GaussianScene

    g = torch.Generator().manual_seed(seed)
    k = (degree + 1) ** 2
    sh = torch.randn(n, k, 3, generator=g) * 0.2
    sh[:, 0] = (torch.rand(n, 3, generator=g) - 0.5) / SH_C0 * 0.8
    return GaussianScene(means=torch.randn(n, 3, generator=g) * 0.7, quats=torch.randn(n, 4, generator=g),
                         log_scales=-3.0 + 0.4 * torch.randn(n, 3, generator=g),
                         opacity_logits=torch.randn(n, generator=g) * 1.5 + 1.0, sh=sh)


def render_rgb(scene, degree: int, centre: torch.Tensor | None = None) -> torch.Tensor:
    """A 64x64 RGB view of `scene` looking at `centre` (the origin by default)."""
    from streamstudio.pipelines.splats.splat_render import SceneFit, SplatRenderConfig, fitted_camera, render

    fit = SceneFit(torch.zeros(3) if centre is None else centre, 1.5)
    cfg = SplatRenderConfig(width=64, height=64, sh_degree=degree)
    return render(scene, fitted_camera(fit, cfg, 30.0, 20.0), cfg).rgb


def assert_renders_alike(a, b, degree: int, mean_tol: float, max_tol: float = 0.15,
                         centre: torch.Tensor | None = None, min_brightness: float = 0.05) -> None:
    """Renders of two scenes differ by at most mean_tol on average and max_tol anywhere (and the
    first is not an empty picture)."""
    ra, rb = render_rgb(a, degree, centre), render_rgb(b, degree, centre)
    assert float(ra.mean()) > min_brightness
    diff = (ra - rb).abs()
    assert float(diff.mean()) < mean_tol and float(diff.max()) < max_tol, (float(diff.mean()), float(diff.max()))


def same_rotation(qa: torch.Tensor, qb: torch.Tensor) -> torch.Tensor:
    """|cos| of the angle between quaternions: 1 for the same rotation (q and -q alike)."""
    qa, qb = torch.nn.functional.normalize(qa, dim=-1), torch.nn.functional.normalize(qb, dim=-1)
    return (qa * qb).sum(-1).abs()


# ------------------------------------------------------------------ image pipeline
class RecordingNet(WrappedImageNet):
    """An image seam (`models/image_net.ImageNet`) over `inner` that records every call going
    through it as (call, rows, timestep rows, condition rows, with a bank)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.calls = []

    def eps(self, x, t, cond, bank=None):
        t_rows = torch.as_tensor(t).reshape(-1).shape[0]
        self.calls.append(("eps", x.shape[0], t_rows, cond.rows, bool(bank)))
        return self.inner.eps(x, t, cond, bank)

    def encode(self, images):
        self.calls.append(("encode", images.shape[0], 0, 0, False))
        return self.inner.encode(images)

    def decode(self, latents):
        self.calls.append(("decode", latents.shape[0], 0, 0, False))
        return self.inner.decode(latents)


class SpecEngine:
    """Stands in for TRTEngine: named tensors in, {output: tensor} out, computed by the export
    spec's own module (the engine wrappers' plumbing without TensorRT); `shapes` records each
    call's input shapes by name."""

    def __init__(self, spec):
        self.spec = spec
        self.input_names = list(spec.input_names)  # as TRTEngine's: what the engine takes
        self.calls = 0
        self.shapes = []

    def __call__(self, **inputs):
        self.calls += 1
        self.shapes.append({n: tuple(t.shape) for n, t in inputs.items()})
        with torch.no_grad():
            out = self.spec.module(*(inputs[n] for n in self.spec.input_names))
        return {self.spec.output_names[0]: out}


def capture_latents(pipe) -> list:
    """Record the x0 latents `pipe` (a StreamDiffusion) decodes, in output order: the returned
    list fills as the pipeline runs."""
    seen = []
    decode = pipe.io.decode

    def spy(latents):
        seen.extend(latents.clone())
        return decode(latents)

    pipe.io.decode = spy
    return seen


def recorded_runners(monkeypatch) -> list:
    """Every streaming.Runner built from now on (for the test's length), to read the metrics of
    the runs a front end made: `runners[-1].metrics()` once the command has returned."""
    from streamstudio.streaming.runner import Runner

    runners: list = []
    init = Runner.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        runners.append(self)

    monkeypatch.setattr(Runner, "__init__", record)
    return runners


def run_in_lockstep(executor, streams, inputs, stats=None, timeout: float = 120.0) -> list[list]:
    """Each stream's frames pushed from its own thread, the threads meeting at every frame (a
    barrier) so that their network calls reach the batching executor together; each thread is
    one of the executor's clients (with `stats[i]` counting its calls). Returns each stream's
    outputs; an error in a thread is raised here."""
    outs: list[list] = [[] for _ in streams]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(streams))

    def worker(i):
        try:
            with executor.client(*([] if stats is None else [stats[i]])):
                for frame in inputs[i]:
                    barrier.wait()  # every stream in the same frame: their calls meet
                    outs[i].append(streams[i](frame))
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:  # the first real error, not the broken barriers it left the other threads
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    return outs


TENSOR_SYNCS = {torch.Tensor.item: "item", torch.Tensor.cpu: "cpu", torch.Tensor.tolist: "tolist",
                torch.Tensor.__bool__: "bool", torch.Tensor.__float__: "float", torch.Tensor.__int__: "int",
                torch.Tensor.__index__: "index", torch.Tensor.numpy: "numpy"}


class CountSyncs(TorchFunctionMode):
    """Counts the tensor calls that make the host wait for the device."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in TENSOR_SYNCS:
            self.counts[TENSOR_SYNCS[func]] += 1
        return func(*args, **(kwargs or {}))


# a web session's frames: a test picture in, wait for processed output
def frame(value: int = 0, h: int = 48, w: int = 80) -> np.ndarray:
    img = np.zeros((h, w, 3), np.uint8)
    img[:, : w // 2] = (value, 255 - value, 60)
    img[h // 2:, :, 2] = 200
    return img


def wait_output(session, count: int = 1, timeout: float = 30.0) -> np.ndarray:
    deadline = time.monotonic() + timeout
    while session.processed < count:
        assert session.error is None, session.error
        assert time.monotonic() < deadline, "no output in time"
        time.sleep(0.01)
    return session.latest()


def wait_for_sync(predicate, timeout: float) -> bool:
    """Poll `predicate` every 50 ms until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def feed_frames(session, frames: int, size: int = 64, step: int = 11) -> None:
    """`frames` flat frames into a web session, one at a time, each waited for (a stream's
    settings and modulations apply between frames)."""
    for k in range(frames):
        before = session.processed
        session.submit(frame((step * k) % 256, size, size))
        deadline = time.monotonic() + 30
        while session.processed == before and time.monotonic() < deadline:
            time.sleep(0.01)


def feed_one(session, image: np.ndarray) -> np.ndarray:
    """Hand in one frame and wait for its output (the stream's view), which is returned."""
    before = session.processed
    session.submit(image)
    deadline = time.monotonic() + 60
    while session.processed == before:
        assert time.monotonic() < deadline and session.error is None, session.error
        time.sleep(0.005)
    assert session.processed == before + 1  # one frame in, one out
    out = session.latest()
    assert out is not None
    return out.copy()
