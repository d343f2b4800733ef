// CPU Gaussian-splat renderer: the whole frame (covariance, SH, EWA projection, depth sort,
// tile binning (32x32 here; the reference's 16x16 give the same result, binning is exact),
// front-to-back blending) in one call, float32 or float64, OpenMP over Gaussians and tiles
// when built with -fopenmp. Same maths, same operation order as
// streamstudio/kernels/splat_reference.py (see its docstring for the conventions).
// No CUDA header: it builds against a CPU-only torch wheel. Light headers only (not
// torch/extension.h), so the first build stays short.
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <ctime>
#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <cmath>
#include <type_traits>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SPLAT_AVX2 1  // an 8-wide copy of the row loop, picked at run time on CPUs with AVX2
#endif
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

constexpr int TS = 32;  // tile side (the result does not depend on it: binning is exact; 32 beat 16 by ~7 %)

template <typename T>
struct Gauss {  // one visible Gaussian, in depth order
  T mx, my, a, b, c, o, reach, rx, ry;
  T f[4];  // r, g, b, depth
};

// exp for x <= 0 (power): float, a branch-free Cephes-style polynomial (about 1 ulp, like
// torch's vectorised exp) that the compiler vectorises; double, std::exp.
inline float exp_neg(float x) {
  x = x > -87.0f ? x : -87.0f;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return y * scale;
}
inline double exp_neg(double x) { return std::exp(x); }

#if defined(__SSE2__)
// exp_neg on 4 lanes: the same operations as the scalar float version
inline __m128 exp_neg4(__m128 x) {
  const __m128 magic = _mm_set1_ps(12582912.0f);
  x = _mm_max_ps(x, _mm_set1_ps(-87.0f));
  const __m128 n = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(x, _mm_set1_ps(1.44269504088896341f)), magic), magic);
  const __m128 r = _mm_sub_ps(_mm_sub_ps(x, _mm_mul_ps(n, _mm_set1_ps(0.693359375f))),
                              _mm_mul_ps(n, _mm_set1_ps(-2.12194440e-4f)));
  __m128 p = _mm_set1_ps(1.9875691500e-4f);
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.3981999507e-3f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(8.3334519073e-3f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(4.1665795894e-2f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.6666665459e-1f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(5.0000001201e-1f));
  const __m128 y = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_mul_ps(p, r), r), r), _mm_set1_ps(1.0f));
  const __m128i bits = _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(n), _mm_set1_epi32(127)), 23);
  return _mm_mul_ps(y, _mm_castsi128_ps(bits));
}

