"""The fused ops: nvcc compile check of every .cu file, the references against independent
numpy computations, CPU dispatch, and (marked gpu) each CUDA kernel against its reference."""

from __future__ import annotations

import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from streamstudio import kernels
from streamstudio.kernels import cuda_build, reference
from streamstudio.kernels.reference import CFG_FULL, CFG_INITIALIZE, CFG_NONE, CFG_SELF
from helpers import half_points

CU_FILES = sorted(cuda_build.CSRC.glob("*.cu"))
BINDINGS = sorted(p.with_suffix(".cpp") for p in CU_FILES if p.with_suffix(".cpp").is_file())
ALL_CFG = (CFG_NONE, CFG_SELF, CFG_INITIALIZE, CFG_FULL)


# ------------------------------------------------------------------------------ nvcc
@pytest.mark.skipif(cuda_build.find_nvcc() is None, reason="nvcc not installed")
@pytest.mark.parametrize("source", CU_FILES, ids=[p.name for p in CU_FILES])
def test_cu_file_compiles_without_spills(source: Path):
    report = cuda_build.nvcc_check(source, archs=("sm_80", "sm_90"))
    assert report.returncode == 0, f"nvcc failed on {source.name}:\n{report.output[-4000:]}"
    assert "bytes spill" in report.output, "ptxas printed no resource report (-Xptxas -v)"
    assert report.spill_stores == 0 and report.spill_loads == 0, \
        f"{source.name} spills registers:\n" + "\n".join(report.spilling)


def test_stream_ops_source_is_checked():
    assert cuda_build.CSRC / "stream_ops.cu" in CU_FILES
    assert cuda_build.CSRC / "splat_rasterizer.cu" in CU_FILES
    assert [p.name for p in BINDINGS] == ["splat_rasterizer.cpp", "stream_ops.cpp"]


def test_cu_files_hold_no_torch_headers():
    for source in CU_FILES:
        assert "torch/" not in source.read_text(), f"{source.name}: keep torch's headers in the binding .cpp"


@pytest.mark.skipif(cuda_build.find_nvcc() is None, reason="nvcc not installed")
def test_a_launcher_that_drifts_from_its_header_fails_nvcc(tmp_path):
    for name in ("stream_ops.cu", "stream_ops.h"):
        shutil.copy(cuda_build.CSRC / name, tmp_path / name)
    header = tmp_path / "stream_ops.h"
    text = header.read_text()
    assert "int batch, int h, int w" in text
    header.write_text(text.replace("int batch, int h, int w", "int64_t batch, int h, int w", 1))
    report = cuda_build.nvcc_check(tmp_path / "stream_ops.cu", archs=("sm_90",))
    assert report.returncode != 0 and "preprocess_launch" in report.output


# ------------------------------------------------------------------------------ torch bindings
@pytest.mark.skipif(shutil.which("g++") is None or cuda_build.cuda_include_dir() is None,
                    reason="needs g++ and the CUDA headers")
def test_every_binding_compiles_against_torch_headers():
    """Each binding .cpp is compiled (syntax only, both at once) against torch's headers and its
    launchers' header: a call that no longer matches a launcher, or a torch API that changed,
    fails here rather than at the first build on a GPU machine."""
    with ThreadPoolExecutor(max_workers=len(BINDINGS)) as pool:
        reports = list(pool.map(cuda_build.binding_check, BINDINGS))
    for report in reports:
        assert report.ok, f"{report.source.name} does not compile:\n{report.output[-4000:]}"


@pytest.mark.skipif(shutil.which("g++") is None or cuda_build.cuda_include_dir() is None,
                    reason="needs g++ and the CUDA headers")
def test_binding_check_reports_a_broken_binding(tmp_path):
    broken = tmp_path / "broken.cpp"
    broken.write_text(f'#include "{cuda_build.CSRC / "stream_ops.h"}"\n'
                      "int f() { return streamstudio::postprocess_launch(nullptr, 0, nullptr, 1, 2, nullptr); }\n")
    report = cuda_build.binding_check(broken)
    assert not report.ok and "postprocess_launch" in report.output


# ------------------------------------------------------------------------------ independent numpy references
def triangle_weights(in_size: int, out_size: int) -> np.ndarray:
    """(out, in) float64 resampling matrix of the triangle filter documented in reference.preprocess."""
    scale = in_size / out_size
    support = max(scale, 1.0)
    mat = np.zeros((out_size, in_size))
    for i in range(out_size):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), in_size)
        j = np.arange(lo, hi)
        w = np.clip(1.0 - np.abs((j - center + 0.5) / support), 0.0, None)
        mat[i, lo:hi] = w / w.sum()
    return mat


