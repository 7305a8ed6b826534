// SPDX-License-Identifier: Apache-2.0
// Band math (calc): the evaluator, one functor that runs a compiled program (calc_program.hpp)
// over W pixels at a time: each instruction is a loop over the W lanes, so that on the host the
// dispatch on the opcode is paid once per W pixels and the lane loops vectorise; the device runs
// it with W = 1 (one pixel per thread). Every lane computes exactly what a single pixel would,
// so both backends give the same values from this one source (calc_math.hpp has the
// operations). No allocation, no virtual call: the host's registers live on its stack, the
// device's in shared memory sized by the program (CalcRegisters). Included only by ops_host.cpp
// and ops_cuda.cu; the device's kernel is in ops_cuda.cu.
#pragma once

#include "ops/band_ops.hpp"
#include "ops/calc_math.hpp"
#include "ops/calc_program.hpp"

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstdint>
#include <cstring>

namespace vibespatial::raster::detail::ops::calc {

/// The value of type T held in the low bytes of @p bits (as the facade packed it).
template <class T>
VSR_HD inline T unpack(std::uint64_t bits) {
  T v;
  memcpy(&v, &bits, sizeof(T));
  return v;
}

/// The mask's element type: an integer as wide as C (1 valid, 0 not), so that the mask, the
/// loads and the stores vectorise together (GCC gives bool arrays no vector type).
template <class C>
using mask_t = cuda::std::conditional_t<sizeof(C) == 4, std::uint32_t, std::uint64_t>;

template <int W, class C, class F>
VSR_HD inline void lanes(C* __restrict__ d, const C* __restrict__ a, F f) {
  for (int l = 0; l < W; ++l) d[l] = f(a[l]);
}
template <int W, class C, class F>
VSR_HD inline void lanes(C* __restrict__ d, const C* __restrict__ a, const C* __restrict__ b, F f) {
  for (int l = 0; l < W; ++l) d[l] = f(a[l], b[l]);
}
template <int W, class C, class F>
VSR_HD inline void lanes(C* __restrict__ d, const C* __restrict__ a, const C* __restrict__ b,
                         const C* __restrict__ c, F f) {
  for (int l = 0; l < W; ++l) d[l] = f(a[l], b[l], c[l]);
}

/// Loads W pixels of one band as C, and (when @p check) clears the mask where they are invalid:
/// NaN (floats) or the input's nodata, compared in the input's type (the library's rule).
template <class T, int W, class C>
VSR_HD inline void load_as(const CalcSlot& s, std::int64_t first, C* __restrict__ d,
                           mask_t<C>* __restrict__ ok, bool check) {
  const T* __restrict__ p = static_cast<const T*>(s.data) + first;
  if (!check) {
    for (int l = 0; l < W; ++l) d[l] = static_cast<C>(p[l]);
    return;
  }
  const bool has = s.has_nodata;
  const T nd = unpack<T>(s.nodata);
  for (int l = 0; l < W; ++l) {
    const T v = p[l];
    d[l] = static_cast<C>(v);
    bool valid = !(has & (v == nd));
    if constexpr (is_float_v<T>) valid = valid & (v == v);
    ok[l] = ok[l] & static_cast<mask_t<C>>(valid);
  }
}

template <int W, class C>
VSR_HD inline void load(const CalcSlot& s, std::int64_t first, C* d, mask_t<C>* ok, bool check) {
  switch (s.dtype) {
    case DType::uint8:
      return load_as<std::uint8_t, W>(s, first, d, ok, check);
    case DType::int8:
      return load_as<std::int8_t, W>(s, first, d, ok, check);
    case DType::uint16:
      return load_as<std::uint16_t, W>(s, first, d, ok, check);
    case DType::int16:
      return load_as<std::int16_t, W>(s, first, d, ok, check);
    case DType::uint32:
      return load_as<std::uint32_t, W>(s, first, d, ok, check);
    case DType::int32:
      return load_as<std::int32_t, W>(s, first, d, ok, check);
    case DType::uint64:
      return load_as<std::uint64_t, W>(s, first, d, ok, check);
    case DType::int64:
      return load_as<std::int64_t, W>(s, first, d, ok, check);
    case DType::float32:
      return load_as<float, W>(s, first, d, ok, check);
    case DType::float64:
      return load_as<double, W>(s, first, d, ok, check);
  }
}

/// Writes W results as O: the output's nodata where the mask is false (only loads that check
/// clear it) and, for an integer O, where the result is NaN; else convert_to (floats as IEEE
/// rounds, integers rounded half away from zero and saturated).
template <class O, int W, class C>
VSR_HD inline void store_as(const CalcOutputBand& o, std::int64_t first, const C* __restrict__ r,
                            const mask_t<C>* __restrict__ ok) {
  O* __restrict__ p = static_cast<O*>(o.data) + first;
  const O nd = unpack<O>(o.nodata);
  for (int l = 0; l < W; ++l) {
    const C x = r[l];
    bool bad = ok[l] == 0;
    if constexpr (!is_float_v<O>) bad = bad | (x != x);
    const O v = convert_to<O>(x);
    p[l] = bad ? nd : v;
  }
}

template <int W, class C>
VSR_HD inline void store(const CalcOutputBand& o, std::int64_t first, const C* r,
                         const mask_t<C>* ok) {
  switch (o.dtype) {
    case DType::uint8:
      return store_as<std::uint8_t, W>(o, first, r, ok);
    case DType::int8:
      return store_as<std::int8_t, W>(o, first, r, ok);
    case DType::uint16:
      return store_as<std::uint16_t, W>(o, first, r, ok);
    case DType::int16:
      return store_as<std::int16_t, W>(o, first, r, ok);
    case DType::uint32:
      return store_as<std::uint32_t, W>(o, first, r, ok);
    case DType::int32:
      return store_as<std::int32_t, W>(o, first, r, ok);
    case DType::uint64:
      return store_as<std::uint64_t, W>(o, first, r, ok);
    case DType::int64:
      return store_as<std::int64_t, W>(o, first, r, ok);
    case DType::float32:
      return store_as<float, W>(o, first, r, ok);
    case DType::float64:
      return store_as<double, W>(o, first, r, ok);
  }
}

/// The registers of one evaluation: register r's W lanes start at base + r * stride. The host
/// keeps them on its stack (stride W: each register's lanes side by side); the device gives each
/// thread one lane per register in shared memory, register r of thread t at r * blockDim + t
/// (stride blockDim), so that a warp's accesses to a register fall in distinct banks.
template <class C, int Stride>
struct CalcRegisters {
  C* base;
  VSR_HD C* operator[](int r) const { return base + r * Stride; }
};
template <class C>
struct CalcRegisters<C, 0> {  // stride known at run time
  C* base;
  int stride;
  VSR_HD C* operator[](int r) const { return base + r * stride; }
};

/// Runs the program of @p p on pixels [first, first + W), its registers in @p reg.
template <int W, class C, class Registers>
VSR_HD inline void evaluate(const CalcLaunch& p, std::int64_t first, Registers reg) {
  mask_t<C> ok[W];
  for (int l = 0; l < W; ++l) ok[l] = 1;
  const bool check = p.propagate_nodata;
  for (int pc = 0; pc < p.code_size; ++pc) {
    const CalcInstr in = p.code[pc];
    C* d = reg[in.dst];
    const C* a = reg[in.a];
    const C* b = reg[in.b];
    const C* c = reg[in.c];
    switch (in.op) {
      case CalcOp::load:
        load<W>(p.slots[in.arg], first, d, ok, check);
        break;
      case CalcOp::constant: {
        const C k = static_cast<C>(p.constants[in.arg]);
        for (int l = 0; l < W; ++l) d[l] = k;
        break;
      }
      case CalcOp::store:
        store<W>(p.outputs[in.arg], first, a, ok);
        for (int l = 0; l < W; ++l) ok[l] = 1;
        break;
#define VSR_CALC_CASE1(name, expr) \
  case CalcOp::name:               \
    lanes<W>(d, a, Op_##name{});   \
    break;
#define VSR_CALC_CASE2(name, expr)  \
  case CalcOp::name:                \
    lanes<W>(d, a, b, Op_##name{}); \
    break;
#define VSR_CALC_CASE3(name, expr)     \
  case CalcOp::name:                   \
    lanes<W>(d, a, b, c, Op_##name{}); \
    break;
        VSR_CALC_UNARY_OPS(VSR_CALC_CASE1)
        VSR_CALC_BINARY_OPS(VSR_CALC_CASE2)
        VSR_CALC_TERNARY_OPS(VSR_CALC_CASE3)
#undef VSR_CALC_CASE1
#undef VSR_CALC_CASE2
#undef VSR_CALC_CASE3
    }
  }
}

/// The host's evaluation: pixels [offset + i * W, offset + (i + 1) * W) for argument i, the
/// registers on the stack.
template <class C, int W>
struct CalcEval {
  CalcLaunch p;  ///< tables in the memory this functor runs in
  std::int64_t offset = 0;

  void operator()(long long i) const {
    C reg[kCalcMaxRegisters * W];
    evaluate<W, C>(p, offset + static_cast<std::int64_t>(i) * W, CalcRegisters<C, W>{reg});
  }
};

/// The host: runs @p launch (tables where @p policy runs) with lanes of W: whole groups of W
/// pixels, then the remaining pixels one lane at a time (the same code, so the same values).
template <class C, int W, class Policy>
void run_calc_as(const Policy& policy, const CalcLaunch& launch) {
  const std::int64_t groups = launch.pixels / W;
  const std::int64_t rest = launch.pixels - groups * W;
  thrust::counting_iterator<long long> zero(0);
  if (groups > 0) thrust::for_each(policy, zero, zero + groups, CalcEval<C, W>{launch, 0});
  if (rest > 0) thrust::for_each(policy, zero, zero + rest, CalcEval<C, 1>{launch, groups * W});
}

template <int W, class Policy>
void run_calc(const Policy& policy, const CalcLaunch& launch) {
  if (launch.compute_float32) {
    run_calc_as<float, W>(policy, launch);
  } else {
    run_calc_as<double, W>(policy, launch);
  }
}

}  // namespace vibespatial::raster::detail::ops::calc