// The span lo..hi of one tile row for one Gaussian, 4 pixels at a time. Lanes past hi (up to 3,
// into the next row or the padding) are masked out and written back unchanged.; the scalar loop's maths.
inline int blend_row_sse(float* tr, float* l, float* c0, float* c1, float* c2, float* c3, int px0, int lo, int hi,
                         float mx, float ga, float gb, float cdy, float dy, float o, const float* f) {
  const __m128 vmx = _mm_set1_ps(mx), vga = _mm_set1_ps(ga), vgb = _mm_set1_ps(gb), vcdy = _mm_set1_ps(cdy);
  const __m128 vdy = _mm_set1_ps(dy), vo = _mm_set1_ps(o), zero = _mm_setzero_ps(), one = _mm_set1_ps(1.0f);
  const __m128 vlo = _mm_set1_ps((float)lo), vhi = _mm_set1_ps((float)hi);
  int stops = 0;
  for (int j = lo; j <= hi; j += 4) {  // groups of 4 from the span's start (may run past the row: padding)
    const __m128 idx = _mm_add_ps(_mm_set1_ps((float)j), _mm_set_ps(3.0f, 2.0f, 1.0f, 0.0f));
    const __m128 px = _mm_add_ps(_mm_set1_ps((float)(px0 + j)), _mm_set_ps(3.0f, 2.0f, 1.0f, 0.0f));
    const __m128 dx = _mm_sub_ps(_mm_add_ps(px, _mm_set1_ps(0.5f)), vmx);
    const __m128 power = _mm_sub_ps(_mm_mul_ps(_mm_set1_ps(-0.5f), _mm_add_ps(_mm_mul_ps(_mm_mul_ps(vga, dx), dx), vcdy)),
                                    _mm_mul_ps(_mm_mul_ps(vgb, dx), vdy));
    const __m128 alpha = _mm_min_ps(_mm_mul_ps(vo, exp_neg4(power)), _mm_set1_ps(0.99f));
    const __m128 lv = _mm_loadu_ps(l + j);
    __m128 m = _mm_and_ps(_mm_cmpge_ps(alpha, _mm_set1_ps((float)(1.0 / 255.0))), _mm_cmple_ps(power, zero));
    m = _mm_and_ps(m, _mm_cmpneq_ps(lv, zero));
    m = _mm_and_ps(m, _mm_and_ps(_mm_cmpge_ps(idx, vlo), _mm_cmple_ps(idx, vhi)));
    if (_mm_movemask_ps(m) == 0) continue;
    const __m128 al = _mm_and_ps(m, alpha);
    const __m128 t_old = _mm_loadu_ps(tr + j);
    const __m128 test_t = _mm_mul_ps(t_old, _mm_sub_ps(one, al));
    const __m128 low = _mm_cmplt_ps(test_t, _mm_set1_ps(1e-4f));
    const __m128 stop = _mm_and_ps(low, m);
    stops += __builtin_popcount(_mm_movemask_ps(stop));
    _mm_storeu_ps(l + j, _mm_andnot_ps(stop, lv));
    const __m128 w = _mm_andnot_ps(low, _mm_mul_ps(al, t_old));
    _mm_storeu_ps(c0 + j, _mm_add_ps(_mm_loadu_ps(c0 + j), _mm_mul_ps(w, _mm_set1_ps(f[0]))));
    _mm_storeu_ps(c1 + j, _mm_add_ps(_mm_loadu_ps(c1 + j), _mm_mul_ps(w, _mm_set1_ps(f[1]))));
    _mm_storeu_ps(c2 + j, _mm_add_ps(_mm_loadu_ps(c2 + j), _mm_mul_ps(w, _mm_set1_ps(f[2]))));
    _mm_storeu_ps(c3 + j, _mm_add_ps(_mm_loadu_ps(c3 + j), _mm_mul_ps(w, _mm_set1_ps(f[3]))));
    _mm_storeu_ps(tr + j, _mm_or_ps(_mm_and_ps(low, t_old), _mm_andnot_ps(low, test_t)));
  }
  return stops;
}
#endif

#if defined(SPLAT_AVX2)
__attribute__((target("avx2"))) inline __m256 exp_neg8(__m256 x) {
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), magic), magic);
  const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f))),
                                 _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

