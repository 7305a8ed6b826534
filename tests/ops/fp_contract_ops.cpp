// SPDX-License-Identifier: Apache-2.0
// The ops' pixel functors built as the ops' host code is (ops_host_args, -O3) but for a target
// with FMA (-march=x86-64-v3): fp_contract_main.cpp checks that a multiply-add in them still
// rounds twice, as on the device (-fmad=false). Without -ffp-contract=off in ops_host_args, GCC
// and clang fuse these into one vfmadd and the host's pixels differ from the device's.
#include "ops/band_ops.hpp"

namespace ops = vibespatial::raster::detail::ops;

extern "C" {

/// RescaleOp<float, float>: (v - in_min) * factor + out_min.
float vsr_fp_contract_rescale(float v, float in_min, float factor, float out_min) {
  const ops::RescaleOp<float, float> op{ops::Valid<float>(ops::NodataSpec{}), in_min, factor,
                                        out_min, 0.0f};
  return op(v);
}

/// MergeStats' mean: a.mean + delta * (nb / nr), for a of `na` pixels and b of `nb`.
double vsr_fp_contract_merge_mean(double mean_a, long long na, double mean_b, long long nb) {
  const ops::Stats a{na, mean_a, 0.0, mean_a, mean_a};
  const ops::Stats b{nb, mean_b, 0.0, mean_b, mean_b};
  return ops::MergeStats{}(a, b).mean;
}

/// A histogram edge of BinOp: k * step + lower.
double vsr_fp_contract_edge(int k, double lower, double step) {
  const ops::BinOp<double> op{ops::Valid<double>(ops::NodataSpec{}), 1 << 30, lower, 0.0, step};
  return op.edge(k);
}

}  // extern "C"