def numpy_preprocess(frames: np.ndarray, height: int, width: int, bgr: bool) -> np.ndarray:
    x = frames.astype(np.float64)  # (B, H, W, 3)
    if bgr:
        x = x[..., ::-1]
    wy, wx = triangle_weights(x.shape[1], height), triangle_weights(x.shape[2], width)
    x = np.einsum("yh,bhwc,xw->bcyx", wy, x, wx)  # (B, 3, height, width)
    return x / 127.5 - 1.0


def numpy_step(x, text, uncond, stock, noise, coef, g, delta, cfg):
    """The Stream Batch step from the formulas in ARCHITECTURE.md / stream_diffusion.py, float64.
    (The stock update is checked against StreamDiffusion's own unet_step in test_rcfg_reference.py.)"""
    alpha, beta, c_skip, c_out, a_next, b_next = (coef[:, k].reshape(-1, 1, 1, 1) for k in range(6))
    if cfg == CFG_NONE:
        eps = text
    else:
        u = uncond if cfg == CFG_FULL else delta * stock
        eps = u + g * (text - u)

    def step(xx):
        return c_out * (xx - beta * eps) / alpha + c_skip * xx

    x0 = step(x)
    x_next = a_next * x0 + b_next * noise
    stock_next = noise + a_next / b_next * step(beta * stock) if cfg in (CFG_SELF, CFG_INITIALIZE) else stock
    return x0, x_next, stock_next


