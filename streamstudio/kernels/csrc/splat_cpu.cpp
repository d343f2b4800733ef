// CPU Gaussian-splat renderer: the whole frame (covariance, SH, EWA projection, depth sort,
// 16x16 tile binning, front-to-back blending) in one call, float32 or float64, OpenMP over
// Gaussians and tiles when built with -fopenmp. Same maths, same operation order as
// streamstudio/kernels/splat_reference.py (see its docstring for the conventions).
// No CUDA header: it builds against a CPU-only torch wheel.
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

constexpr int TS = 16;  // tile side (the result does not depend on it: binning is exact)

template <typename T>
struct Gauss {  // one visible Gaussian, in depth order
  T mx, my, a, b, c, o, reach, rx, ry;
  T f[4];  // r, g, b, depth
};

template <typename T>
inline uint64_t sort_key(T v);
template <>
inline uint64_t sort_key<float>(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return u;
}
template <>
inline uint64_t sort_key<double>(double v) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  return (u & 0x8000000000000000ull) ? ~u : (u | 0x8000000000000000ull);
}

// stable LSD radix sort of ids by key (11-bit digits); ties keep the ids' order
void radix_sort(std::vector<uint64_t>& keys, std::vector<int32_t>& ids, int bits) {
  const size_t n = ids.size();
  std::vector<uint64_t> k2(n);
  std::vector<int32_t> i2(n);
  for (int shift = 0; shift < bits; shift += 11) {
    size_t hist[2048] = {0};
    for (size_t i = 0; i < n; ++i) hist[(keys[i] >> shift) & 2047]++;
    bool trivial = false;
    for (int d = 0; d < 2048; ++d) trivial |= hist[d] == n;
    if (trivial) continue;
    size_t sum = 0;
    for (int d = 0; d < 2048; ++d) { size_t h = hist[d]; hist[d] = sum; sum += h; }
    for (size_t i = 0; i < n; ++i) {
      size_t pos = hist[(keys[i] >> shift) & 2047]++;
      k2[pos] = keys[i];
      i2[pos] = ids[i];
    }
    keys.swap(k2);
    ids.swap(i2);
  }
}

template <typename T>
void render_impl(const at::Tensor& means_t, const at::Tensor& quats_t, const at::Tensor& scales_t,
                 const at::Tensor& covars_t, const at::Tensor& opac_t, const at::Tensor& colors_t,
                 int64_t sh_degree, const at::Tensor& view_t, double fx, double fy, double cx, double cy,
                 int64_t W, int64_t H, double near_, double far_, const at::Tensor& bg_t, int nthreads,
                 at::Tensor& rgb_t, at::Tensor& depth_t, at::Tensor& alpha_t, int64_t& n_visible) {
  const int64_t N = means_t.size(0);
  const T* means = means_t.data_ptr<T>();
  const T* opac = opac_t.data_ptr<T>();
  const T* colors = colors_t.data_ptr<T>();
  const bool use_covars = covars_t.numel() > 0;
  const T* quats = use_covars ? nullptr : quats_t.data_ptr<T>();
  const T* scales = use_covars ? nullptr : scales_t.data_ptr<T>();
  const T* covars = use_covars ? covars_t.data_ptr<T>() : nullptr;
  const int64_t K = colors_t.dim() == 3 ? colors_t.size(1) : 0;  // 0: plain RGB colours
  const T* V = view_t.data_ptr<T>();
  T R[3][3], tr[3];
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) R[i][j] = V[i * 4 + j];
    tr[i] = V[i * 4 + 3];
  }
  T campos[3];  // -R^T t
  for (int j = 0; j < 3; ++j) campos[j] = (-R[0][j]) * tr[0] + (-R[1][j]) * tr[1] + (-R[2][j]) * tr[2];
  const T lim_x = (T)(1.3 * 0.5 * W / fx), lim_y = (T)(1.3 * 0.5 * H / fy);
  const T Tfx = (T)fx, Tfy = (T)fy, Tcx = (T)cx, Tcy = (T)cy, Tnear = (T)near_, Tfar = (T)far_;
  const T fW = (T)W, fH = (T)H;

  std::vector<Gauss<T>> proj(N);
  std::vector<uint8_t> keep(N);
  std::vector<T> depth(N);

