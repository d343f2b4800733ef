// Fused ops of the image pipeline's hot path (see streamstudio/kernels/reference.py for the
// exact semantics each kernel matches):
//   preprocess    uint8 (B, H, W, 3 or 4) RGB/BGR(A) -> resized, normalized (B, 3, h, w) in [-1, 1];
//                 RGBA is composited on black (c * a / 255) before the resize
//   postprocess   (B, 3, H, W) in [-1, 1] -> uint8 (B, H, W, 3), clamped, rounded half to even
//   stream_step   RCFG combination + LCM/turbo x0 + re-noise + stock update, whole buffer
//   cosine        dot(a, b) / (|a| |b|) as one pass over both tensors (+ a one-block finish)
//
// Plain CUDA (no torch headers) so that the CPU test can compile it with nvcc alone; the
// launchers below are called by stream_ops.cpp, which checks the tensors.
// Arithmetic is float32 inside every kernel, as in the reference. Element-wise formulas use
// the __f*_rn intrinsics so that nvcc does not contract them into FMAs: the result is then
// rounded op by op exactly as torch's eager element-wise kernels round it.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <algorithm>

#include "stream_ops.h"

namespace streamstudio {

// ------------------------------------------------------------------------ scalar helpers
template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// N elements of T moved as one aligned access (16 bytes when N * sizeof(T) == 16).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}

__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------------ preprocess
// The resize is torch's separable triangle filter (F.interpolate bilinear, antialias=True):
// per axis, scale s = in / out, support r = max(s, 1), centre c = s * (i + 0.5), taps
// j in [trunc(c - r + 0.5), trunc(c + r + 0.5)) clipped to the image, weight
// max(0, 1 - |(j - c + 0.5) / max(s, 1)|) normalized to sum 1. With s <= 1 this is exactly
// half-pixel bilinear with edge clamping (antialias=False), so one kernel covers both.
struct Axis {
  float scale;     // in / out
  float support;   // max(scale, 1)
  float invscale;  // 1 / max(scale, 1)
  int in_size;
};

__device__ __forceinline__ float triangle(float x) {
  x = fabsf(x);
  return x < 1.0f ? 1.0f - x : 0.0f;
}

// The taps of output index i along one axis: first tap, count, centre and 1 / sum of weights.
__device__ __forceinline__ void axis_taps(int i, const Axis& a, int& lo, int& n, float& center, float& inv_total) {
  center = a.scale * (static_cast<float>(i) + 0.5f);
  lo = max(static_cast<int>(center - a.support + 0.5f), 0);
  const int hi = min(static_cast<int>(center + a.support + 0.5f), a.in_size);
  n = hi - lo;
  float total = 0.0f;
  for (int j = 0; j < n; ++j) total += triangle((static_cast<float>(j + lo) - center + 0.5f) * a.invscale);
  inv_total = total != 0.0f ? 1.0f / total : 0.0f;
}

__device__ __forceinline__ float tap_weight(int j, int lo, float center, float inv_total, const Axis& a) {
  return triangle((static_cast<float>(j + lo) - center + 0.5f) * a.invscale) * inv_total;
}

__device__ __forceinline__ float normalize_pixel(float v) {  // [0, 255] -> [-1, 1], as x / 127.5 - 1
  return __fsub_rn(__fdiv_rn(v, 127.5f), 1.0f);
}

// Channel c of a pixel of C channels; with C == 4, composited on black: c * (a / 255), as the
// reference rounds it (the division first).
template <int C>
__device__ __forceinline__ float pixel_channel(const uint8_t* px, int c) {
  const float v = static_cast<float>(__ldg(px + c));
  if (C == 4) return __fmul_rn(v, __fdiv_rn(static_cast<float>(__ldg(px + 3)), 255.0f));
  return v;
}

// One thread per output pixel (all three channels). grid: (cdiv(ow, 32), cdiv(oh, 8), B).
// C: input channels, 3 (RGB) or 4 (RGBA, composited on black).
template <typename T, bool BGR, int C>
__global__ void __launch_bounds__(256) preprocess_resize_kernel(
    const uint8_t* __restrict__ in,  // (B, H, W, C)
    T* __restrict__ out,             // (B, 3, oh, ow)
    Axis ax, Axis ay, int oh, int ow) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  const int b = blockIdx.z;
  if (x >= ow || y >= oh) return;
  int x_lo, x_n, y_lo, y_n;
  float x_c, x_inv, y_c, y_inv;
  axis_taps(x, ax, x_lo, x_n, x_c, x_inv);
  axis_taps(y, ay, y_lo, y_n, y_c, y_inv);
  const int64_t in_w = ax.in_size;
  const uint8_t* img = in + static_cast<int64_t>(b) * ay.in_size * in_w * C;
  float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f;
  for (int jy = 0; jy < y_n; ++jy) {
    const uint8_t* row = img + (static_cast<int64_t>(y_lo + jy) * in_w + x_lo) * C;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f;  // horizontal pass of this row
    for (int jx = 0; jx < x_n; ++jx) {
      const float w = tap_weight(jx, x_lo, x_c, x_inv, ax);
      s0 += w * pixel_channel<C>(row + C * jx, 0);
      s1 += w * pixel_channel<C>(row + C * jx, 1);
      s2 += w * pixel_channel<C>(row + C * jx, 2);
    }
    const float wy = tap_weight(jy, y_lo, y_c, y_inv, ay);
    acc0 += wy * s0;
    acc1 += wy * s1;
    acc2 += wy * s2;
  }
  const int64_t plane = static_cast<int64_t>(oh) * ow;
  T* o = out + static_cast<int64_t>(b) * 3 * plane + static_cast<int64_t>(y) * ow + x;
  o[0] = from_f<T>(normalize_pixel(BGR ? acc2 : acc0));
  o[plane] = from_f<T>(normalize_pixel(acc1));
  o[2 * plane] = from_f<T>(normalize_pixel(BGR ? acc0 : acc2));
}