def random_coef(b: int, gen: torch.Generator, turbo: bool = False) -> torch.Tensor:
    abar = torch.rand(b, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    abar_next = torch.rand(b, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    s = torch.rand(b, generator=gen, dtype=torch.float64) * 10
    c_skip = torch.zeros(b, dtype=torch.float64) if turbo else 0.25 / (s ** 2 + 0.25)
    c_out = torch.ones(b, dtype=torch.float64) if turbo else s / (s ** 2 + 0.25).sqrt()
    return torch.stack([abar.sqrt(), (1 - abar).sqrt(), c_skip, c_out, abar_next.sqrt(), (1 - abar_next).sqrt()], 1)


# ------------------------------------------------------------------------------ reference tests (CPU)
@pytest.mark.parametrize("size,out,bgr", [((48, 64), (48, 64), False), ((37, 53), (24, 40), True),
                                          ((20, 30), (45, 31), False), ((64, 17), (16, 40), True),
                                          ((101, 77), (13, 11), False)])
def test_preprocess_matches_triangle_filter(size, out, bgr):
    gen = torch.Generator().manual_seed(hash((size, out)) % 2**31)
    frames = torch.randint(0, 256, (2, *size, 3), generator=gen, dtype=torch.uint8)
    got = reference.preprocess(frames, *out, torch.float32, bgr).double().numpy()
    want = numpy_preprocess(frames.numpy(), *out, bgr)
    assert got.shape == (2, 3, *out)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    assert got.min() >= -1.0 - 1e-6 and got.max() <= 1.0 + 1e-6


def test_preprocess_same_size_is_exact_and_single_frame():
    frame = torch.arange(4 * 6 * 3, dtype=torch.uint8).view(4, 6, 3)
    got = reference.preprocess(frame, 4, 6, torch.float32)
    want = frame.permute(2, 0, 1).float() / 127.5 - 1.0
    assert got.shape == (1, 3, 4, 6) and torch.equal(got[0], want)
    assert torch.equal(reference.preprocess(frame, 4, 6, torch.float32, bgr=True)[0], want.flip(0))
    assert reference.preprocess(frame, 4, 6, torch.float16).dtype == torch.float16


def test_postprocess_clamps_and_rounds_half_to_even():
    ties = half_points()
    assert len(ties) > 20
    expect = np.rint((ties + np.float32(1.0)) * np.float32(127.5)).astype(np.uint8)  # rint: half to even
    extra = np.array([-3.0, -1.0, 1.0, 7.5, 0.0], dtype=np.float32)
    v = np.concatenate([ties, extra])
    images = torch.from_numpy(np.resize(v, 3 * len(v))).view(1, 3, 1, len(v))
    got = reference.postprocess(images)
    assert got.shape == (1, 1, len(v), 3) and got.dtype == torch.uint8
    np.testing.assert_array_equal(got[0, 0, :len(ties), 0].numpy(), expect[:len(ties)])
    assert (np.asarray(expect) % 2 == 0).all()  # every tie went to the even neighbour
    np.testing.assert_array_equal(got[0, 0, len(ties):, 0].numpy(), [0, 0, 255, 255, 128])


@pytest.mark.parametrize("cfg", ALL_CFG)
@pytest.mark.parametrize("turbo", [False, True])
def test_stream_step_matches_formulas(cfg, turbo):
    gen = torch.Generator().manual_seed(10 * cfg + turbo)
    shape = (3, 4, 5, 7)
    x, text, uncond, stock, noise = (torch.randn(shape, generator=gen) for _ in range(5))
    coef = random_coef(3, gen, turbo)
    got = reference.stream_step(x, text, uncond, stock, noise, coef.float(), 1.7, 0.8, cfg)
    want = numpy_step(*(t.double().numpy() for t in (x, text, uncond, stock, noise)), coef.numpy(), 1.7, 0.8, cfg)
    for g, w in zip(got, want):
        assert g.dtype == torch.float32
        np.testing.assert_allclose(g.double().numpy(), w, rtol=1e-4, atol=1e-4)
    if turbo and cfg == CFG_NONE:  # sd-turbo: x0 = (x - beta * eps) / alpha
        a, b = coef[:, 0].view(-1, 1, 1, 1).float(), coef[:, 1].view(-1, 1, 1, 1).float()
        torch.testing.assert_close(got[0], (x - b * text) / a, rtol=1e-5, atol=1e-5)


def test_cosine_similarity_reference():
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 3, 9, 11, generator=gen), torch.randn(2, 3, 9, 11, generator=gen)
    an, bn = a.double().numpy().ravel(), b.double().numpy().ravel()
    want = an @ bn / (np.linalg.norm(an) * np.linalg.norm(bn))
    assert abs(float(reference.cosine_similarity(a, b)) - want) < 1e-6
    assert abs(float(reference.cosine_similarity(a, a)) - 1.0) < 1e-6
    assert float(reference.cosine_similarity(torch.zeros(5), torch.zeros(5))) == 0.0


# ------------------------------------------------------------------------------ dispatch (CPU)
def test_cpu_tensors_take_the_reference_without_building(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("the CUDA extension must not be built for CPU tensors")

    monkeypatch.setattr(cuda_build, "load_extension", boom)
    gen = torch.Generator().manual_seed(5)
    frame = torch.randint(0, 256, (30, 44, 3), generator=gen, dtype=torch.uint8)
    torch.testing.assert_close(kernels.preprocess(frame, 16, 24), reference.preprocess(frame, 16, 24), rtol=0, atol=0)
    images = torch.rand(2, 3, 5, 6, generator=gen) * 2.2 - 1.1
    assert torch.equal(kernels.postprocess(images), reference.postprocess(images))
    a, b = torch.randn(10, generator=gen), torch.randn(10, generator=gen)
    assert torch.equal(kernels.cosine_similarity(a, b), reference.cosine_similarity(a, b))
    tensors = [torch.randn(2, 4, 3, 3, generator=gen) for _ in range(5)]
    coef = random_coef(2, gen).float()
    for got, want in zip(kernels.stream_step(*tensors, coef, 1.5, 1.0, CFG_SELF),
                         reference.stream_step(*tensors, coef, 1.5, 1.0, CFG_SELF)):
        assert torch.equal(got, want)


def test_load_extension_warns_once_and_returns_none(monkeypatch):
    monkeypatch.setattr(cuda_build, "unavailable_reason", lambda: "test: no GPU here")
    cuda_build.forget("probe_ext")
    try:
        with pytest.warns(RuntimeWarning, match="not available .*test: no GPU here"):
            assert cuda_build.load_extension("probe_ext", ["stream_ops.cu"]) is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert cuda_build.load_extension("probe_ext", ["stream_ops.cu"]) is None  # no second warning
        assert "no GPU here" in cuda_build.failure_reason("probe_ext")
    finally:
        cuda_build.forget("probe_ext")


def test_build_failure_is_one_warning(monkeypatch, tmp_path):
    monkeypatch.setattr(cuda_build, "unavailable_reason", lambda: None)
    monkeypatch.setenv(cuda_build.CACHE_ENV, str(tmp_path))
    cuda_build.forget("broken_ext")
    try:
        with pytest.warns(RuntimeWarning, match="build failed"):
            assert cuda_build.load_extension("broken_ext", [str(tmp_path / "missing.cu")]) is None
    finally:
        cuda_build.forget("broken_ext")


def test_source_digest_changes_with_the_source(tmp_path):
    src = tmp_path / "a.cu"
    src.write_text("__global__ void k() {}\n")
    first = cuda_build.source_digest([src])
    src.write_text("__global__ void k() { }\n")
    assert cuda_build.source_digest([src]) != first


def test_unavailable_without_gpu_or_when_disabled(monkeypatch):
    monkeypatch.setenv(cuda_build.DISABLE_ENV, "1")
    assert "STREAMSTUDIO_DISABLE_CUDA_KERNELS" in cuda_build.unavailable_reason()
    monkeypatch.delenv(cuda_build.DISABLE_ENV)
    if not torch.cuda.is_available():
        assert cuda_build.unavailable_reason() is not None
        assert not kernels.fused_available()


# ------------------------------------------------------------------------------ GPU parity
DTYPE_TOL = {torch.float32: 2e-5, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


@pytest.fixture()
def ops():
    ext = cuda_build.load_extension(kernels.EXTENSION, kernels.SOURCES)
    assert ext is not None, f"the fused kernels did not build: {cuda_build.failure_reason(kernels.EXTENSION)}"
    return ext


def _fresh_gen() -> torch.Generator:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()) ^ int.from_bytes(np.random.bytes(4), "little"))
    return gen


def _poisoned(shape, dtype, value):
    return torch.full(shape, value, device="cuda", dtype=dtype)


def _assert_close(got, want, dtype, scale=1.0):
    tol = DTYPE_TOL[dtype] * scale
    err = (got.float() - want.float()).abs()
    bound = tol * want.float().abs().clamp_min(1.0)
    assert torch.isfinite(got.float()).all(), "output not fully written (poison left)"
    assert (err <= bound).all(), f"max error {err.max().item():.3g} over the {dtype} bound {tol:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("size,out", [((48, 64), (48, 64)), ((37, 53), (37, 53)), ((37, 53), (24, 40)),
                                      ((20, 30), (45, 31)), ((1080, 1920), (512, 512)), ((101, 77), (13, 11))])