#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t n = 0; n < N; ++n) {
    Gauss<T>& g = proj[n];
    const T* m = means + 3 * n;
    // camera coordinates p = R m + t
    T p[3];
    for (int i = 0; i < 3; ++i) p[i] = m[0] * R[i][0] + m[1] * R[i][1] + m[2] * R[i][2] + tr[i];
    const T x = p[0], y = p[1], z = p[2];
    depth[n] = z;
    const bool in_depth = (z > Tnear) && (z < Tfar);
    const T zs = in_depth ? z : (T)1;
    // 3D covariance
    T S[3][3];
    if (use_covars) {
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) S[i][j] = covars[9 * n + 3 * i + j];
    } else {
      const T* q = quats + 4 * n;
      T nrm = std::sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]);
      nrm = std::max(nrm, (T)1e-12);
      const T w = q[0] / nrm, qx = q[1] / nrm, qy = q[2] / nrm, qz = q[3] / nrm;
      const T rot[3][3] = {{1 - 2 * (qy * qy + qz * qz), 2 * (qx * qy - w * qz), 2 * (qx * qz + w * qy)},
                           {2 * (qx * qy + w * qz), 1 - 2 * (qx * qx + qz * qz), 2 * (qy * qz - w * qx)},
                           {2 * (qx * qz - w * qy), 2 * (qy * qz + w * qx), 1 - 2 * (qx * qx + qy * qy)}};
      const T* s = scales + 3 * n;
      T M[3][3];
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) M[i][j] = rot[i][j] * s[j];
      for (int i = 0; i < 3; ++i)
        for (int k = 0; k < 3; ++k) S[i][k] = M[i][0] * M[k][0] + M[i][1] * M[k][1] + M[i][2] * M[k][2];
    }
    // Jacobian of the perspective map (x/z, y/z clamped), J R, then (J R) S (J R)^T
    const T txc = std::min(std::max(x / zs, -lim_x), lim_x) * zs;
    const T tyc = std::min(std::max(y / zs, -lim_y), lim_y) * zs;
    const T rz = (T)1 / zs;
    const T J[2][3] = {{rz * Tfx, 0, txc * (-Tfx) / (zs * zs)}, {0, rz * Tfy, tyc * (-Tfy) / (zs * zs)}};
    T JR[2][3], JS[2][3];
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) JR[r][c] = J[r][0] * R[0][c] + J[r][1] * R[1][c] + J[r][2] * R[2][c];
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) JS[r][c] = JR[r][0] * S[0][c] + JR[r][1] * S[1][c] + JR[r][2] * S[2][c];
    const T c_xx = JS[0][0] * JR[0][0] + JS[0][1] * JR[0][1] + JS[0][2] * JR[0][2] + (T)0.3;
    const T c_xy = JS[0][0] * JR[1][0] + JS[0][1] * JR[1][1] + JS[0][2] * JR[1][2];
    const T c_yy = JS[1][0] * JR[1][0] + JS[1][1] * JR[1][1] + JS[1][2] * JR[1][2] + (T)0.3;
    const T det = c_xx * c_yy - c_xy * c_xy;
    const bool ok = in_depth && det > 0;
    const T dets = ok ? det : (T)1;
    g.a = c_yy / dets;
    g.b = -c_xy / dets;
    g.c = c_xx / dets;
    g.o = opac[n];
    g.reach = (T)2 * std::log(std::max((T)255 * g.o, (T)1));
    g.rx = std::sqrt(g.reach * std::max(c_xx, (T)0));
    g.ry = std::sqrt(g.reach * std::max(c_yy, (T)0));
    g.mx = Tfx * x / zs + Tcx;
    g.my = Tfy * y / zs + Tcy;
    const bool on_screen = (g.mx + g.rx > 0) && (g.my + g.ry > 0) && (g.mx - g.rx < fW) && (g.my - g.ry < fH);
    keep[n] = ok && on_screen && g.reach > 0 && g.rx > 0;
    if (!keep[n]) continue;
    // colour: SH in the direction camera -> mean, + 0.5, clamped at 0
    if (K == 0) {
      for (int ch = 0; ch < 3; ++ch) g.f[ch] = colors[3 * n + ch];
    } else {
      const T* sh = colors + n * K * 3;
      T d[3] = {m[0] - campos[0], m[1] - campos[1], m[2] - campos[2]};
      T dn = std::max(std::sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]), (T)1e-12);
      const T X = d[0] / dn, Y = d[1] / dn, Z = d[2] / dn;
      const T C1 = (T)0.4886025119029199;
      const T xx = X * X, yy = Y * Y, zz = Z * Z, xy = X * Y, yz = Y * Z, xz = X * Z;
      for (int ch = 0; ch < 3; ++ch) {
        auto s = [&](int k) { return sh[3 * k + ch]; };
        T out = (T)0.28209479177387814 * s(0);
        if (sh_degree >= 1) {
          out = out - C1 * Y * s(1) + C1 * Z * s(2) - C1 * X * s(3);
          if (sh_degree >= 2) {
            out = out + (T)1.0925484305920792 * xy * s(4) + (T)-1.0925484305920792 * yz * s(5) +
                  (T)0.31539156525252005 * (2 * zz - xx - yy) * s(6) + (T)-1.0925484305920792 * xz * s(7) +
                  (T)0.5462742152960396 * (xx - yy) * s(8);
            if (sh_degree >= 3) {
              out = out + (T)-0.5900435899266435 * Y * (3 * xx - yy) * s(9) +
                    (T)2.890611442640554 * xy * Z * s(10) + (T)-0.4570457994644658 * Y * (4 * zz - xx - yy) * s(11) +
                    (T)0.3731763325901154 * Z * (2 * zz - 3 * xx - 3 * yy) * s(12) +
                    (T)-0.4570457994644658 * X * (4 * zz - xx - yy) * s(13) +
                    (T)1.445305721320277 * Z * (xx - yy) * s(14) + (T)-0.5900435899266435 * X * (xx - 3 * yy) * s(15);
            }
          }
        }
        g.f[ch] = std::max(out + (T)0.5, (T)0);
      }
    }
    g.f[3] = z;
  }

  // stable depth order of the visible Gaussians
  std::vector<int32_t> ids;
  std::vector<uint64_t> keys;
  ids.reserve(N);
  keys.reserve(N);
  for (int64_t n = 0; n < N; ++n)
    if (keep[n]) {
      ids.push_back((int32_t)n);
      keys.push_back(sort_key<T>(depth[n]));
    }
  n_visible = (int64_t)ids.size();
  radix_sort(keys, ids, sizeof(T) * 8);
  const int64_t M = (int64_t)ids.size();
  std::vector<Gauss<T>> gs(M);
  for (int64_t i = 0; i < M; ++i) gs[i] = proj[ids[i]];

  // binning: tiles touched by each box, counting sort keeps depth order inside a tile
  const int tx_n = (int)((W + TS - 1) / TS), ty_n = (int)((H + TS - 1) / TS);
  const int n_tiles = tx_n * ty_n;
  std::vector<int32_t> rect(4 * M);
  std::vector<int64_t> offs(n_tiles + 1, 0);
  auto clampi = [](T v, int hi) { return (int)std::min<T>(std::max<T>(std::floor(v), (T)0), (T)hi); };
  for (int64_t i = 0; i < M; ++i) {
    const Gauss<T>& g = gs[i];
    int x0 = clampi((g.mx - g.rx - (T)0.5) / TS, tx_n - 1), x1 = clampi((g.mx + g.rx - (T)0.5) / TS, tx_n - 1);
    int y0 = clampi((g.my - g.ry - (T)0.5) / TS, ty_n - 1), y1 = clampi((g.my + g.ry - (T)0.5) / TS, ty_n - 1);
    rect[4 * i] = x0; rect[4 * i + 1] = x1; rect[4 * i + 2] = y0; rect[4 * i + 3] = y1;
    for (int ty = y0; ty <= y1; ++ty)
      for (int tx = x0; tx <= x1; ++tx) offs[ty * tx_n + tx + 1]++;
  }
  for (int t = 0; t < n_tiles; ++t) offs[t + 1] += offs[t];
  std::vector<int32_t> lists(offs[n_tiles]);
  {
    std::vector<int64_t> fill(offs.begin(), offs.end() - 1);
    for (int64_t i = 0; i < M; ++i)
      for (int ty = rect[4 * i + 2]; ty <= rect[4 * i + 3]; ++ty)
        for (int tx = rect[4 * i]; tx <= rect[4 * i + 1]; ++tx) lists[fill[ty * tx_n + tx]++] = (int32_t)i;
  }

  // blending, one tile per task
  T* rgb = rgb_t.data_ptr<T>();
  T* dep = depth_t.data_ptr<T>();
  T* alp = alpha_t.data_ptr<T>();
  const bool has_bg = bg_t.numel() == 3;
  T bg[3] = {0, 0, 0};
  if (has_bg)
    for (int ch = 0; ch < 3; ++ch) bg[ch] = bg_t.data_ptr<T>()[ch];
  const T a_min = (T)(1.0 / 255.0), a_max = (T)0.99, t_min = (T)1e-4;