// blend_row_sse, 8 lanes (same operations per lane, so the same bits)
__attribute__((target("avx2"))) inline int blend_row_avx2(float* tr, float* l, float* c0, float* c1, float* c2, float* c3,
                                                   int px0, int lo, int hi, float mx, float ga, float gb, float cdy,
                                                   float dy, float o, const float* f) {
  const __m256 vmx = _mm256_set1_ps(mx), vga = _mm256_set1_ps(ga), vgb = _mm256_set1_ps(gb);
  const __m256 vcdy = _mm256_set1_ps(cdy), vdy = _mm256_set1_ps(dy), vo = _mm256_set1_ps(o);
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
  const __m256 vlo = _mm256_set1_ps((float)lo), vhi = _mm256_set1_ps((float)hi);
  const __m256 lanes = _mm256_set_ps(7.0f, 6.0f, 5.0f, 4.0f, 3.0f, 2.0f, 1.0f, 0.0f);
  int stops = 0;
  for (int j = lo; j <= hi; j += 8) {
    const __m256 idx = _mm256_add_ps(_mm256_set1_ps((float)j), lanes);
    const __m256 px = _mm256_add_ps(_mm256_set1_ps((float)(px0 + j)), lanes);
    const __m256 dx = _mm256_sub_ps(_mm256_add_ps(px, _mm256_set1_ps(0.5f)), vmx);
    const __m256 power = _mm256_sub_ps(
        _mm256_mul_ps(_mm256_set1_ps(-0.5f), _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(vga, dx), dx), vcdy)),
        _mm256_mul_ps(_mm256_mul_ps(vgb, dx), vdy));
    const __m256 alpha = _mm256_min_ps(_mm256_mul_ps(vo, exp_neg8(power)), _mm256_set1_ps(0.99f));
    const __m256 lv = _mm256_loadu_ps(l + j);
    __m256 m = _mm256_and_ps(_mm256_cmp_ps(alpha, _mm256_set1_ps((float)(1.0 / 255.0)), _CMP_GE_OS),
                             _mm256_cmp_ps(power, zero, _CMP_LE_OS));
    m = _mm256_and_ps(m, _mm256_cmp_ps(lv, zero, _CMP_NEQ_UQ));
    m = _mm256_and_ps(m, _mm256_and_ps(_mm256_cmp_ps(idx, vlo, _CMP_GE_OS), _mm256_cmp_ps(idx, vhi, _CMP_LE_OS)));
    if (_mm256_movemask_ps(m) == 0) continue;
    const __m256 al = _mm256_and_ps(m, alpha);
    const __m256 t_old = _mm256_loadu_ps(tr + j);
    const __m256 test_t = _mm256_mul_ps(t_old, _mm256_sub_ps(one, al));
    const __m256 low = _mm256_cmp_ps(test_t, _mm256_set1_ps(1e-4f), _CMP_LT_OS);
    const __m256 stop = _mm256_and_ps(low, m);
    stops += __builtin_popcount(_mm256_movemask_ps(stop));
    _mm256_storeu_ps(l + j, _mm256_andnot_ps(stop, lv));
    const __m256 w = _mm256_andnot_ps(low, _mm256_mul_ps(al, t_old));
    _mm256_storeu_ps(c0 + j, _mm256_add_ps(_mm256_loadu_ps(c0 + j), _mm256_mul_ps(w, _mm256_set1_ps(f[0]))));
    _mm256_storeu_ps(c1 + j, _mm256_add_ps(_mm256_loadu_ps(c1 + j), _mm256_mul_ps(w, _mm256_set1_ps(f[1]))));
    _mm256_storeu_ps(c2 + j, _mm256_add_ps(_mm256_loadu_ps(c2 + j), _mm256_mul_ps(w, _mm256_set1_ps(f[2]))));
    _mm256_storeu_ps(c3 + j, _mm256_add_ps(_mm256_loadu_ps(c3 + j), _mm256_mul_ps(w, _mm256_set1_ps(f[3]))));
    _mm256_storeu_ps(tr + j, _mm256_blendv_ps(test_t, t_old, low));
  }
  return stops;
}

inline bool cpu_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && std::getenv("STREAMSTUDIO_SPLAT_NO_AVX2") == nullptr;
  return yes;
}
#endif