@pytest.mark.parametrize("bgr", [False, True])
def test_gpu_preprocess(ops, dtype, size, out, bgr):
    gen = _fresh_gen()
    frames = torch.randint(0, 256, (3, *size, 3), device="cuda", dtype=torch.uint8, generator=gen)
    want = reference.preprocess(frames, *out, torch.float32, bgr)
    result = _poisoned((3, 3, *out), dtype, float("nan"))
    ops.preprocess(frames, result, bgr)
    torch.cuda.synchronize()
    _assert_close(result, want, dtype, scale=1.0 if dtype != torch.float32 else 5.0)
    assert kernels.preprocess(frames[0], *out, dtype, bgr).shape == (1, 3, *out)  # public path, single frame
    odd = frames[:, 1:, :, :]  # non-contiguous view with an odd height
    _assert_close(kernels.preprocess(odd, *out, dtype, bgr), reference.preprocess(odd, *out, torch.float32, bgr), dtype,
                  scale=1.0 if dtype != torch.float32 else 5.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 3, 64, 64), (3, 3, 37, 53), (1, 3, 1, 7), (2, 3, 512, 512)])
def test_gpu_postprocess(ops, dtype, shape):
    gen = _fresh_gen()
    images = (torch.rand(shape, device="cuda", generator=gen) * 2.4 - 1.2).to(dtype)
    want = reference.postprocess(images)
    for poison in (0, 255):  # an unwritten byte differs from the reference under one of them
        result = _poisoned((shape[0], shape[2], shape[3], 3), torch.uint8, poison)
        ops.postprocess(images, result)
        torch.cuda.synchronize()
        assert torch.equal(result, want), f"{(result.int() - want.int()).abs().max().item()} levels off"
    shifted = torch.empty(images.numel() + 1, device="cuda", dtype=dtype)[1:].view(shape)  # misaligned
    shifted.copy_(images)
    assert torch.equal(kernels.postprocess(shifted), want)
    ties = torch.from_numpy(half_points()).cuda()
    tie_images = ties.repeat(3).view(1, 3, 1, -1)
    assert torch.equal(kernels.postprocess(tie_images), reference.postprocess(tie_images.cpu()).cuda())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cfg", ALL_CFG)