#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int tyi = tile / tx_n, txi = tile % tx_n;
    const int px0 = txi * TS, py0 = tyi * TS;
    const int pw = (int)std::min<int64_t>(TS, W - px0), ph = (int)std::min<int64_t>(TS, H - py0);
    T Tr[TS * TS], acc[4][TS * TS];
    uint8_t done[TS * TS];
    for (int k = 0; k < TS * TS; ++k) {
      Tr[k] = 1;
      done[k] = 0;
      acc[0][k] = acc[1][k] = acc[2][k] = acc[3][k] = 0;
    }
    int n_done = 0;
    const int n_pix = pw * ph;
    for (int64_t li = offs[tile]; li < offs[tile + 1] && n_done < n_pix; ++li) {
      const Gauss<T>& g = gs[lists[li]];
      // rows the box reaches in this tile (a hair of margin; the alpha test below is exact)
      const T mr = g.ry * (T)1.001 + (T)0.01;
      const int v0 = std::max(py0, (int)std::ceil(g.my - mr - (T)0.5));
      const int v1 = std::min(py0 + ph - 1, (int)std::floor(g.my + mr - (T)0.5));
      const T reach_m = g.reach * (T)1.001 + (T)1e-3;
      for (int v = v0; v <= v1; ++v) {
        const T dy = (T)v + (T)0.5 - g.my;
        // span of the row inside the ellipse a dx^2 + 2 b dx dy + c dy^2 <= reach
        const T disc = g.b * dy * g.b * dy - g.a * (g.c * dy * dy - reach_m);
        if (disc < 0) continue;
        const T sq = std::sqrt(disc), cen = g.mx - g.b * dy / g.a;
        const T lo = cen - sq / g.a - (T)0.01, hi = cen + sq / g.a + (T)0.01;
        const int u0 = std::max(px0, (int)std::ceil(lo - (T)0.5));
        const int u1 = std::min(px0 + pw - 1, (int)std::floor(hi - (T)0.5));
        const int row = (v - py0) * TS - px0;
        for (int u = u0; u <= u1; ++u) {
          const int k = row + u;
          if (done[k]) continue;
          const T dx = (T)u + (T)0.5 - g.mx;
          const T power = (T)-0.5 * (g.a * dx * dx + g.c * dy * dy) - g.b * dx * dy;
          if (power > 0) continue;
          const T alpha = std::min(g.o * std::exp(power), a_max);
          if (alpha < a_min) continue;
          const T test_t = Tr[k] * ((T)1 - alpha);
          if (test_t < t_min) {
            done[k] = 1;
            ++n_done;
            continue;
          }
          const T w = alpha * Tr[k];
          acc[0][k] += w * g.f[0];
          acc[1][k] += w * g.f[1];
          acc[2][k] += w * g.f[2];
          acc[3][k] += w * g.f[3];
          Tr[k] = test_t;
        }
      }
    }
    for (int v = 0; v < ph; ++v)
      for (int u = 0; u < pw; ++u) {
        const int k = v * TS + u;
        const int64_t o = (int64_t)(py0 + v) * W + px0 + u;
        for (int ch = 0; ch < 3; ++ch) rgb[3 * o + ch] = has_bg ? acc[ch][k] + Tr[k] * bg[ch] : acc[ch][k];
        dep[o] = acc[3][k];
        alp[o] = (T)1 - Tr[k];
      }
  }
}

}  // namespace