// floor and ceil to int without a libm call (|x| well inside the int range here)
template <typename T>
inline int ifloor(T x) {
  const int i = (int)x;
  return i - (x < (T)i ? 1 : 0);
}
template <typename T>
inline int iceil(T x) {
  const int i = (int)x;
  return i + (x > (T)i ? 1 : 0);
}

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
                 int64_t W, int64_t H, double near_, double far_, bool antialiased, int64_t camera_model,
                 const at::Tensor& bg_t, int nthreads,
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
  // x/z, y/z clamped to the image's edges plus 0.15 W/fx (0.15 H/fy), from the actual
  // principal point (gsplat's persp_proj; splat_reference.frustum_limits)
  const double tan_fovx = 0.5 * W / fx, tan_fovy = 0.5 * H / fy;
  const T lim_x_pos = (T)((W - cx) / fx + 0.3 * tan_fovx), lim_x_neg = (T)(cx / fx + 0.3 * tan_fovx);
  const T lim_y_pos = (T)((H - cy) / fy + 0.3 * tan_fovy), lim_y_neg = (T)(cy / fy + 0.3 * tan_fovy);
  const T Tfx = (T)fx, Tfy = (T)fy, Tcx = (T)cx, Tcy = (T)cy, Tnear = (T)near_, Tfar = (T)far_;
  const T fW = (T)W, fH = (T)H;

  // STREAMSTUDIO_SPLAT_PROFILE=1 prints the time of each phase to stderr
  static const bool profile = std::getenv("STREAMSTUDIO_SPLAT_PROFILE") != nullptr;
  auto cpu_ms = []() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
  };
  double clock0 = cpu_ms();
  auto mark = [&](const char* what) {  // CPU time of the process (all threads)
    if (!profile) return;
    double now = cpu_ms();
    std::fprintf(stderr, "%s %.2f ms  ", what, now - clock0);
    clock0 = now;
  };
  std::unique_ptr<Gauss<T>[]> proj(new Gauss<T>[N]);  // not zeroed: only kept entries are read
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
    // Jacobian of the camera's map at the mean (gsplat's _persp_proj / _ortho_proj / _fisheye_proj),
    // J R, then (J R) S (J R)^T; and the projected mean
    T J[2][3];
    T pmx, pmy;
    if (camera_model == 1) {  // orthographic: (fx x + cx, fy y + cy)
      J[0][0] = Tfx; J[0][1] = 0; J[0][2] = 0;
      J[1][0] = 0; J[1][1] = Tfy; J[1][2] = 0;
      pmx = Tfx * x + Tcx;
      pmy = Tfy * y + Tcy;
    } else if (camera_model == 2) {  // fisheye, equidistant: r = f theta (gsplat's eps = 1e-7)
      const T eps = (T)1e-7;
      const T xy_len = std::sqrt(x * x + y * y) + eps;
      const T theta = std::atan2(xy_len, zs + eps);
      pmx = x * Tfx * theta / xy_len + Tcx;
      pmy = y * Tfy * theta / xy_len + Tcy;
      const T x2 = x * x + eps, y2 = y * y, xy = x * y;
      const T x2y2 = x2 + y2;
      const T x2y2z2_inv = (T)1 / (x2y2 + zs * zs);
      const T b = std::atan2(xy_len, zs) / xy_len / x2y2;
      const T a = zs * x2y2z2_inv / x2y2;
      J[0][0] = Tfx * (x2 * a + y2 * b); J[0][1] = Tfx * xy * (a - b); J[0][2] = -Tfx * x * x2y2z2_inv;
      J[1][0] = Tfy * xy * (a - b); J[1][1] = Tfy * (y2 * a + x2 * b); J[1][2] = -Tfy * y * x2y2z2_inv;
    } else {  // pinhole, x/z and y/z clamped
      const T txc = std::min(std::max(x / zs, -lim_x_neg), lim_x_pos) * zs;
      const T tyc = std::min(std::max(y / zs, -lim_y_neg), lim_y_pos) * zs;
      const T rz = (T)1 / zs;
      J[0][0] = rz * Tfx; J[0][1] = 0; J[0][2] = txc * (-Tfx) / (zs * zs);
      J[1][0] = 0; J[1][1] = rz * Tfy; J[1][2] = tyc * (-Tfy) / (zs * zs);
      pmx = Tfx * x / zs + Tcx;
      pmy = Tfy * y / zs + Tcy;
    }
    T JR[2][3], JS[2][3];
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) JR[r][c] = J[r][0] * R[0][c] + J[r][1] * R[1][c] + J[r][2] * R[2][c];
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) JS[r][c] = JR[r][0] * S[0][c] + JR[r][1] * S[1][c] + JR[r][2] * S[2][c];
    const T r_xx = JS[0][0] * JR[0][0] + JS[0][1] * JR[0][1] + JS[0][2] * JR[0][2];  // before the low-pass
    const T r_yy = JS[1][0] * JR[1][0] + JS[1][1] * JR[1][1] + JS[1][2] * JR[1][2];
    const T c_xx = r_xx + (T)0.3;
    const T c_xy = JS[0][0] * JR[1][0] + JS[0][1] * JR[1][1] + JS[0][2] * JR[1][2];
    const T c_yy = r_yy + (T)0.3;
    const T det = c_xx * c_yy - c_xy * c_xy;
    const bool ok = in_depth && det > 0;
    const T dets = ok ? det : (T)1;
    g.a = c_yy / dets;
    g.b = -c_xy / dets;
    g.c = c_xx / dets;
    g.o = opac[n];
    if (antialiased) {  // gsplat's "antialiased": o * sqrt(det(cov2d) / det(cov2d + 0.3 I)) (Mip-Splatting)
      const T det_orig = r_xx * r_yy - c_xy * c_xy;
      g.o *= std::sqrt(std::max((T)0, det_orig / dets));
    }
    g.reach = (T)2 * std::log(std::max((T)255 * g.o, (T)1));
    g.rx = std::sqrt(g.reach * std::max(c_xx, (T)0));
    g.ry = std::sqrt(g.reach * std::max(c_yy, (T)0));
    g.mx = pmx;
    g.my = pmy;
    const bool on_screen = (g.mx + g.rx > 0) && (g.my + g.ry > 0) && (g.mx - g.rx < fW) && (g.my - g.ry < fH);
    keep[n] = ok && on_screen && g.reach > 0 && g.rx > 0 && std::isfinite(pmx) && std::isfinite(pmy);
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

  mark("project");
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
  std::unique_ptr<Gauss<T>[]> gs(new Gauss<T>[M > 0 ? M : 1]);
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int64_t i = 0; i < M; ++i) gs[i] = proj[ids[i]];

  mark("sort");
  // binning: tiles touched by each box, counting sort keeps depth order inside a tile
  const int tx_n = (int)((W + TS - 1) / TS), ty_n = (int)((H + TS - 1) / TS);
  const int n_tiles = tx_n * ty_n;
  std::vector<int32_t> rect(4 * M);
  std::vector<int64_t> offs(n_tiles + 1, 0);
  auto clampi = [](T v, int hi) {  // floor, clamped to [0, hi] (before the int conversion: v may be huge)
    v = std::min<T>(std::max<T>(v, (T)-1), (T)hi);
    return std::min(std::max(ifloor(v), 0), hi);
  };
  for (int64_t i = 0; i < M; ++i) {
    const Gauss<T>& g = gs[i];
    int x0 = clampi((g.mx - g.rx - (T)0.5) / TS, tx_n - 1), x1 = clampi((g.mx + g.rx - (T)0.5) / TS, tx_n - 1);
    int y0 = clampi((g.my - g.ry - (T)0.5) / TS, ty_n - 1), y1 = clampi((g.my + g.ry - (T)0.5) / TS, ty_n - 1);
    rect[4 * i] = x0; rect[4 * i + 1] = x1; rect[4 * i + 2] = y0; rect[4 * i + 3] = y1;
    for (int ty = y0; ty <= y1; ++ty)
      for (int tx = x0; tx <= x1; ++tx) offs[ty * tx_n + tx + 1]++;
  }
  for (int t = 0; t < n_tiles; ++t) offs[t + 1] += offs[t];
  std::unique_ptr<int32_t[]> lists(new int32_t[offs[n_tiles] > 0 ? offs[n_tiles] : 1]);
  {
    std::vector<int64_t> fill(offs.begin(), offs.end() - 1);
    for (int64_t i = 0; i < M; ++i)
      for (int ty = rect[4 * i + 2]; ty <= rect[4 * i + 3]; ++ty)
        for (int tx = rect[4 * i]; tx <= rect[4 * i + 1]; ++tx) lists[fill[ty * tx_n + tx]++] = (int32_t)i;
  }

  mark("bin");

  // blending, one tile per task
  T* rgb = rgb_t.data_ptr<T>();
  T* dep = depth_t.data_ptr<T>();
  T* alp = alpha_t.data_ptr<T>();
  const bool has_bg = bg_t.numel() == 3;
  T bg[3] = {0, 0, 0};
  if (has_bg)
    for (int ch = 0; ch < 3; ++ch) bg[ch] = bg_t.data_ptr<T>()[ch];
  const T a_min = (T)(1.0 / 255.0), a_max = (T)0.99, t_min = (T)1e-4;
