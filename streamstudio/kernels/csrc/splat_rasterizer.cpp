// torch binding of the splat rasterizer in splat_rasterizer.cu: checks the tensors, allocates
// the outputs and launches on the current CUDA stream.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "splat_rasterizer.h"

namespace {

using streamstudio::kSplatChannels;
using streamstudio::kSplatTile;

void check_cuda(const at::Tensor& t, const at::Tensor& ref, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == ref.device(), "splat rasterizer: ", name,
              " must be on the same CUDA device as means2d");
}

// means2d (N, 2), conics (N, 3), opacities (N,), feats (N, 4): float32; gauss_ids (P,) and
// offsets (tiles + 1,): int32; background (3,) float32 or empty.
// Returns (out (H, W, 4): r, g, b, weighted depth; trans (H, W): final transmittance).
std::vector<at::Tensor> rasterize_forward(const at::Tensor& means2d, const at::Tensor& conics,
                                          const at::Tensor& opacities, const at::Tensor& feats,
                                          const at::Tensor& gauss_ids, const at::Tensor& offsets,
                                          const at::Tensor& background, int64_t width, int64_t height) {
  TORCH_CHECK(means2d.is_cuda(), "splat rasterizer: tensors must be on a CUDA device");
  check_cuda(conics, means2d, "conics");
  check_cuda(opacities, means2d, "opacities");
  check_cuda(feats, means2d, "feats");
  check_cuda(gauss_ids, means2d, "gauss_ids");
  check_cuda(offsets, means2d, "offsets");
  const int64_t n = means2d.size(0);
  TORCH_CHECK(means2d.dim() == 2 && means2d.size(1) == 2, "splat rasterizer: means2d must be (N, 2)");
  TORCH_CHECK(conics.dim() == 2 && conics.size(0) == n && conics.size(1) == 3, "splat rasterizer: conics must be (N, 3)");
  TORCH_CHECK(opacities.numel() == n, "splat rasterizer: opacities must be (N,)");
  TORCH_CHECK(feats.dim() == 2 && feats.size(0) == n && feats.size(1) == kSplatChannels,
              "splat rasterizer: feats must be (N, 4)");
  TORCH_CHECK(gauss_ids.scalar_type() == at::kInt && offsets.scalar_type() == at::kInt,
              "splat rasterizer: ids and offsets must be int32");
  TORCH_CHECK(width > 0 && height > 0 && width * height < (int64_t(1) << 31), "splat rasterizer: bad image size");
  const int64_t tiles_x = (width + kSplatTile - 1) / kSplatTile;
  const int64_t tiles_y = (height + kSplatTile - 1) / kSplatTile;
  TORCH_CHECK(offsets.numel() == tiles_x * tiles_y + 1, "splat rasterizer: offsets must be (tiles + 1,)");

  const c10::cuda::CUDAGuard guard(means2d.device());
  const auto m = means2d.to(at::kFloat).contiguous();
  const auto c = conics.to(at::kFloat).contiguous();
  const auto o = opacities.to(at::kFloat).contiguous();
  const auto f = feats.to(at::kFloat).contiguous();
  const auto ids = gauss_ids.contiguous();
  const auto offs = offsets.contiguous();
  at::Tensor bg;
  if (background.defined() && background.numel() == 3) {
    check_cuda(background, means2d, "background");
    bg = background.to(at::kFloat).contiguous();
  }
  const auto f32 = means2d.options().dtype(at::kFloat);
  auto out = at::empty({height, width, kSplatChannels}, f32);  // every pixel is written
  auto trans = at::empty({height, width}, f32);

  streamstudio::SplatArgs a;
  a.means2d = m.data_ptr<float>();
  a.conics = c.data_ptr<float>();
  a.opacities = o.data_ptr<float>();
  a.feats = f.data_ptr<float>();
  a.gauss_ids = ids.data_ptr<int32_t>();
  a.offsets = offs.data_ptr<int32_t>();
  a.background = bg.defined() ? bg.data_ptr<float>() : nullptr;
  a.width = static_cast<int>(width);
  a.height = static_cast<int>(height);
  a.out = out.data_ptr<float>();
  a.trans_out = trans.data_ptr<float>();
  const cudaError_t err = streamstudio::splat_rasterize_launch(a, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "splat rasterizer: launch failed: ", cudaGetErrorString(err));
  return {out, trans};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "StreamStudio Gaussian-splat tile rasterizer (see streamstudio/kernels/splat_reference.py)";
  m.def("rasterize_forward", &rasterize_forward, "tile rasterizer (forward): (out (H,W,4), trans (H,W))");
}
