// torch binding of the fused ops in stream_ops.cu. Every function writes into output tensors
// the caller allocated (streamstudio/kernels/__init__.py), after checking devices, dtypes,
// shapes and contiguity; the work runs on the current CUDA stream.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "stream_ops.h"

namespace {

using streamstudio::StepArgs;

int dtype_code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return streamstudio::kF32;
    case at::kHalf: return streamstudio::kF16;
    case at::kBFloat16: return streamstudio::kBF16;
    default: TORCH_CHECK(false, "stream_ops: float32, float16 or bfloat16 expected, got ", t.scalar_type());
  }
  return -1;
}

void check_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "stream_ops: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), "stream_ops: ", name, " must be contiguous");
}

void check_like(const at::Tensor& t, const at::Tensor& ref, const char* name) {
  check_cuda(t, name);
  TORCH_CHECK(t.sizes() == ref.sizes(), "stream_ops: ", name, " has shape ", t.sizes(), ", expected ", ref.sizes());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "stream_ops: ", name, " has dtype ", t.scalar_type(),
              ", expected ", ref.scalar_type());
  TORCH_CHECK(t.device() == ref.device(), "stream_ops: ", name, " is on another device");
}

void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, "stream_ops: ", op, " launch failed: ", cudaGetErrorString(err));
}