// Same size in and out: 4 pixels per thread, three 4-byte loads and three 4-wide stores.
// Needs hw % 4 == 0, `in` 4-byte aligned and `out` aligned to 4 * sizeof(T).
template <typename T, bool BGR>
__global__ void __launch_bounds__(256) preprocess_copy4_kernel(
    const uint8_t* __restrict__ in,  // (B, H, W, 3)
    T* __restrict__ out,             // (B, 3, H, W)
    int64_t n_pix, int64_t hw) {
  const int64_t p0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (p0 >= n_pix) return;
  const uint32_t* src = reinterpret_cast<const uint32_t*>(in + p0 * 3);
  const uint32_t words[3] = {__ldg(src), __ldg(src + 1), __ldg(src + 2)};  // 12 bytes: 4 RGB pixels
  const int64_t b = p0 / hw;
  const int64_t yx = p0 - b * hw;
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    const int src_c = BGR ? 2 - c : c;
    Pack<T, 4> o;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int byte = 3 * k + src_c;  // compile-time after unrolling
      const uint32_t v = (words[byte / 4] >> (8 * (byte % 4))) & 0xffu;
      o.v[k] = from_f<T>(normalize_pixel(static_cast<float>(v)));
    }
    store_pack<T, 4>(out + (b * 3 + c) * hw + yx, o);
  }
}

// ------------------------------------------------------------------------ postprocess
__device__ __forceinline__ uint32_t to_u8(float v) {  // clamp((v + 1) * 127.5, 0, 255), round half to even
  const float x = __fmul_rn(__fadd_rn(v, 1.0f), 127.5f);
  return static_cast<uint32_t>(__float2int_rn(fminf(fmaxf(x, 0.0f), 255.0f)));  // NaN -> 0
}

// 4 pixels per thread: three 4-wide loads, three 4-byte stores. Needs hw % 4 == 0 and
// aligned pointers (as preprocess_copy4_kernel).
template <typename T>
__global__ void __launch_bounds__(256) postprocess_vec4_kernel(
    const T* __restrict__ in,  // (B, 3, H, W)
    uint8_t* __restrict__ out, // (B, H, W, 3)
    int64_t n_pix, int64_t hw) {
  const int64_t p0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (p0 >= n_pix) return;
  const int64_t b = p0 / hw;
  const int64_t yx = p0 - b * hw;
  const T* base = in + b * 3 * hw + yx;
  const Pack<T, 4> r = load_pack<T, 4>(base);
  const Pack<T, 4> g = load_pack<T, 4>(base + hw);
  const Pack<T, 4> bl = load_pack<T, 4>(base + 2 * hw);
  uint32_t bytes[12];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    bytes[3 * k + 0] = to_u8(to_f<T>(r.v[k]));
    bytes[3 * k + 1] = to_u8(to_f<T>(g.v[k]));
    bytes[3 * k + 2] = to_u8(to_f<T>(bl.v[k]));
  }
  uint32_t* dst = reinterpret_cast<uint32_t*>(out + p0 * 3);
