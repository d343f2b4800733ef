// Launcher of the Gaussian-splat tile rasterizer in splat_rasterizer.cu, called by
// splat_rasterizer.cpp (torch binding). Pointers are device pointers of contiguous tensors.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace streamstudio {

constexpr int kSplatTile = 16;                        // pixels per tile side
constexpr int kSplatBlock = kSplatTile * kSplatTile;  // threads per block, one per pixel
constexpr int kSplatChannels = 4;                     // r, g, b, depth

struct SplatArgs {
  const float* means2d;     // (N, 2) pixel centres
  const float* conics;      // (N, 3) a, b, c of the inverse 2D covariance
  const float* opacities;   // (N,)
  const float* feats;       // (N, 4) r, g, b, depth
  const int32_t* gauss_ids; // (P,) Gaussian ids sorted by (tile, depth)
  const int32_t* offsets;   // (tiles + 1,) each tile's range in gauss_ids
  const float* background;  // (3,) or nullptr
  int width;
  int height;
  float* out;               // (H, W, 4)
  float* trans_out;         // (H, W) final transmittance
};

// Blends every tile; returns the launch's error.
cudaError_t splat_rasterize_launch(const SplatArgs& args, cudaStream_t stream);

}  // namespace streamstudio
