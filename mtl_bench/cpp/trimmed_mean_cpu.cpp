// Yin et al., ICML 2018 (coordinate-wise trimmed mean): TrimmedMean's trim=1 direction (trimmed_mean.drop_extremes)
// for a (T, P) float32 CPU matrix with dense rows.
//
// Per column: the first row holding the max and the last row holding the min are dropped (so two rows are dropped
// even where all T values are equal), the other T - 2 values are summed in double (exact for any but extreme
// spreads of magnitude, so the order does not matter), divided by T - 2 and rounded once to float; and how often
// each row was kept. The torch path sums in float (in an order of its own, which changes with P), so the two
// differ by float rounding: a few ulp of the sum of the kept magnitudes over T - 2.
//
// torch takes six passes, each writing a fresh T x P tensor; here 16 columns at a time (one vector) are read once
// from memory: a pass over the T rows for the running max / min and their rows, then a pass over the same cache
// lines (now in L1) for the sum and the drop counts. Every column's result is computed the same way wherever it
// falls, and the counts are integers: the same bits for any thread count.
// NaN (not matched to torch's; a step with a non-finite Gramian is skipped anyway): a NaN is always summed, so its
// column's mean is NaN; nothing fails.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
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
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef double v8d __attribute__((vector_size(64)));

constexpr int64_t kGroups = 64;         // column groups run in parallel; each counts its own drops
constexpr int64_t kMinGroup = 1 << 14;  // columns per group at least

// One column outside the vector loop (a group's tail), with the vector loop's arithmetic.
inline void drop_column(const float* base, int64_t ld, int t, int64_t k, float* out, int64_t* removed) {
  float hi = base[k], lo = base[k];
  int hi_row = 0, lo_row = 0;
  for (int r = 1; r < t; ++r) {
    const float x = base[r * ld + k];
    if (x > hi) hi = x, hi_row = r;
    if (x <= lo) lo = x, lo_row = r;
  }
  double sum = 0.0;
  for (int r = 0; r < t; ++r) {
    const float x = base[r * ld + k];
    sum += ((r == hi_row || r == lo_row) && x == x) ? 0.0 : static_cast<double>(x);
  }
  out[k] = static_cast<float>(sum / (t - 2));
  removed[hi_row] += 1;
  removed[lo_row] += 1;
}

// Columns [begin, end): the direction into out, each row's dropped count added to removed (t counters).
MTL_CLONES
void drop_columns(const float* base, int64_t ld, int t, int64_t begin, int64_t end, float* out, int64_t* removed) {
  // per row and lane: minus the drops (a true comparison is -1); int32, not v16i: a std::vector of vector types
  // does not get their 64-byte alignment
  std::vector<int32_t> drops(16 * t, 0);
  const v8 zero = {};
  const double kept = t - 2;
  int64_t k = begin;
  for (; k + 16 <= end; k += 16) {
    v16 hi, lo, x;
    __builtin_memcpy(&hi, base + k, sizeof(v16));
    lo = hi;
    v16i hi_row = {}, lo_row = {};
    for (int r = 1; r < t; ++r) {
      __builtin_memcpy(&x, base + r * ld + k, sizeof(v16));
      const v16i row = v16i{} + r;
      const v16i above = x > hi;  // strict: the first row holding the max stays
      hi = above ? x : hi;
      hi_row = above ? row : hi_row;
      const v16i below = x <= lo;  // not strict: the last row holding the min wins
      lo = below ? x : lo;
      lo_row = below ? row : lo_row;
    }
    for (int h = 0; h < 16; h += 8) {  // the sum in double: two halves of 8 columns
      v8i hr, lr, count;
      __builtin_memcpy(&hr, reinterpret_cast<const int32_t*>(&hi_row) + h, sizeof(v8i));
      __builtin_memcpy(&lr, reinterpret_cast<const int32_t*>(&lo_row) + h, sizeof(v8i));
      v8d sum = {};
      for (int r = 0; r < t; ++r) {
        v8 xh;
        __builtin_memcpy(&xh, base + r * ld + k + h, sizeof(v8));
        const v8i dropped = (hr == r) | (lr == r);
        const v8i skipped = dropped & (xh == xh);  // a NaN is never skipped (row 0's would be: nothing beats it)
        sum += __builtin_convertvector(skipped ? zero : xh, v8d);
        __builtin_memcpy(&count, &drops[16 * r + h], sizeof(v8i));
        count += dropped;
        __builtin_memcpy(&drops[16 * r + h], &count, sizeof(v8i));
      }
      const v8 mean = __builtin_convertvector(sum / kept, v8);
      __builtin_memcpy(out + k + h, &mean, sizeof(v8));
    }
  }
  for (; k < end; ++k) drop_column(base, ld, t, k, out, removed);
  for (int r = 0; r < t; ++r)
    for (int l = 0; l < 16; ++l) removed[r] -= drops[16 * r + l];
}

}  // namespace

std::vector<torch::Tensor> drop_extremes(const torch::Tensor& m) {
  TORCH_CHECK(m.dim() == 2 && m.device().is_cpu() && m.scalar_type() == torch::kFloat32 && m.stride(1) == 1,
              "drop_extremes: a 2-D float32 CPU tensor with dense rows");
  TORCH_CHECK(m.size(0) >= 3, "drop_extremes: at least 3 rows (one max and one min are dropped)");
  const int t = static_cast<int>(m.size(0));
  const int64_t p = m.size(1), ld = m.stride(0);
  const float* base = m.data_ptr<float>();
  auto direction = torch::empty({p}, m.options());
  float* out = direction.data_ptr<float>();
  const int64_t groups = std::max<int64_t>(1, std::min(kGroups, p / kMinGroup));
  std::vector<int64_t> parts(groups * t, 0);
  at::parallel_for(0, groups, 1, [&](int64_t first, int64_t last) {
    for (int64_t q = first; q < last; ++q) {
      const int64_t begin = q * (p / 16) / groups * 16;  // multiples of 16 but the last end: one tail at most
      const int64_t end = q + 1 == groups ? p : (q + 1) * (p / 16) / groups * 16;
      drop_columns(base, ld, t, begin, end, out, parts.data() + q * t);
    }
  });
  auto kept = torch::full({t}, p, torch::dtype(torch::kInt64));
  int64_t* counts = kept.data_ptr<int64_t>();
  for (int64_t q = 0; q < groups; ++q)
    for (int r = 0; r < t; ++r) counts[r] -= parts[q * t + r];
  return {direction, kept};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("drop_extremes", &drop_extremes, "TrimmedMean's trim=1 direction and kept counts for a (T, P) matrix");
}
