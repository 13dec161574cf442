// ExcessMTL's per-coordinate step on one (T, P) float32 CPU block of J (see excess_mtl.py): S' = S + g²/c and
// e_i = Σ_p (g²/c)_ip / √(S'_ip + 1e-7), c the loss scale squared, in one pass over g and S, writing S' into a
// buffer the caller keeps from step to step.
//
// torch runs this as five elementwise ops, each writing a fresh T x P tensor (its page faults cost more than
// the arithmetic). Here each element's values are the same float operations in the same order as torch's
// (built with -ffp-contract=off: no fused multiply-add), so S' has torch's bits; only the sum differs: the
// terms are added in double, into 8 lanes per row in a fixed order over a fixed partition of the columns (64
// groups at most), so e is the same for any number of threads and any of the target_clones.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

// target_clones (one build holding AVX-512, AVX2+FMA and baseline loops, picked at load time) is a GCC/clang x86
// feature: elsewhere (ARM, other compilers) the loops are built once for the target's baseline.
#if defined(__x86_64__) && defined(__GNUC__)
#define MTL_CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define MTL_CLONES
#endif

namespace {

constexpr int64_t kChunk = 512;          // terms held in L1 between the elementwise loop and the sum
constexpr int64_t kGroups = 64;          // fixed partition of the columns, so the sum order does not depend on threads
constexpr int64_t kGroupMin = 1 << 14;   // columns per group at least

// Scale: 0 none (c = 1), 1 multiply by 1/c (exact: c a power of two, as the grad scaler's), 2 divide by c.
template <int Scale>
__attribute__((always_inline)) inline void segment(const float* g, const float* s, float* out, int64_t n, float c,
                                                   float inv, double* lanes) {
  float term[kChunk];
  for (int64_t k0 = 0; k0 < n; k0 += kChunk) {
    const int64_t m = std::min(kChunk, n - k0);
    for (int64_t k = 0; k < m; ++k) {  // vectorized: no reduction in this loop
      float sq = g[k0 + k] * g[k0 + k];
      if (Scale == 1) sq = sq * inv;
      if (Scale == 2) sq = sq / c;
      const float total = s[k0 + k] + sq;
      out[k0 + k] = total;
      term[k] = sq / std::sqrt(total + 1e-7f);
    }
    int64_t k = 0;
    for (; k + 8 <= m; k += 8)
      for (int l = 0; l < 8; ++l) lanes[l] += static_cast<double>(term[k + l]);
    for (int l = 0; k + l < m; ++l) lanes[l] += static_cast<double>(term[k + l]);  // kChunk is a multiple of 8
  }
}

// One row's columns [0, n) of a group: S' into out, the terms' sum into lanes[8].
MTL_CLONES
void row_segment(const float* g, const float* s, float* out, int64_t n, int scale, float c, float inv,
                 double* lanes) {
  switch (scale) {
    case 0: segment<0>(g, s, out, n, c, inv, lanes); break;
    case 1: segment<1>(g, s, out, n, c, inv, lanes); break;
    default: segment<2>(g, s, out, n, c, inv, lanes); break;
  }
}

}  // namespace

// e (T,) float32; writes S' = S + g²/c into out. g, s, out: (T, P) float32 CPU with dense rows, one layout.
torch::Tensor excess(const torch::Tensor& g, const torch::Tensor& s, torch::Tensor& out, double scale_squared) {
  for (const torch::Tensor* x : {&g, &s, static_cast<const torch::Tensor*>(&out)})
    TORCH_CHECK(x->dim() == 2 && x->device().is_cpu() && x->scalar_type() == torch::kFloat32 && x->stride(1) == 1 &&
                    x->sizes() == g.sizes() && x->stride(0) == g.stride(0),
                "excess: (T, P) float32 CPU tensors with dense rows and one layout");
  const int64_t t = g.size(0), p = g.size(1), ld = g.stride(0);
  const float c = static_cast<float>(scale_squared);
  int mant_exp = 0;
  const bool power_of_two = std::isfinite(c) && c > 0 && std::frexp(c, &mant_exp) == 0.5f && std::isnormal(1.0f / c);
  const int mode = c == 1.0f ? 0 : power_of_two ? 1 : 2;
  const float inv = power_of_two ? 1.0f / c : 1.0f;
  const int64_t groups = std::max<int64_t>(1, std::min(kGroups, p / kGroupMin));
  std::vector<double> parts(groups * t, 0.0);
  const float* gp = g.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, groups, 1, [&](int64_t first, int64_t last) {
    for (int64_t q = first; q < last; ++q) {
      const int64_t begin = q * p / groups, end = (q + 1) * p / groups;
      for (int64_t i = 0; i < t; ++i) {
        double lanes[8] = {};
        const int64_t at = i * ld + begin;
        row_segment(gp + at, sp + at, op + at, end - begin, mode, c, inv, lanes);
        double sum = 0;
        for (int l = 0; l < 8; ++l) sum += lanes[l];
        parts[q * t + i] = sum;
      }
    }
  });
  auto e = torch::empty({t}, g.options());
  float* ep = e.data_ptr<float>();
  for (int64_t i = 0; i < t; ++i) {
    double sum = 0;
    for (int64_t q = 0; q < groups; ++q) sum += parts[q * t + i];
    ep[i] = static_cast<float>(sum);
  }
  return e;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("excess", &excess, "ExcessMTL's S' = S + g²/c (into out) and excess risks e (T,) of one block");
}
