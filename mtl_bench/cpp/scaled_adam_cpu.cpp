// Source: ScaledAdam of k2-fsa/icefall egs/librispeech/ASR/zipformer/optim.py (Daniel Povey, Apache-2.0); own code.
// ScaledAdam's two passes over float32 CPU tensors, built by torch.utils.cpp_extension (see scaled_adam_kernel.py).
//
// Why a kernel and not torch.compile: the update pass must also return sum(p*g) over the values of p before the
// update (the learned scale's gradient). Inductor does not fuse a reduction over p into the loop that overwrites
// p: it makes a second loop over p and g, so a step reads p and g once more than fused Adam does.
//
// Work is cut into blocks of BLOCK elements of one tensor; each block's sums go to their own slot and are added
// in block order, so results do not depend on the number of threads. Products are float32, summed in double
// (as (g * g).sum(dtype=torch.float64) does). target_clones compiles each loop for AVX-512, AVX2 and baseline
// x86-64 and picks one at load time (no flag tuned to the build host: the library runs on any x86-64 CPU).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t BLOCK = 1 << 20;

#if defined(__x86_64__) && defined(__GNUC__)
#define MTL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MTL_CLONES
#endif

// [sum g^2, sum p*g, sum p^2] over n elements (the last two only when full). The range is read as four quarters
// at once: more loads in flight than one stream gives a single thread.
MTL_CLONES void stats_block(const float* p, const float* g, int64_t n, bool full, double* out) {
  const int64_t q = n / 4;
  const float *g0 = g, *g1 = g0 + q, *g2 = g1 + q, *g3 = g2 + q;
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0, c0 = 0, c1 = 0, c2 = 0, c3 = 0;
  if (full) {
    const float *p0 = p, *p1 = p0 + q, *p2 = p1 + q, *p3 = p2 + q;
#pragma omp simd reduction(+ : a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3)
    for (int64_t j = 0; j < q; j++) {
      a0 += (double)(g0[j] * g0[j]);
      a1 += (double)(g1[j] * g1[j]);
      a2 += (double)(g2[j] * g2[j]);
      a3 += (double)(g3[j] * g3[j]);
      b0 += (double)(p0[j] * g0[j]);
      b1 += (double)(p1[j] * g1[j]);
      b2 += (double)(p2[j] * g2[j]);
      b3 += (double)(p3[j] * g3[j]);
      c0 += (double)(p0[j] * p0[j]);
      c1 += (double)(p1[j] * p1[j]);
      c2 += (double)(p2[j] * p2[j]);
      c3 += (double)(p3[j] * p3[j]);
    }
    for (int64_t j = 4 * q; j < n; j++) {
      a0 += (double)(g[j] * g[j]);
      b0 += (double)(p[j] * g[j]);
      c0 += (double)(p[j] * p[j]);
    }
  } else {
#pragma omp simd reduction(+ : a0, a1, a2, a3)
    for (int64_t j = 0; j < q; j++) {
      a0 += (double)(g0[j] * g0[j]);
      a1 += (double)(g1[j] * g1[j]);
      a2 += (double)(g2[j] * g2[j]);
      a3 += (double)(g3[j] * g3[j]);
    }
    for (int64_t j = 4 * q; j < n; j++) a0 += (double)(g[j] * g[j]);
  }
  out[0] = (a0 + a1) + (a2 + a3);
  out[1] = (b0 + b1) + (b2 + b3);
  out[2] = (c0 + c1) + (c2 + c3);
}

// v <- beta2*v + (1-beta2)*g'^2;  d <- beta1*d + size*p + alpha*g'/(sqrt(v*vscale)+eps);  p <- p + d, with
// g' = clip*g; returns sum p*g over the values before the update. c = [clip, beta1, beta2, vscale, eps].
MTL_CLONES double update_block(float* p, const float* g, float* d, float* v, int64_t n, float a, float sz,
                               const float* c) {
  const float clip = c[0], beta1 = c[1], beta2 = c[2], vscale = c[3], eps = c[4], one_minus_beta2 = 1.0f - beta2;
  double dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < n; j++) {
    const float pj = p[j], gj = g[j];
    dot += (double)(pj * gj);
    const float gc = gj * clip;
    const float vj = v[j] * beta2 + gc * (gc * one_minus_beta2);
    v[j] = vj;
    const float dj = d[j] * beta1 + pj * sz + gc / (std::sqrt(vj * vscale) + eps) * a;
    d[j] = dj;
    p[j] = pj + dj;
  }
  return dot;
}