#if defined(SPLAT_AVX2)
  const bool avx2 = cpu_has_avx2();
#endif

#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int tyi = tile / tx_n, txi = tile % tx_n;
    const int px0 = txi * TS, py0 = tyi * TS;
    const int pw = (int)std::min<int64_t>(TS, W - px0), ph = (int)std::min<int64_t>(TS, H - py0);
    alignas(64) T Tr[TS * TS + 8], a0[TS * TS + 8], a1[TS * TS + 8], a2[TS * TS + 8], a3[TS * TS + 8],
        live[TS * TS + 8];  // + 8: padding for the last row's 4/8-wide groups
    for (int k = 0; k < TS * TS + 8; ++k) {
      Tr[k] = 1;
      live[k] = (k < TS * TS && (k / TS) < ph && (k % TS) < pw) ? (T)1 : (T)0;  // pixels outside the image never blend
      a0[k] = a1[k] = a2[k] = a3[k] = 0;
    }
    int n_done = 0;
    const int n_pix = pw * ph;
    for (int64_t li = offs[tile]; li < offs[tile + 1] && n_done < n_pix; ++li) {
      const Gauss<T>& g = gs[lists[li]];
      // rows the box reaches in this tile (a hair of margin; the alpha test below is exact)
      const T mr = g.ry * (T)1.001 + (T)0.01;
      const int v0 = std::max(py0, iceil(std::max(g.my - mr - (T)0.5, (T)(py0 - 1))));
      const int v1 = std::min(py0 + ph - 1, ifloor(std::min(g.my + mr - (T)0.5, (T)(py0 + TS))));
      const T reach_m = g.reach * (T)1.001 + (T)1e-3, inv_a = (T)1 / g.a;
      const T bb_ac = g.b * g.b - g.a * g.c, a_reach = g.a * reach_m;
      for (int v = v0; v <= v1; ++v) {
        const T dy = (T)v + (T)0.5 - g.my;
        // span of the row inside the ellipse a dx^2 + 2 b dx dy + c dy^2 <= reach (with margin)
        const T disc = bb_ac * dy * dy + a_reach;
        if (disc < 0) continue;
        const T half = std::sqrt(disc) * inv_a + (T)0.01, cen = g.mx - g.b * dy * inv_a;
        const int lo = std::max(0, iceil(std::max(cen - half - (T)0.5, (T)(px0 - 1))) - px0);
        const int hi = std::min(pw - 1, ifloor(std::min(cen + half - (T)0.5, (T)(px0 + TS))) - px0);
        if (lo > hi) continue;
        const int row = (v - py0) * TS;
        T *tr = Tr + row, *l = live + row, *c0 = a0 + row, *c1 = a1 + row, *c2 = a2 + row, *c3 = a3 + row;
        const T cdy = g.c * dy * dy;
        const T f0 = g.f[0], f1 = g.f[1], f2 = g.f[2], f3 = g.f[3], o = g.o, mx = g.mx, ga = g.a, gb = g.b;
        int stops = 0;
#if defined(__SSE2__)
        if constexpr (std::is_same<T, float>::value) {
#if defined(SPLAT_AVX2)
          if (avx2) {
            n_done += blend_row_avx2(tr, l, c0, c1, c2, c3, px0, lo, hi, mx, ga, gb, cdy, dy, o, g.f);
            continue;
          }
#endif
          n_done += blend_row_sse(tr, l, c0, c1, c2, c3, px0, lo, hi, mx, ga, gb, cdy, dy, o, g.f);
          continue;
        }
#endif
        // scalar path (float64, or a CPU without SSE2): the span, same operations as the reference
        for (int j = lo; j <= hi; ++j) {
          const T dx = (T)(px0 + j) + (T)0.5 - mx;
          const T power = (T)-0.5 * (ga * dx * dx + cdy) - gb * dx * dy;
          T alpha = o * exp_neg(power);
          alpha = alpha < a_max ? alpha : a_max;
          T al = alpha >= a_min ? alpha : (T)0;  // skipped: alpha 0
          al = power <= 0 ? al : (T)0;
          al = l[j] != 0 ? al : (T)0;  // stopped pixels
          al = j >= lo ? al : (T)0;
          al = j <= hi ? al : (T)0;
          const T t_old = tr[j];
          const T test_t = t_old * ((T)1 - al);  // == t_old where al is 0
          const bool low = test_t < t_min;
          const int stop = low ? (al > 0 ? 1 : 0) : 0;
          stops += stop;
          l[j] = l[j] - (T)stop;
          const T w = low ? (T)0 : al * t_old;
          c0[j] += w * f0;
          c1[j] += w * f1;
          c2[j] += w * f2;
          c3[j] += w * f3;
          tr[j] = low ? t_old : test_t;
        }
        n_done += stops;
      }
    }
    for (int v = 0; v < ph; ++v)
      for (int u = 0; u < pw; ++u) {
        const int k = v * TS + u;
        const int64_t o = (int64_t)(py0 + v) * W + px0 + u;
        rgb[3 * o] = has_bg ? a0[k] + Tr[k] * bg[0] : a0[k];
        rgb[3 * o + 1] = has_bg ? a1[k] + Tr[k] * bg[1] : a1[k];
        rgb[3 * o + 2] = has_bg ? a2[k] + Tr[k] * bg[2] : a2[k];
        dep[o] = a3[k];
        alp[o] = (T)1 - Tr[k];
      }
  }
  mark("blend");
  if (profile)
    std::fprintf(stderr, "pairs %lld\n", (long long)offs[n_tiles]);
}

}  // namespace

