"""The CUDA source of the fused ops, run on the CPU: stream_ops.cu compiled with g++ against
a small emulation of CUDA's thread indices and intrinsics (every thread of the grid runs one
after another; the element-wise kernels never talk between threads, so this computes what the
GPU computes). The real launchers run, so the alignment checks and the choice between vector
and scalar kernels are exercised too. Outputs are poisoned before each call and compared with
the pure-torch references. The cosine reduction runs each block's threads concurrently, with
barriers for __syncthreads and warp shuffles."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from streamstudio.kernels import cuda_build, reference
from streamstudio.kernels.reference import CFG_FULL, CFG_INITIALIZE, CFG_NONE, CFG_SELF
from helpers import half_points

EMULATION = r"""
#include <cuda_runtime.h>  // dim3, cudaStream_t, cudaError_t (declarations only)
#include <barrier>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#undef __shared__
#define __shared__ static  // one block runs at a time

namespace emu {
thread_local dim3 block_idx, thread_idx, block_dim, grid_dim;
bool threaded = false;  // run a block's threads concurrently (kernels with barriers / shuffles)
struct Block {
  std::unique_ptr<std::barrier<>> sync;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<float> lanes;  // one slot per thread for shuffles
};
Block* block = nullptr;
}  // namespace emu
#define blockIdx emu::block_idx
#define threadIdx emu::thread_idx
#define blockDim emu::block_dim
#define gridDim emu::grid_dim

template <typename T> static inline T __ldg(const T* p) { return *p; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline void __syncthreads() { emu::block->sync->arrive_and_wait(); }
static inline float __shfl_down_sync(unsigned, float v, int off) {  // whole warps only, as the kernels use it
  const unsigned t = threadIdx.x, lane = t & 31, warp = t >> 5;
  emu::block->lanes[t] = v;
  emu::block->warps[warp]->arrive_and_wait();
  const float r = lane + off < 32 ? emu::block->lanes[t + off] : v;
  emu::block->warps[warp]->arrive_and_wait();
  return r;
}

template <typename... KArgs, typename... Args>
void streamstudio_emulate_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, Args... args) {
  emu::grid_dim = grid;
  emu::block_dim = block;
  const unsigned n = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        auto run = [&, bx, by, bz](unsigned tid) {
          emu::grid_dim = grid;
          emu::block_dim = block;
          emu::block_idx = dim3(bx, by, bz);
          emu::thread_idx = dim3(tid % block.x, tid / block.x % block.y, tid / (block.x * block.y));
          kernel(args...);
        };
        if (!emu::threaded) {
          for (unsigned tid = 0; tid < n; ++tid) run(tid);
          continue;
        }
        emu::Block b;
        b.sync = std::make_unique<std::barrier<>>(n);
        for (unsigned w = 0; w < (n + 31) / 32; ++w) b.warps.push_back(std::make_unique<std::barrier<>>(32));
        b.lanes.assign(n, 0.0f);
        emu::block = &b;
        std::vector<std::thread> threads;
        for (unsigned tid = 0; tid < n; ++tid) threads.emplace_back(run, tid);
        for (auto& t : threads) t.join();
        emu::block = nullptr;
      }
}

extern "C" cudaError_t cudaGetLastError(void) { return cudaSuccess; }

#define STREAMSTUDIO_HOST_EMULATION
#include "stream_ops.cu"

