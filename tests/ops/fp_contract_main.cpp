// SPDX-License-Identifier: Apache-2.0
// Host pixels round as device pixels: the ops' functors, built with the ops' host flags for a
// target with FMA (fp_contract_ops.cpp), give the twice-rounded a * b + c on inputs where a fused
// multiply-add gives another value. Built for baseline x86-64 (no FMA), so the references here
// round twice. Exits 77 (skipped) on a CPU without FMA.
#include <cmath>
#include <cstdio>

extern "C" {
float vsr_fp_contract_rescale(float v, float in_min, float factor, float out_min);
double vsr_fp_contract_merge_mean(double mean_a, long long na, double mean_b, long long nb);
double vsr_fp_contract_edge(int k, double lower, double step);
}

namespace {

int failures = 0;

template <class T>
void expect(const char* what, T got, T unfused, T fused) {
  if (unfused == fused) {
    std::printf("FAIL %s: the inputs do not tell fused from unfused (%a)\n", what,
                static_cast<double>(unfused));
    ++failures;
  } else if (got != unfused) {
    std::printf("FAIL %s: %a, not the twice-rounded %a%s\n", what, static_cast<double>(got),
                static_cast<double>(unfused), got == fused ? " (it is the fused result)" : "");
    ++failures;
  } else {
    std::printf("ok   %s: %a (fused would give %a)\n", what, static_cast<double>(got),
                static_cast<double>(fused));
  }
}

}  // namespace

int main() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("fma") || !__builtin_cpu_supports("avx2")) {
    std::puts("SKIP: this CPU has no FMA (x86-64-v3), so nothing here can be fused");
    return 77;
  }
  // volatile: the compiler must not fold the references at compile time.
  {
    // (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24: a tie in float, rounded to 1 + 2^-11.
    volatile float v = 1.0f + 0x1p-12f, in_min = 0.0f, factor = 1.0f + 0x1p-12f;
    volatile float out_min = -(1.0f + 0x1p-11f);
    const float product = (v - in_min) * factor;
    const float unfused = product + out_min;
    const float fused = std::fma(v - in_min, factor, out_min);
    expect("RescaleOp (v - in_min) * factor + out_min",
           vsr_fp_contract_rescale(v, in_min, factor, out_min), unfused, fused);
  }
  {
    // mean_a + delta * (nb / nr) with nb = 1, nr = na + 1: the first (mean_b, na) whose two
    // roundings differ.
    volatile double mean_a = 0.3;
    double mean_b = 0, u = 0, f = 0;
    long long na = 1;
    for (int k = 1; k < 100 && u == f; ++k) {
      mean_b = mean_a + 0.37 * k;
      const double delta = mean_b - mean_a;
      for (na = 1; na < 1000; ++na) {
        const double ratio = 1.0 / static_cast<double>(na + 1);
        const double product = delta * ratio;
        u = mean_a + product;
        f = std::fma(delta, ratio, static_cast<double>(mean_a));
        if (u != f) break;
      }
    }
    expect("MergeStats a.mean + delta * (nb / nr)",
           vsr_fp_contract_merge_mean(mean_a, na, mean_b, 1), u, f);
  }
  {
    // k * step + lower with step = 0.1 (inexact): the first k whose two roundings differ.
    volatile double step = 0.1, lower = -1.0;
    int k = 1;
    double u = 0, f = 0;
    for (; k < 100000; ++k) {
      const double p = static_cast<double>(k) * step;
      u = p + lower;
      f = std::fma(static_cast<double>(k), static_cast<double>(step), static_cast<double>(lower));
      if (u != f) break;
    }
    expect("BinOp edge k * step + lower", vsr_fp_contract_edge(k, lower, step), u, f);
  }
  return failures == 0 ? 0 : 1;
}
