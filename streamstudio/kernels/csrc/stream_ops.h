// Launchers of the fused ops in stream_ops.cu, called by stream_ops.cpp (torch binding).
// Pointers are device pointers of contiguous tensors; each returns the launch's error.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace streamstudio {

enum DTypeCode { kF32 = 0, kF16 = 1, kBF16 = 2 };
enum CfgCode { kCfgNone = 0, kCfgSelf = 1, kCfgInitialize = 2, kCfgFull = 3 };  // reference.CFG_*

struct StepArgs {
  const void* x;       // (B, C, h, w) x_t
  const void* text;    // eps_text
  const void* uncond;  // eps_uncond (read for full CFG only)
  const void* stock;   // residual-CFG stock noise (read for self / initialize only)
  const void* noise;   // noise_next
  const float* coef;   // (B, 6): alpha, beta, c_skip, c_out, alpha_next, beta_next
  void* x0;
  void* x_next;
  void* stock_next;    // written for self / initialize only
  int64_t numel;       // B * C * h * w
  int64_t row;         // C * h * w
  float guidance;
  float delta;
};

// uint8 (B, h, w, channels) -> (B, 3, oh, ow) of dtype in [-1, 1]; channels 3, or 4 (RGBA,
// composited on black). cudaErrorInvalidValue for any other channel count.
cudaError_t preprocess_launch(const uint8_t* in, void* out, int dtype, int batch, int h, int w, int channels,
                              int oh, int ow, bool bgr, cudaStream_t s);
// (B, 3, h, w) of dtype -> uint8 (B, h, w, 3).
cudaError_t postprocess_launch(const void* in, int dtype, uint8_t* out, int batch, int h, int w, cudaStream_t s);
cudaError_t stream_step_launch(const StepArgs& args, int dtype, int cfg, cudaStream_t s);
// partial: 3 * max_blocks floats of scratch; out: one float.
cudaError_t cosine_launch(const void* a, const void* b, int dtype, int64_t n, float* partial, int max_blocks,
                          float* out, cudaStream_t s);

}  // namespace streamstudio