// (tensor, first element) of every block of the given tensors, in order.
std::vector<std::pair<int64_t, int64_t>> blocks(const std::vector<at::Tensor>& ts) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t i = 0; i < (int64_t)ts.size(); i++)
    for (int64_t lo = 0; lo < ts[i].numel(); lo += BLOCK) out.emplace_back(i, lo);
  return out;
}

void check(const std::vector<at::Tensor>& ts, const char* what, int64_t n) {
  TORCH_CHECK((int64_t)ts.size() == n, what, ": expected ", n, " tensors, got ", ts.size());
  for (const auto& t : ts)
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), what,
                ": float32 contiguous CPU tensors only");
}

}  // namespace

// (n, 3) float64: [sum g^2, sum p*g, sum p^2] of each pair (p, g); the last two columns are 0 unless full.
at::Tensor stats(const std::vector<at::Tensor>& ps, const std::vector<at::Tensor>& gs, bool full) {
  const int64_t n = ps.size();
  check(ps, "ps", n);
  check(gs, "gs", n);
  for (int64_t i = 0; i < n; i++) TORCH_CHECK(ps[i].numel() == gs[i].numel(), "gs: sizes differ from ps");
  const auto work = blocks(ps);
  std::vector<double> partial(work.size() * 3);
  at::parallel_for(0, (int64_t)work.size(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; k++) {
      const auto [i, lo] = work[k];
      const int64_t len = std::min(BLOCK, ps[i].numel() - lo);
      stats_block(ps[i].data_ptr<float>() + lo, gs[i].data_ptr<float>() + lo, len, full, &partial[3 * k]);
    }
  });
  auto out = at::zeros({n, 3}, at::kDouble);
  double* o = out.data_ptr<double>();
  for (size_t k = 0; k < work.size(); k++)
    for (int c = 0; c < 3; c++) o[3 * work[k].first + c] += partial[3 * k + c];
  return out;
}

// The update of each tensor i with alpha[i], size[i] (float32 (n,)), in place on ps, ds, vs; returns (n,)
// float64: sum p*g of each tensor over the values before the update.
at::Tensor update(const std::vector<at::Tensor>& ps, const std::vector<at::Tensor>& gs,
                  const std::vector<at::Tensor>& ds, const std::vector<at::Tensor>& vs, const at::Tensor& alpha,
                  const at::Tensor& size, const at::Tensor& consts) {
  const int64_t n = ps.size();
  for (const auto* ts : {&ps, &gs, &ds, &vs}) check(*ts, "tensors", n);
  for (int64_t i = 0; i < n; i++)
    TORCH_CHECK(gs[i].numel() == ps[i].numel() && ds[i].numel() == ps[i].numel() && vs[i].numel() == ps[i].numel(),
                "update: sizes differ");
  for (const auto* t : {&alpha, &size, &consts})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->is_contiguous(),
                "alpha, size, consts: float32 contiguous CPU tensors");
  TORCH_CHECK(alpha.numel() == n && size.numel() == n && consts.numel() == 5, "alpha, size: (n,); consts: (5,)");
  const float *a = alpha.data_ptr<float>(), *z = size.data_ptr<float>(), *c = consts.data_ptr<float>();
  const auto work = blocks(ps);
  std::vector<double> partial(work.size());
  at::parallel_for(0, (int64_t)work.size(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; k++) {
      const auto [i, lo] = work[k];
      const int64_t len = std::min(BLOCK, ps[i].numel() - lo);
      partial[k] = update_block(ps[i].data_ptr<float>() + lo, gs[i].data_ptr<float>() + lo,
                                ds[i].data_ptr<float>() + lo, vs[i].data_ptr<float>() + lo, len, a[i], z[i], c);
    }
  });
  auto out = at::zeros({n}, at::kDouble);
  double* o = out.data_ptr<double>();
  for (size_t k = 0; k < work.size(); k++) o[work[k].first] += partial[k];
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("stats", &stats, "sum g^2, sum p*g, sum p^2 per tensor");
  m.def("update", &update, "the update pass, in place; returns sum p*g per tensor");
}