extern "C" {
int emu_preprocess(const uint8_t* in, void* out, int dtype, int b, int h, int w, int c, int oh, int ow, int bgr) {
  return streamstudio::preprocess_launch(in, out, dtype, b, h, w, c, oh, ow, bgr != 0, nullptr);
}
int emu_postprocess(const void* in, int dtype, uint8_t* out, int b, int h, int w) {
  return streamstudio::postprocess_launch(in, dtype, out, b, h, w, nullptr);
}
int emu_stream_step(const void* x, const void* text, const void* uncond, const void* stock, const void* noise,
                    const float* coef, void* x0, void* x_next, void* stock_next, int64_t numel, int64_t row,
                    float guidance, float delta, int dtype, int cfg) {
  streamstudio::StepArgs a{x, text, uncond, stock, noise, coef, x0, x_next, stock_next, numel, row, guidance, delta};
  return streamstudio::stream_step_launch(a, dtype, cfg, nullptr);
}
int emu_cosine(const void* a, const void* b, int dtype, int64_t n, float* partial, int max_blocks, float* out) {
  emu::threaded = true;
  const int rc = streamstudio::cosine_launch(a, b, dtype, n, partial, max_blocks, out, nullptr);
  emu::threaded = false;
  return rc;
}
}
"""

DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
TOL = {torch.float32: 2e-5, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def _cuda_include() -> Path | None:
    nvcc = cuda_build.find_nvcc()
    candidates = ([Path(nvcc).resolve().parent.parent / "include"] if nvcc else []) + [Path("/usr/local/cuda/include")]
    return next((p for p in candidates if (p / "cuda_fp16.h").is_file()), None)


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    include, gxx = _cuda_include(), shutil.which("g++")
    if include is None or gxx is None:
        pytest.skip("needs g++ and the CUDA headers (cuda_fp16.h)")
    folder = tmp_path_factory.mktemp("emu")
    src = folder / "emu.cpp"
    src.write_text(EMULATION)
    lib = folder / "libemu.so"
    cmd = [gxx, "-std=c++20", "-O2", "-ffp-contract=off", "-fPIC", "-shared", "-pthread", "-Wno-attributes",
           f"-I{cuda_build.CSRC}", f"-I{include}", str(src), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"g++ could not build the emulation:\n{proc.stderr[-4000:]}"
    return ctypes.CDLL(str(lib))


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of t whose data starts `offset` elements into a fresh buffer (misaligned for offset > 0)."""
    buf = torch.empty(t.numel() + offset, dtype=t.dtype)
    out = buf[offset:].view(t.shape)
    out.copy_(t)
    return out


def _assert_close(got, want, dtype, scale=1.0):
    assert torch.isfinite(got.float()).all(), "output not fully written (poison left)"
    err = (got.float() - want.float()).abs()
    bound = TOL[dtype] * scale * want.float().abs().clamp_min(1.0)
    assert (err <= bound).all(), f"max error {err.max().item():.3g} over the {dtype} bound"


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("size,out,offset", [((8, 12), (8, 12), 0), ((8, 12), (8, 12), 1), ((7, 9), (7, 9), 0),
                                             ((37, 53), (24, 40), 0), ((20, 30), (45, 31), 0),
                                             ((64, 17), (16, 40), 0), ((135, 240), (64, 64), 0)])
@pytest.mark.parametrize("bgr", [False, True])
@pytest.mark.parametrize("channels", [3, 4])
def test_emulated_preprocess(emu, dtype, size, out, offset, bgr, channels):
    gen = torch.Generator().manual_seed(hash((size, out, offset, bgr, str(dtype), channels)) % 2**31)
    frames = _offset(torch.randint(0, 256, (2, *size, channels), generator=gen, dtype=torch.uint8), offset)
    want = reference.preprocess(frames, *out, torch.float32, bgr)
    got = torch.full((2, 3, *out), float("nan"), dtype=dtype)
    assert emu.emu_preprocess(_ptr(frames), _ptr(got), DTYPES[dtype], 2, *size, channels, *out, int(bgr)) == 0
    _assert_close(got, want, dtype, scale=5.0 if dtype == torch.float32 else 1.0)
    if size == out and dtype == torch.float32:
        assert torch.equal(got, want)  # same size: bit-exact


def test_emulated_preprocess_refuses_other_channel_counts(emu):
    frames = torch.zeros((1, 4, 4, 2), dtype=torch.uint8)
    got = torch.zeros((1, 3, 4, 4))
    assert emu.emu_preprocess(_ptr(frames), _ptr(got), 0, 1, 4, 4, 2, 4, 4, 0) != 0


def test_reference_composites_rgba_on_black():
    """Independent of the formula in reference.py: a pixel of colour c at alpha a over black is
    c * a / 255 (alpha 0: black, 255: the colour itself), before normalization to [-1, 1]."""
    rgba = torch.tensor([[[[200, 100, 50, 255], [200, 100, 50, 0], [255, 255, 255, 51]]]], dtype=torch.uint8)
    got = reference.preprocess(rgba, 1, 3)  # (1, 3, 1, 3)
    want_0_255 = torch.tensor([[200, 0, 51], [100, 0, 51], [50, 0, 51]], dtype=torch.float32)  # channel x pixel
    torch.testing.assert_close(got[0, :, 0, :], want_0_255 / 127.5 - 1.0)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape,offset", [((2, 3, 8, 12), 0), ((2, 3, 8, 12), 1), ((1, 3, 7, 9), 0),
                                          ((3, 3, 5, 4), 2)])