// frame: uint8 (B, H, W, 3) or (B, H, W, 4) (RGBA, composited on black); out: (B, 3, oh, ow)
// float32 / float16 / bfloat16.
void preprocess(const at::Tensor& frame, const at::Tensor& out, bool bgr) {
  check_cuda(frame, "frame");
  check_cuda(out, "out");
  TORCH_CHECK(frame.scalar_type() == at::kByte && frame.dim() == 4 && (frame.size(3) == 3 || frame.size(3) == 4),
              "stream_ops.preprocess: frame must be uint8 (B, H, W, 3) or (B, H, W, 4)");
  TORCH_CHECK(out.dim() == 4 && out.size(0) == frame.size(0) && out.size(1) == 3,
              "stream_ops.preprocess: out must be (B, 3, h, w)");
  TORCH_CHECK(out.device() == frame.device(), "stream_ops.preprocess: frame and out on different devices");
  if (out.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(frame.device());
  check_launch(streamstudio::preprocess_launch(frame.data_ptr<uint8_t>(), out.data_ptr(), dtype_code(out),
                                               frame.size(0), frame.size(1), frame.size(2), frame.size(3),
                                               out.size(2), out.size(3),
                                               bgr, c10::cuda::getCurrentCUDAStream().stream()),
               "preprocess");
}

// images: (B, 3, H, W); out: uint8 (B, H, W, 3).
void postprocess(const at::Tensor& images, const at::Tensor& out) {
  check_cuda(images, "images");
  check_cuda(out, "out");
  TORCH_CHECK(images.dim() == 4 && images.size(1) == 3, "stream_ops.postprocess: images must be (B, 3, H, W)");
  TORCH_CHECK(out.scalar_type() == at::kByte && out.dim() == 4 && out.size(0) == images.size(0) &&
                  out.size(1) == images.size(2) && out.size(2) == images.size(3) && out.size(3) == 3,
              "stream_ops.postprocess: out must be uint8 (B, H, W, 3)");
  TORCH_CHECK(out.device() == images.device(), "stream_ops.postprocess: images and out on different devices");
  if (images.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(images.device());
  check_launch(streamstudio::postprocess_launch(images.data_ptr(), dtype_code(images), out.data_ptr<uint8_t>(),
                                                images.size(0), images.size(2), images.size(3),
                                                c10::cuda::getCurrentCUDAStream().stream()),
               "postprocess");
}

// All tensors (B, ...) of x's dtype; coef float32 (B, 6). eps_uncond is read for cfg 3 only,
// stock read and stock_next written for cfg 1 and 2 only (pass any tensor like x otherwise).
void stream_step(const at::Tensor& x, const at::Tensor& eps_text, const at::Tensor& eps_uncond,
                 const at::Tensor& stock, const at::Tensor& noise_next, const at::Tensor& coef, const at::Tensor& x0,
                 const at::Tensor& x_next, const at::Tensor& stock_next, double guidance, double delta, int64_t cfg) {
  check_cuda(x, "x_t");
  TORCH_CHECK(x.dim() >= 1, "stream_ops.stream_step: x_t needs a batch dimension");
  TORCH_CHECK(cfg >= 0 && cfg <= 3, "stream_ops.stream_step: cfg must be 0..3");
  check_like(eps_text, x, "eps_text");
  check_like(eps_uncond, x, "eps_uncond");
  check_like(stock, x, "stock");
  check_like(noise_next, x, "noise_next");
  check_like(x0, x, "x0");
  check_like(x_next, x, "x_next");
  check_like(stock_next, x, "stock_next");
  check_cuda(coef, "coef");
  TORCH_CHECK(coef.scalar_type() == at::kFloat && coef.dim() == 2 && coef.size(0) == x.size(0) && coef.size(1) == 6,
              "stream_ops.stream_step: coef must be float32 (B, 6)");
  TORCH_CHECK(coef.device() == x.device(), "stream_ops.stream_step: coef on another device");
  if (x.numel() == 0) return;
  StepArgs a;
  a.x = x.data_ptr();
  a.text = eps_text.data_ptr();
  a.uncond = eps_uncond.data_ptr();
  a.stock = stock.data_ptr();
  a.noise = noise_next.data_ptr();
  a.coef = coef.data_ptr<float>();
  a.x0 = x0.data_ptr();
  a.x_next = x_next.data_ptr();
  a.stock_next = stock_next.data_ptr();
  a.numel = x.numel();
  a.row = x.numel() / x.size(0);
  a.guidance = static_cast<float>(guidance);
  a.delta = static_cast<float>(delta);
  const c10::cuda::CUDAGuard guard(x.device());
  check_launch(streamstudio::stream_step_launch(a, dtype_code(x), static_cast<int>(cfg),
                                                c10::cuda::getCurrentCUDAStream().stream()),
               "stream_step");
}

// a, b: same dtype and element count; partial: float32 scratch of 3 * max_blocks; out: float32 (1,).
void cosine_similarity(const at::Tensor& a, const at::Tensor& b, const at::Tensor& partial, const at::Tensor& out) {
  check_cuda(a, "a");
  check_cuda(b, "b");
  check_cuda(partial, "partial");
  check_cuda(out, "out");
  TORCH_CHECK(a.numel() == b.numel() && a.scalar_type() == b.scalar_type(),
              "stream_ops.cosine_similarity: a and b must have the same size and dtype");
  TORCH_CHECK(a.device() == b.device() && partial.device() == a.device() && out.device() == a.device(),
              "stream_ops.cosine_similarity: tensors on different devices");
  TORCH_CHECK(partial.scalar_type() == at::kFloat && partial.numel() >= 3 && partial.numel() % 3 == 0,
              "stream_ops.cosine_similarity: partial must be float32 of 3 * blocks");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.numel() == 1, "stream_ops.cosine_similarity: out must be one float32");
  const c10::cuda::CUDAGuard guard(a.device());
  check_launch(streamstudio::cosine_launch(a.data_ptr(), b.data_ptr(), dtype_code(a), a.numel(),
                                           partial.data_ptr<float>(), static_cast<int>(partial.numel() / 3),
                                           out.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream()),
               "cosine_similarity");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "StreamStudio fused ops (see streamstudio/kernels/reference.py)";
  m.def("preprocess", &preprocess, "uint8 (B,H,W,3|4) -> (B,3,h,w) in [-1,1], into out");
  m.def("postprocess", &postprocess, "(B,3,H,W) in [-1,1] -> uint8 (B,H,W,3), into out");
  m.def("stream_step", &stream_step, "the Stream Batch step, into x0, x_next, stock_next");
  m.def("cosine_similarity", &cosine_similarity, "cosine similarity into out (float32, 1)");
}
