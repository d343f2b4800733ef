// Gaussian-splat tile rasteriser (forward), the CUDA twin of
// streamstudio/kernels/splat_reference.py::rasterize_projected.
//
// One thread block per 16x16 tile, one thread per pixel. The block walks its tile's
// Gaussians (already sorted by depth, ids in gauss_ids[offsets[t] .. offsets[t + 1])) in
// batches of 256 staged through shared memory, and blends front to back:
//   power = -0.5 (a dx^2 + c dy^2) - b dx dy,  alpha = min(0.99, o exp(power)),
//   skip when power > 0 or alpha < 1/255; stop before T would fall below 1e-4.
// Pixel (u, v) has its centre at (u + 0.5, v + 0.5). Outputs: 3 colour channels and the
// weighted depth (sum of w z), and the final transmittance T.
//
// Build with -DSPLAT_KERNEL_ONLY to compile the kernel alone (no torch headers), as the
// CPU test does with nvcc -cubin -Xptxas -v for sm_80 and sm_90.

#include <cstdint>
#include <cuda_runtime.h>

#define SPLAT_TILE 16
#define SPLAT_BLOCK (SPLAT_TILE * SPLAT_TILE)
#define SPLAT_CHANNELS 4  // r, g, b, depth

extern "C" __global__ void __launch_bounds__(SPLAT_BLOCK)
splat_rasterize_forward(const float* __restrict__ means2d,    // (N, 2)
                        const float* __restrict__ conics,     // (N, 3) a, b, c
                        const float* __restrict__ opacities,  // (N,)
                        const float* __restrict__ feats,      // (N, 4) r, g, b, depth
                        const int32_t* __restrict__ gauss_ids,  // (P,) sorted by (tile, depth)
                        const int32_t* __restrict__ offsets,    // (tiles + 1,)
                        const float* __restrict__ background,   // (3,) or nullptr
                        int width, int height, int tiles_x,
                        float* __restrict__ out,    // (H, W, 4)
                        float* __restrict__ trans_out) {  // (H, W)
  const int tile = blockIdx.x;
  const int tx = tile % tiles_x, ty = tile / tiles_x;
  const int u = tx * SPLAT_TILE + threadIdx.x % SPLAT_TILE;
  const int v = ty * SPLAT_TILE + threadIdx.x / SPLAT_TILE;
  const bool inside = u < width && v < height;
  const float px = u + 0.5f, py = v + 0.5f;

  __shared__ float2 s_mean[SPLAT_BLOCK];
  __shared__ float4 s_conic_o[SPLAT_BLOCK];
  __shared__ int32_t s_id[SPLAT_BLOCK];

  const int begin = offsets[tile], end = offsets[tile + 1];
  float T = 1.0f;
  float acc[SPLAT_CHANNELS] = {0.f, 0.f, 0.f, 0.f};
  bool done = !inside;

  for (int base = begin; base < end; base += SPLAT_BLOCK) {
    // stop the whole tile once every pixel has finished
    if (__syncthreads_count(done) == SPLAT_BLOCK) break;
    const int k = base + threadIdx.x;
    if (k < end) {
      const int32_t g = gauss_ids[k];
      s_id[threadIdx.x] = g;
      s_mean[threadIdx.x] = make_float2(means2d[2 * (int64_t)g], means2d[2 * (int64_t)g + 1]);
      const float* c = conics + 3 * (int64_t)g;
      s_conic_o[threadIdx.x] = make_float4(c[0], c[1], c[2], opacities[g]);
    }
    __syncthreads();
    const int count = min(SPLAT_BLOCK, end - base);
    for (int j = 0; j < count && !done; ++j) {
      const float2 m = s_mean[j];
      const float4 co = s_conic_o[j];
      const float dx = px - m.x, dy = py - m.y;
      const float power = -0.5f * (co.x * dx * dx + co.z * dy * dy) - co.y * dx * dy;
      if (power > 0.0f) continue;
      const float alpha = fminf(0.99f, co.w * expf(power));
      if (alpha < 1.0f / 255.0f) continue;
      const float test_t = T * (1.0f - alpha);
      if (test_t < 1e-4f) {
        done = true;
        break;
      }
      const float w = alpha * T;
      const float* f = feats + (int64_t)s_id[j] * SPLAT_CHANNELS;
#pragma unroll
      for (int ch = 0; ch < SPLAT_CHANNELS; ++ch) acc[ch] += w * f[ch];
      T = test_t;
    }
  }
  if (!inside) return;
  const int64_t pix = (int64_t)v * width + u;
#pragma unroll
  for (int ch = 0; ch < 3; ++ch)
    out[pix * SPLAT_CHANNELS + ch] = acc[ch] + (background ? T * background[ch] : 0.0f);
  out[pix * SPLAT_CHANNELS + 3] = acc[3];
  trans_out[pix] = T;
}

#ifndef SPLAT_KERNEL_ONLY
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

// Returns (out (H, W, 4), trans (H, W)). All tensors on one CUDA device; floats are float32,
// ids and offsets int32.
std::vector<torch::Tensor> rasterize_forward(torch::Tensor means2d, torch::Tensor conics, torch::Tensor opacities,
                                             torch::Tensor feats, torch::Tensor gauss_ids, torch::Tensor offsets,
                                             torch::Tensor background, int64_t width, int64_t height) {
  TORCH_CHECK(means2d.is_cuda(), "splat rasteriser: tensors must be on a CUDA device");
  TORCH_CHECK(feats.size(1) == SPLAT_CHANNELS, "splat rasteriser: feats must be (N, 4)");
  TORCH_CHECK(gauss_ids.scalar_type() == torch::kInt32 && offsets.scalar_type() == torch::kInt32,
              "splat rasteriser: ids and offsets must be int32");
  const c10::cuda::CUDAGuard guard(means2d.device());
  auto f32 = means2d.options().dtype(torch::kFloat32);
  auto m = means2d.to(torch::kFloat32).contiguous();
  auto c = conics.to(torch::kFloat32).contiguous();
  auto o = opacities.to(torch::kFloat32).contiguous();
  auto f = feats.to(torch::kFloat32).contiguous();
  auto ids = gauss_ids.contiguous();
  auto offs = offsets.contiguous();
  const int tiles_x = (int)((width + SPLAT_TILE - 1) / SPLAT_TILE);
  const int tiles_y = (int)((height + SPLAT_TILE - 1) / SPLAT_TILE);
  TORCH_CHECK(offs.numel() == (int64_t)tiles_x * tiles_y + 1, "splat rasteriser: offsets must be (tiles + 1,)");
  auto out = torch::zeros({height, width, SPLAT_CHANNELS}, f32);
  auto trans = torch::ones({height, width}, f32);
  const float* bg = nullptr;
  torch::Tensor bg_c;
  if (background.defined() && background.numel() == 3) {
    bg_c = background.to(torch::kFloat32).contiguous();
    bg = bg_c.data_ptr<float>();
  }
  const int n_tiles = tiles_x * tiles_y;
  if (n_tiles > 0) {
    splat_rasterize_forward<<<n_tiles, SPLAT_BLOCK, 0, c10::cuda::getCurrentCUDAStream()>>>(
        m.data_ptr<float>(), c.data_ptr<float>(),
        o.data_ptr<float>(), f.data_ptr<float>(), ids.data_ptr<int32_t>(), offs.data_ptr<int32_t>(), bg,
        (int)width, (int)height, tiles_x, out.data_ptr<float>(), trans.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {out, trans};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("rasterize_forward", &rasterize_forward, "Gaussian-splat tile rasteriser (forward)");
}
#endif