#pragma unroll
  for (int w = 0; w < 3; ++w)
    dst[w] = bytes[4 * w] | (bytes[4 * w + 1] << 8) | (bytes[4 * w + 2] << 16) | (bytes[4 * w + 3] << 24);
}

// Any shape and alignment: one pixel per thread.
template <typename T>
__global__ void __launch_bounds__(256) postprocess_scalar_kernel(
    const T* __restrict__ in, uint8_t* __restrict__ out, int64_t n_pix, int64_t hw) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= n_pix) return;
  const int64_t b = p / hw;
  const int64_t yx = p - b * hw;
  const T* base = in + b * 3 * hw + yx;
#pragma unroll
  for (int c = 0; c < 3; ++c) out[p * 3 + c] = static_cast<uint8_t>(to_u8(to_f<T>(base[c * hw])));
}

// ------------------------------------------------------------------------ stream_step
struct RowCoef {
  float alpha, beta, c_skip, c_out, alpha_next, beta_next;
};

__device__ __forceinline__ RowCoef load_coef(const float* coef, int64_t row) {
  const float* c = coef + row * 6;
  return RowCoef{__ldg(c), __ldg(c + 1), __ldg(c + 2), __ldg(c + 3), __ldg(c + 4), __ldg(c + 5)};
}

// x0 = c_out * ((x - beta * eps) / alpha) + c_skip * x, rounded op by op as the reference.
__device__ __forceinline__ float lcm_x0(float x, float eps, const RowCoef& k) {
  const float f = __fdiv_rn(__fsub_rn(x, __fmul_rn(k.beta, eps)), k.alpha);
  return __fadd_rn(__fmul_rn(k.c_out, f), __fmul_rn(k.c_skip, x));
}

template <int CFG>
__device__ __forceinline__ void step_element(float x, float text, float uncond_in, float stock, float noise,
                                             const RowCoef& k, float guidance, float delta,
                                             float& x0, float& x_next, float& stock_next) {
  float eps = text;
  if (CFG != kCfgNone) {
    const float uncond = CFG == kCfgFull ? uncond_in : __fmul_rn(delta, stock);
    eps = __fadd_rn(uncond, __fmul_rn(guidance, __fsub_rn(text, uncond)));
  }
  x0 = lcm_x0(x, eps, k);
  x_next = __fadd_rn(__fmul_rn(k.alpha_next, x0), __fmul_rn(k.beta_next, noise));
  if (CFG == kCfgSelf || CFG == kCfgInitialize) {
    // scaled_noise = beta * stock (StreamDiffusion's unet_step): the stock, not x, is stepped.
    const float scaled = __fmul_rn(k.beta, stock);
    const float delta_x = lcm_x0(scaled, eps, k);
    stock_next = __fadd_rn(noise, __fmul_rn(__fdiv_rn(k.alpha_next, k.beta_next), delta_x));
  }
}