@pytest.mark.parametrize("shape,offset", [((4, 4, 64, 64), 0), ((3, 4, 7, 9), 0), ((2, 4, 8, 8), 1)])
def test_gpu_stream_step(ops, dtype, cfg, shape, offset):
    gen = _fresh_gen()
    n = int(np.prod(shape))

    def make():  # offset 1 makes the pointer unaligned (the scalar path)
        t = torch.randn(n + offset, device="cuda", generator=gen).to(dtype)
        return t[offset:].view(shape)

    x, text, uncond, stock, noise = (make() for _ in range(5))
    coef = random_coef(shape[0], torch.Generator().manual_seed(int(gen.initial_seed() % 2**31))).float().cuda()
    want = reference.stream_step(x, text, uncond, stock, noise, coef, 1.4, 0.9, cfg)
    outs = [_poisoned(shape, dtype, float("nan")) for _ in range(3)]
    uses_stock = cfg in (CFG_SELF, CFG_INITIALIZE)
    ops.stream_step(x, text, uncond if cfg == CFG_FULL else x, stock if uses_stock else x, noise, coef,
                    outs[0], outs[1], outs[2] if uses_stock else outs[0], 1.4, 0.9, cfg)
    torch.cuda.synchronize()
    if not uses_stock:
        outs[2] = stock
    scale = 1.0 if dtype != torch.float32 else 0.5
    for got, ref in zip(outs, want):
        _assert_close(got, ref, dtype, scale)
    for got, ref in zip(kernels.stream_step(x, text, uncond, stock, noise, coef, 1.4, 0.9, cfg), want):
        _assert_close(got, ref, dtype, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,offset", [(1, 0), (1000003, 0), (3 * 512 * 512, 0), (4 * 64 * 64 + 5, 3)])
def test_gpu_cosine_similarity(ops, dtype, n, offset):
    gen = _fresh_gen()
    base = torch.randn(n + offset, device="cuda", generator=gen)
    a = base[offset:].to(dtype)
    b = (0.7 * base[offset:] + 0.3 * torch.randn(n, device="cuda", generator=gen)).to(dtype)
    if offset:
        a = torch.empty(n + offset, device="cuda", dtype=dtype)[offset:].copy_(a)
    want = float(reference.cosine_similarity(a.double(), b.double()))
    out = _poisoned((1,), torch.float32, float("nan"))
    partial = _poisoned((3 * 1024,), torch.float32, float("nan"))
    ops.cosine_similarity(a, b, partial, out)
    torch.cuda.synchronize()
    assert abs(out.item() - want) <= 1e-5 * max(1.0, abs(want))
    assert abs(float(kernels.cosine_similarity(a, b)) - want) <= 1e-5


@pytest.mark.gpu
def test_gpu_dispatch_uses_the_extension():
    assert kernels.fused_available(), cuda_build.failure_reason(kernels.EXTENSION)


@pytest.mark.gpu
def test_gpu_pipeline_fused_matches_reference(tiny_components_factory, monkeypatch):
    """The image pipeline on CUDA with the fused ops gives the reference path's frames."""
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    comps = tiny_components_factory(taesd=True).to(torch.device("cuda"), torch.float32)
    rng = np.random.default_rng()
    frames = [rng.integers(0, 256, (72, 100, 3), dtype=np.uint8) for _ in range(4)]  # resized to 64x64
    config = StreamDiffusionConfig(width=64, height=64, steps=2, cfg_type="self", guidance_scale=1.5,
                                   similarity_filter=True, similarity_threshold=0.5)

    def run():
        stream = StreamDiffusion(comps, config, prompt="a cat")
        return [np.asarray(stream(f), dtype=np.int16) for f in frames]

    fused = run()
    monkeypatch.setattr(kernels, "_ops", lambda *tensors: None)
    ref = run()
    for a, b in zip(fused, ref):
        assert np.abs(a - b).max() <= 2


@pytest.mark.skipif(shutil.which("g++") is None or cuda_build.cuda_include_dir() is None,
                    reason="needs g++ and the CUDA headers")
def test_a_passing_binding_check_is_remembered_until_the_binding_changes(tmp_path, monkeypatch):
    """The check of an unchanged binding is not compiled again (a minute of CPU each); an edit, or
    a failure, compiles it."""
    monkeypatch.setenv(cuda_build.CACHE_ENV, str(tmp_path / "cache"))
    src = tmp_path / "tiny_binding.cpp"
    src.write_text("int answer() { return 42; }\n")
    calls = []
    real = cuda_build._compile_binding
    monkeypatch.setattr(cuda_build, "_compile_binding", lambda *a: calls.append(a[0]) or real(*a))
    assert cuda_build.binding_check(src).ok and cuda_build.binding_check(src).ok
    assert len(calls) == 1  # the second came from the cache
    src.write_text("int answer() { return 43; }\n")
    assert cuda_build.binding_check(src).ok and len(calls) == 2  # edited: compiled again
    src.write_text("int answer() { return nope; }\n")
    assert not cuda_build.binding_check(src).ok and not cuda_build.binding_check(src).ok
    assert len(calls) == 4  # a failure is never remembered