// Fills rgb (H, W, 3), depth (H, W), alpha (H, W) (contiguous, the inputs' dtype); returns
// the number of visible Gaussians.
int64_t render(at::Tensor means, at::Tensor quats, at::Tensor scales, at::Tensor covars,
                               at::Tensor opacities, at::Tensor colors, int64_t sh_degree, at::Tensor viewmat,
                               double fx, double fy, double cx, double cy, int64_t width, int64_t height,
                               double near_, double far_, bool antialiased, int64_t camera_model,
                               at::Tensor background, int64_t threads,
                               at::Tensor rgb,
                               at::Tensor depth, at::Tensor alpha) {
  TORCH_CHECK(means.device().is_cpu(), "splat_cpu: CPU tensors only");
  TORCH_CHECK(camera_model >= 0 && camera_model <= 2, "splat_cpu: camera model 0 (pinhole), 1 (ortho) or 2 (fisheye)");
  TORCH_CHECK(means.numel() / 3 < (int64_t)1 << 31, "splat_cpu: too many Gaussians for 32-bit ids");
  TORCH_CHECK(rgb.numel() == height * width * 3 && depth.numel() == height * width && alpha.numel() == height * width,
              "splat_cpu: bad output sizes");
  int64_t n_visible = 0;
  int nt = (int)std::max<int64_t>(1, threads);
  if (means.scalar_type() == at::kDouble) {
    render_impl<double>(means, quats, scales, covars, opacities, colors, sh_degree, viewmat, fx, fy, cx, cy, width,
                        height, near_, far_, antialiased, camera_model, background, nt, rgb, depth, alpha,
                        n_visible);
  } else {
    TORCH_CHECK(means.scalar_type() == at::kFloat, "splat_cpu: float32 or float64 tensors");
    render_impl<float>(means, quats, scales, covars, opacities, colors, sh_degree, viewmat, fx, fy, cx, cy, width,
                       height, near_, far_, antialiased, camera_model, background, nt, rgb, depth, alpha,
                        n_visible);
  }
  return n_visible;
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