// Returns [rgb (H, W, 3), depth (H, W), alpha (H, W), n_visible (int64 scalar)].
std::vector<at::Tensor> render(at::Tensor means, at::Tensor quats, at::Tensor scales, at::Tensor covars,
                               at::Tensor opacities, at::Tensor colors, int64_t sh_degree, at::Tensor viewmat,
                               double fx, double fy, double cx, double cy, int64_t width, int64_t height,
                               double near_, double far_, at::Tensor background, int64_t threads) {
  TORCH_CHECK(means.device().is_cpu(), "splat_cpu: CPU tensors only");
  TORCH_CHECK(means.numel() / 3 < (int64_t)1 << 31, "splat_cpu: too many Gaussians for 32-bit ids");
  auto opts = means.options();
  auto rgb = at::empty({height, width, 3}, opts);
  auto depth = at::empty({height, width}, opts);
  auto alpha = at::empty({height, width}, opts);
  int64_t n_visible = 0;
  int nt = (int)std::max<int64_t>(1, threads);
  if (means.scalar_type() == at::kDouble) {
    render_impl<double>(means, quats, scales, covars, opacities, colors, sh_degree, viewmat, fx, fy, cx, cy, width,
                        height, near_, far_, background, nt, rgb, depth, alpha, n_visible);
  } else {
    TORCH_CHECK(means.scalar_type() == at::kFloat, "splat_cpu: float32 or float64 tensors");
    render_impl<float>(means, quats, scales, covars, opacities, colors, sh_degree, viewmat, fx, fy, cx, cy, width,
                       height, near_, far_, background, nt, rgb, depth, alpha, n_visible);
  }
  return {rgb, depth, alpha, at::scalar_tensor(n_visible, at::kLong)};
}

bool has_openmp() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("render", &render, "Render Gaussians on the CPU (see splat_cpu.py)");
  m.def("has_openmp", &has_openmp, "Whether this build runs its loops with OpenMP");
}