// N consecutive elements per thread (N = 16 bytes / sizeof(T) when row % N == 0 and every
// pointer is 16-byte aligned, else N = 1); all N lie in one row of the buffer.
template <typename T, int CFG, int N>
__global__ void __launch_bounds__(256) stream_step_kernel(StepArgs a) {
  constexpr bool kStock = CFG == kCfgSelf || CFG == kCfgInitialize;
  const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * N;
  if (i0 >= a.numel) return;
  const RowCoef k = load_coef(a.coef, i0 / a.row);
  const Pack<T, N> x = load_pack<T, N>(static_cast<const T*>(a.x) + i0);
  const Pack<T, N> text = load_pack<T, N>(static_cast<const T*>(a.text) + i0);
  const Pack<T, N> noise = load_pack<T, N>(static_cast<const T*>(a.noise) + i0);
  Pack<T, N> uncond, stock;
  if (CFG == kCfgFull) uncond = load_pack<T, N>(static_cast<const T*>(a.uncond) + i0);
  if (kStock) stock = load_pack<T, N>(static_cast<const T*>(a.stock) + i0);
  Pack<T, N> x0, x_next, stock_next;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    float f_x0, f_next, f_stock = 0.0f;
    step_element<CFG>(to_f<T>(x.v[e]), to_f<T>(text.v[e]), CFG == kCfgFull ? to_f<T>(uncond.v[e]) : 0.0f,
                      kStock ? to_f<T>(stock.v[e]) : 0.0f, to_f<T>(noise.v[e]), k, a.guidance, a.delta,
                      f_x0, f_next, f_stock);
    x0.v[e] = from_f<T>(f_x0);
    x_next.v[e] = from_f<T>(f_next);
    stock_next.v[e] = from_f<T>(f_stock);
  }
  store_pack<T, N>(static_cast<T*>(a.x0) + i0, x0);
  store_pack<T, N>(static_cast<T*>(a.x_next) + i0, x_next);
  if (kStock) store_pack<T, N>(static_cast<T*>(a.stock_next) + i0, stock_next);
}

// ------------------------------------------------------------------------ cosine similarity
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

// Per block: partial sums of a.b, a.a and b.b into partial[3 * blockIdx.x + {0, 1, 2}].
// Grid-stride over packs of N elements; the n % N tail goes to block 0. blockDim.x == 256.
template <typename T, int N>
__global__ void __launch_bounds__(256) cosine_partial_kernel(
    const T* __restrict__ a, const T* __restrict__ b, int64_t n, float* __restrict__ partial) {
  float dot = 0.0f, aa = 0.0f, bb = 0.0f;
  const int64_t packs = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const Pack<T, N> va = load_pack<T, N>(a + p * N);
    const Pack<T, N> vb = load_pack<T, N>(b + p * N);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float fa = to_f<T>(va.v[e]), fb = to_f<T>(vb.v[e]);
      dot = fmaf(fa, fb, dot);
      aa = fmaf(fa, fa, aa);
      bb = fmaf(fb, fb, bb);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x < n - packs * N) {
    const float fa = to_f<T>(a[packs * N + threadIdx.x]), fb = to_f<T>(b[packs * N + threadIdx.x]);
    dot = fmaf(fa, fb, dot);
    aa = fmaf(fa, fa, aa);
    bb = fmaf(fb, fb, bb);
  }
  __shared__ float smem[3][8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  dot = warp_sum(dot);
  aa = warp_sum(aa);
  bb = warp_sum(bb);
  if (lane == 0) {
    smem[0][warp] = dot;
    smem[1][warp] = aa;
    smem[2][warp] = bb;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    dot = lane < warps ? smem[0][lane] : 0.0f;
    aa = lane < warps ? smem[1][lane] : 0.0f;
    bb = lane < warps ? smem[2][lane] : 0.0f;
    dot = warp_sum(dot);
    aa = warp_sum(aa);
    bb = warp_sum(bb);
    if (lane == 0) {
      partial[3 * blockIdx.x + 0] = dot;
      partial[3 * blockIdx.x + 1] = aa;
      partial[3 * blockIdx.x + 2] = bb;
    }
  }
}

// One block of 256 threads: sums the partials in double and writes
// dot / max(|a| |b|, 1e-12) as float32 (the reference's clamp_min(1e-12)).
__global__ void __launch_bounds__(256) cosine_finish_kernel(const float* __restrict__ partial, int blocks,
                                                            float* __restrict__ out) {
  __shared__ double smem[3][256];
  double dot = 0.0, aa = 0.0, bb = 0.0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) {
    dot += partial[3 * i];
    aa += partial[3 * i + 1];
    bb += partial[3 * i + 2];
  }
  smem[0][threadIdx.x] = dot;
  smem[1][threadIdx.x] = aa;
  smem[2][threadIdx.x] = bb;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      smem[0][threadIdx.x] += smem[0][threadIdx.x + s];
      smem[1][threadIdx.x] += smem[1][threadIdx.x + s];
      smem[2][threadIdx.x] += smem[2][threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double denom = fmax(sqrt(smem[1][0]) * sqrt(smem[2][0]), 1e-12);
    out[0] = static_cast<float>(smem[0][0] / denom);
  }
}

