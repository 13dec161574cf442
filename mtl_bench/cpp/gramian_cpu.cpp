// G = M Mᵀ for a (T, P) float32 CPU matrix with dense rows: the Gramian of T per-task gradients.
//
// torch.mm runs this shape (T of 2-40 rows, P of 10^5-10^7 columns) at a fraction of the memory bandwidth on
// one CPU thread (8 ms for 10 x 915k floats). Here the columns are taken in chunks that stay in L2, and every
// chunk is read by register tiles of at most 4x4 rows that cover the lower triangle exactly: off-diagonal tiles
// of up to 4x4 pairs, and triangular tiles on the diagonal that compute only the pairs (a, b) with b <= a, so no
// product is computed twice or for a row past T. Each chunk's float partial sums are added in double, so the
// result is closer to the exact one than torch.mm's. The chunks are split into a fixed number of groups whose
// partial Gramians are summed in order: the same bits for any number of threads.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

// target_clones (one build holding AVX-512, AVX2+FMA and baseline loops, picked at load time) is a GCC/clang x86
// feature: elsewhere (ARM, other compilers) the loops are built once for the target's baseline.
#if defined(__x86_64__) && defined(__GNUC__)
#define MTL_CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define MTL_CLONES
#endif

namespace {

typedef float v16 __attribute__((vector_size(64)));

constexpr int64_t kChunk = 8192;  // columns per chunk: 10 rows x 32 KB stay in L2
constexpr int64_t kGroups = 64;   // fixed partition of the chunks, so the sum order does not depend on threads

// g[a * ldg + b] += Σ_k x[a][k] y[b][k] over k < n for A rows x and B rows y; with Diag, y is x and only the
// pairs b <= a are computed. Inlined into each target clone of lower_gramian (16 vector accumulators at most).
template <int A, int B, bool Diag>
__attribute__((always_inline)) inline void tile(const float* const* x, const float* const* y, int64_t n, double* g,
                                                int ldg) {
  v16 s[A][B] = {};
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    v16 xv[A], yv[B];
    for (int a = 0; a < A; ++a) __builtin_memcpy(&xv[a], x[a] + k, sizeof(v16));
    if (!Diag)
      for (int b = 0; b < B; ++b) __builtin_memcpy(&yv[b], y[b] + k, sizeof(v16));
    for (int a = 0; a < A; ++a)
      for (int b = 0; b < B; ++b)
        if (!Diag || b <= a) s[a][b] += xv[a] * (Diag ? xv[b] : yv[b]);
  }
  for (int a = 0; a < A; ++a)
    for (int b = 0; b < B; ++b) {
      if (Diag && b > a) continue;
      double sum = 0;
      for (int l = 0; l < 16; ++l) sum += s[a][b][l];
      for (int64_t m = k; m < n; ++m) sum += static_cast<double>(x[a][m]) * y[b][m];
      g[a * ldg + b] += sum;
    }
}

template <bool Diag>
__attribute__((always_inline)) inline void tile_rows(int a, const float* const* x, const float* const* y, int64_t n,
                                                     double* g, int ldg) {
  switch (a) {  // y has 4 rows off the diagonal (all row blocks before the last are full), a on it
    case 4: tile<4, 4, Diag>(x, y, n, g, ldg); break;
    case 3: tile<3, Diag ? 3 : 4, Diag>(x, y, n, g, ldg); break;
    case 2: tile<2, Diag ? 2 : 4, Diag>(x, y, n, g, ldg); break;
    default: tile<1, Diag ? 1 : 4, Diag>(x, y, n, g, ldg); break;
  }
}

// The lower triangle of the Gramian of columns [begin, end), added to g (t x t, row-major).
MTL_CLONES
void lower_gramian(const float* base, int64_t ld, int t, int64_t begin, int64_t end, double* g) {
  for (int64_t k0 = begin; k0 < end; k0 += kChunk) {
    const int64_t n = std::min(kChunk, end - k0);
    for (int i0 = 0; i0 < t; i0 += 4) {
      const int a = std::min(4, t - i0);
      const float* x[4];
      for (int r = 0; r < a; ++r) x[r] = base + (i0 + r) * ld + k0;
      for (int j0 = 0; j0 < i0; j0 += 4) {
        const float* y[4];
        for (int r = 0; r < 4; ++r) y[r] = base + (j0 + r) * ld + k0;
        tile_rows<false>(a, x, y, n, g + i0 * t + j0, t);
      }
      tile_rows<true>(a, x, x, n, g + i0 * t + i0, t);
    }
  }
}

}  // namespace

torch::Tensor gramian(const torch::Tensor& m) {
  TORCH_CHECK(m.dim() == 2 && m.device().is_cpu() && m.scalar_type() == torch::kFloat32 && m.stride(1) == 1,
              "gramian: a 2-D float32 CPU tensor with dense rows");
  const int t = static_cast<int>(m.size(0));
  const int64_t p = m.size(1), ld = m.stride(0);
  const float* base = m.data_ptr<float>();
  const int64_t chunks = (p + kChunk - 1) / kChunk;
  const int64_t groups = std::max<int64_t>(1, std::min(kGroups, chunks));
  std::vector<double> parts(groups * t * t, 0.0);
  at::parallel_for(0, groups, 1, [&](int64_t first, int64_t last) {
    for (int64_t q = first; q < last; ++q) {
      const int64_t begin = std::min(p, q * chunks / groups * kChunk);
      const int64_t end = std::min(p, (q + 1) * chunks / groups * kChunk);
      lower_gramian(base, ld, t, begin, end, parts.data() + q * t * t);
    }
  });
  auto out = torch::empty({t, t}, m.options());
  float* o = out.data_ptr<float>();
  for (int i = 0; i < t; ++i)
    for (int j = 0; j <= i; ++j) {
      double sum = 0;
      for (int64_t q = 0; q < groups; ++q) sum += parts[q * t * t + i * t + j];
      o[i * t + j] = o[j * t + i] = static_cast<float>(sum);
    }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
    module.def("gramian", &gramian, "M Mᵀ for a (T, P) float32 CPU matrix");
}