def test_emulated_postprocess(emu, dtype, shape, offset):
    gen = torch.Generator().manual_seed(hash((shape, offset, str(dtype))) % 2**31)
    images = _offset((torch.rand(shape, generator=gen) * 2.4 - 1.2).to(dtype), offset)
    want = reference.postprocess(images)
    for poison in (0, 255):
        got = torch.full((shape[0], shape[2], shape[3], 3), poison, dtype=torch.uint8)
        assert emu.emu_postprocess(_ptr(images), DTYPES[dtype], _ptr(got), shape[0], shape[2], shape[3]) == 0
        assert torch.equal(got, want)


def test_emulated_postprocess_rounds_ties_to_even(emu):
    ties = half_points(5)  # float32 v with fl(fl(v + 1) * 127.5) == k + 0.5
    assert len(ties) > 20
    images = torch.from_numpy(np.tile(ties, 3)).view(1, 3, 1, len(ties))
    got = torch.full((1, 1, len(ties), 3), 7, dtype=torch.uint8)
    assert emu.emu_postprocess(_ptr(images), 0, _ptr(got), 1, 1, len(ties)) == 0
    assert torch.equal(got, reference.postprocess(images))
    assert (got.numpy() % 2 == 0).all()


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cfg", [CFG_NONE, CFG_SELF, CFG_INITIALIZE, CFG_FULL])
@pytest.mark.parametrize("shape,offset", [((4, 4, 8, 8), 0), ((3, 4, 7, 9), 0), ((2, 4, 8, 8), 1)])
def test_emulated_stream_step(emu, dtype, cfg, shape, offset):
    gen = torch.Generator().manual_seed(hash((shape, offset, cfg, str(dtype))) % 2**31)
    x, text, uncond, stock, noise = (_offset(torch.randn(shape, generator=gen).to(dtype), offset) for _ in range(5))
    abar = torch.rand(shape[0], 2, generator=gen) * 0.9 + 0.05
    s = torch.rand(shape[0], generator=gen) * 10
    coef = torch.stack([abar[:, 0].sqrt(), (1 - abar[:, 0]).sqrt(), 0.25 / (s ** 2 + 0.25), s / (s ** 2 + 0.25).sqrt(),
                        abar[:, 1].sqrt(), (1 - abar[:, 1]).sqrt()], 1).float().contiguous()  # (B, 6)
    want = reference.stream_step(x, text, uncond, stock, noise, coef, 1.4, 0.9, cfg)
    outs = [_offset(torch.full(shape, float("nan"), dtype=dtype), offset) for _ in range(3)]
    uses_stock = cfg in (CFG_SELF, CFG_INITIALIZE)
    n = x.numel()
    rc = emu.emu_stream_step(_ptr(x), _ptr(text), _ptr(uncond if cfg == CFG_FULL else x),
                             _ptr(stock if uses_stock else x), _ptr(noise), _ptr(coef), _ptr(outs[0]), _ptr(outs[1]),
                             _ptr(outs[2] if uses_stock else outs[0]), ctypes.c_int64(n), ctypes.c_int64(n // shape[0]),
                             ctypes.c_float(1.4), ctypes.c_float(0.9), DTYPES[dtype], cfg)
    assert rc == 0
    if not uses_stock:
        outs[2] = stock  # the kernel leaves stock alone; the public function returns it
    for got, ref in zip(outs, want):
        if dtype == torch.float32:
            torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)  # op-by-op rounding as torch
        else:
            _assert_close(got, ref, dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n,offset,max_blocks", [(1, 0, 4), (5000, 0, 4), (5003, 1, 4), (70000, 0, 2), (0, 0, 4)])
def test_emulated_cosine_similarity(emu, dtype, n, offset, max_blocks):
    gen = torch.Generator().manual_seed(n + offset + DTYPES[dtype])
    base = torch.randn(n, generator=gen)
    a = _offset(base.to(dtype), offset)
    b = _offset((0.6 * base + 0.4 * torch.randn(n, generator=gen)).to(dtype), offset)
    want = float(reference.cosine_similarity(a.double(), b.double())) if n else 0.0
    partial = torch.full((3 * max_blocks,), float("nan"))
    out = torch.full((1,), float("nan"))
    assert emu.emu_cosine(_ptr(a), _ptr(b), DTYPES[dtype], ctypes.c_int64(n), _ptr(partial), max_blocks, _ptr(out)) == 0
    assert abs(out.item() - want) <= 1e-5 * max(1.0, abs(want))