// ------------------------------------------------------------------------ launchers
namespace {

// kernel<<<grid, block, 0, s>>>(args...). Built with STREAMSTUDIO_HOST_EMULATION (the CPU test
// tests/acceleration/test_kernels_emulated.py compiles this file with g++), the emulator runs every thread
// of the grid one after another instead: all kernels but the cosine reduction are element-wise
// without inter-thread communication, so that computes exactly what the GPU computes.
template <typename... KArgs, typename... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t s, Args... args) {
#ifdef STREAMSTUDIO_HOST_EMULATION
  (void)s;
  streamstudio_emulate_launch(kernel, grid, block, args...);
#else
  kernel<<<grid, block, 0, s>>>(args...);
#endif
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

Axis make_axis(int in_size, int out_size) {
  const float scale = static_cast<float>(in_size) / static_cast<float>(out_size);
  const float support = scale >= 1.0f ? scale : 1.0f;
  return Axis{scale, support, 1.0f / support, in_size};
}

template <typename T, bool BGR>
void launch_preprocess(const uint8_t* in, void* out_v, int batch, int h, int w, int oh, int ow, int channels,
                       cudaStream_t s) {
  T* out = static_cast<T*>(out_v);
  const int64_t hw = static_cast<int64_t>(h) * w;
  if (channels == 3 && h == oh && w == ow && hw % 4 == 0 && aligned(in, 4) && aligned(out, 4 * sizeof(T))) {
    const int64_t n_pix = hw * batch;
    launch_kernel(preprocess_copy4_kernel<T, BGR>, dim3(static_cast<unsigned>(cdiv(n_pix / 4, 256))), dim3(256), s, in, out, n_pix, hw);
    return;
  }
  const dim3 block(32, 8);
  const dim3 grid(static_cast<unsigned>(cdiv(ow, 32)), static_cast<unsigned>(cdiv(oh, 8)), batch);
  if (channels == 4) {  // same size too: the taps are then one weight of 1, so the copy is exact
    launch_kernel(preprocess_resize_kernel<T, BGR, 4>, grid, block, s, in, out, make_axis(w, ow), make_axis(h, oh), oh, ow);
    return;
  }
  launch_kernel(preprocess_resize_kernel<T, BGR, 3>, grid, block, s, in, out, make_axis(w, ow), make_axis(h, oh), oh, ow);
}

template <typename T>
void launch_postprocess(const void* in_v, uint8_t* out, int batch, int h, int w, cudaStream_t s) {
  const T* in = static_cast<const T*>(in_v);
  const int64_t hw = static_cast<int64_t>(h) * w, n_pix = hw * batch;
  if (hw % 4 == 0 && aligned(in, 4 * sizeof(T)) && aligned(out, 4)) {
    launch_kernel(postprocess_vec4_kernel<T>, dim3(static_cast<unsigned>(cdiv(n_pix / 4, 256))), dim3(256), s, in, out, n_pix, hw);
  } else {
    launch_kernel(postprocess_scalar_kernel<T>, dim3(static_cast<unsigned>(cdiv(n_pix, 256))), dim3(256), s, in, out, n_pix, hw);
  }
}

template <typename T, int CFG>
void launch_step_cfg(const StepArgs& a, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = a.row % kVec == 0 && aligned(a.x, 16) && aligned(a.text, 16) && aligned(a.noise, 16) &&
                   aligned(a.x0, 16) && aligned(a.x_next, 16) && (CFG != kCfgFull || aligned(a.uncond, 16)) &&
                   ((CFG != kCfgSelf && CFG != kCfgInitialize) || (aligned(a.stock, 16) && aligned(a.stock_next, 16)));
  if (vec) {
    launch_kernel(stream_step_kernel<T, CFG, kVec>, dim3(static_cast<unsigned>(cdiv(a.numel / kVec, 256))), dim3(256), s, a);
  } else {
    launch_kernel(stream_step_kernel<T, CFG, 1>, dim3(static_cast<unsigned>(cdiv(a.numel, 256))), dim3(256), s, a);
  }
}

template <typename T>
void launch_step(const StepArgs& a, int cfg, cudaStream_t s) {
  switch (cfg) {
    case kCfgNone: launch_step_cfg<T, kCfgNone>(a, s); break;
    case kCfgSelf: launch_step_cfg<T, kCfgSelf>(a, s); break;
    case kCfgInitialize: launch_step_cfg<T, kCfgInitialize>(a, s); break;
    default: launch_step_cfg<T, kCfgFull>(a, s); break;
  }
}

template <typename T>
int launch_cosine(const void* a_v, const void* b_v, int64_t n, float* partial, int max_blocks, float* out,
                  cudaStream_t s) {
  const T* a = static_cast<const T*>(a_v);
  const T* b = static_cast<const T*>(b_v);
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = aligned(a, 16) && aligned(b, 16);
  const int64_t packs = vec ? n / kVec : n;
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(cdiv(packs, 256), max_blocks)));
  if (vec) {
    launch_kernel(cosine_partial_kernel<T, kVec>, dim3(blocks), dim3(256), s, a, b, n, partial);
  } else {
    launch_kernel(cosine_partial_kernel<T, 1>, dim3(blocks), dim3(256), s, a, b, n, partial);
  }
  launch_kernel(cosine_finish_kernel, dim3(1), dim3(256), s, partial, blocks, out);
  return blocks;
}

}  // namespace
}  // namespace streamstudio

