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
// Plain CUDA (no torch headers), so that the CPU test can compile it with nvcc alone; the
// launcher at the end is called by splat_rasterizer.cpp, which checks the tensors.

#include <cstdint>
#include "splat_rasterizer.h"

namespace streamstudio {

__global__ void __launch_bounds__(kSplatBlock)
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
  const int u = tx * kSplatTile + threadIdx.x % kSplatTile;
  const int v = ty * kSplatTile + threadIdx.x / kSplatTile;
  const bool inside = u < width && v < height;
  const float px = u + 0.5f, py = v + 0.5f;

  __shared__ float2 s_mean[kSplatBlock];
  __shared__ float4 s_conic_o[kSplatBlock];
  __shared__ int32_t s_id[kSplatBlock];

  const int begin = offsets[tile], end = offsets[tile + 1];
  float T = 1.0f;
  float acc[kSplatChannels] = {0.f, 0.f, 0.f, 0.f};
  bool done = !inside;

  for (int base = begin; base < end; base += kSplatBlock) {
    // stop the whole tile once every pixel has finished
    if (__syncthreads_count(done) == kSplatBlock) break;
    const int k = base + threadIdx.x;
    if (k < end) {
      const int32_t g = gauss_ids[k];
      s_id[threadIdx.x] = g;
      s_mean[threadIdx.x] = make_float2(means2d[2 * (int64_t)g], means2d[2 * (int64_t)g + 1]);
      const float* c = conics + 3 * (int64_t)g;
      s_conic_o[threadIdx.x] = make_float4(c[0], c[1], c[2], opacities[g]);
    }
    __syncthreads();
    const int count = min(kSplatBlock, end - base);
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
      const float* f = feats + (int64_t)s_id[j] * kSplatChannels;
#pragma unroll
      for (int ch = 0; ch < kSplatChannels; ++ch) acc[ch] += w * f[ch];
      T = test_t;
    }
  }
  if (!inside) return;
  const int64_t pix = (int64_t)v * width + u;
#pragma unroll
  for (int ch = 0; ch < 3; ++ch)
    out[pix * kSplatChannels + ch] = acc[ch] + (background ? T * background[ch] : 0.0f);
  out[pix * kSplatChannels + 3] = acc[3];
  trans_out[pix] = T;
}

}  // namespace streamstudio

// A qualified definition: it must match the header's declaration exactly, or nvcc fails.
cudaError_t streamstudio::splat_rasterize_launch(const SplatArgs& a, cudaStream_t stream) {
  const int tiles_x = (a.width + kSplatTile - 1) / kSplatTile;
  const int tiles_y = (a.height + kSplatTile - 1) / kSplatTile;
  const int n_tiles = tiles_x * tiles_y;
  if (n_tiles > 0) {
    splat_rasterize_forward<<<n_tiles, kSplatBlock, 0, stream>>>(
        a.means2d, a.conics, a.opacities, a.feats, a.gauss_ids, a.offsets, a.background, a.width, a.height, tiles_x,
        a.out, a.trans_out);
  }
  return cudaGetLastError();
}