// The public launchers are qualified definitions: each must match its declaration in
// stream_ops.h exactly, or nvcc fails (an unqualified one would silently add an overload).
cudaError_t streamstudio::preprocess_launch(const uint8_t* in, void* out, int dtype, int batch, int h, int w,
                                            int channels, int oh, int ow, bool bgr, cudaStream_t s) {
  if (channels != 3 && channels != 4) return cudaErrorInvalidValue;
  switch (dtype * 2 + (bgr ? 1 : 0)) {
    case kF32 * 2: launch_preprocess<float, false>(in, out, batch, h, w, oh, ow, channels, s); break;
    case kF32 * 2 + 1: launch_preprocess<float, true>(in, out, batch, h, w, oh, ow, channels, s); break;
    case kF16 * 2: launch_preprocess<__half, false>(in, out, batch, h, w, oh, ow, channels, s); break;
    case kF16 * 2 + 1: launch_preprocess<__half, true>(in, out, batch, h, w, oh, ow, channels, s); break;
    case kBF16 * 2: launch_preprocess<__nv_bfloat16, false>(in, out, batch, h, w, oh, ow, channels, s); break;
    default: launch_preprocess<__nv_bfloat16, true>(in, out, batch, h, w, oh, ow, channels, s); break;
  }
  return cudaGetLastError();
}

cudaError_t streamstudio::postprocess_launch(const void* in, int dtype, uint8_t* out, int batch, int h, int w,
                                             cudaStream_t s) {
  switch (dtype) {
    case kF32: launch_postprocess<float>(in, out, batch, h, w, s); break;
    case kF16: launch_postprocess<__half>(in, out, batch, h, w, s); break;
    default: launch_postprocess<__nv_bfloat16>(in, out, batch, h, w, s); break;
  }
  return cudaGetLastError();
}

cudaError_t streamstudio::stream_step_launch(const StepArgs& args, int dtype, int cfg, cudaStream_t s) {
  switch (dtype) {
    case kF32: launch_step<float>(args, cfg, s); break;
    case kF16: launch_step<__half>(args, cfg, s); break;
    default: launch_step<__nv_bfloat16>(args, cfg, s); break;
  }
  return cudaGetLastError();
}

cudaError_t streamstudio::cosine_launch(const void* a, const void* b, int dtype, int64_t n, float* partial,
                                        int max_blocks, float* out, cudaStream_t s) {
  switch (dtype) {
    case kF32: launch_cosine<float>(a, b, n, partial, max_blocks, out, s); break;
    case kF16: launch_cosine<__half>(a, b, n, partial, max_blocks, out, s); break;
    default: launch_cosine<__nv_bfloat16>(a, b, n, partial, max_blocks, out, s); break;
  }
  return cudaGetLastError();
}
