// SPDX-License-Identifier: Apache-2.0
// Band math (calc): what each instruction computes on one value, for the compute type C (float
// or double). Written once: the evaluator (calc_eval.hpp) runs these on every pixel on both
// backends, and the compiler (expression.cpp) folds constant subexpressions with the same code.
// Included by expression.cpp, ops_host.cpp and ops_cuda.cu only.
#pragma once

#include "ops/calc_program.hpp"

#include <cuda/std/limits>

#include <cmath>

#if !defined(VSR_HD)
#if defined(__CUDACC__)
#define VSR_HD __host__ __device__
#else
#define VSR_HD
#endif
#endif

namespace vibespatial::raster::detail::ops::calc {

// The C library's functions for float (the f-suffixed ones) and double: the same names on the
// host (glibc) and the device (CUDA's math library).
#define VSR_CALC_MATH1(name)        \
  template <class C>                \
  VSR_HD inline C m_##name(C x) {   \
    if constexpr (sizeof(C) == 4) { \
      return name##f(x);            \
    } else {                        \
      return name(x);               \
    }                               \
  }
VSR_CALC_MATH1(fabs)
VSR_CALC_MATH1(sqrt)
VSR_CALC_MATH1(exp)
VSR_CALC_MATH1(log)
VSR_CALC_MATH1(log10)
VSR_CALC_MATH1(sin)
VSR_CALC_MATH1(cos)
VSR_CALC_MATH1(tan)
VSR_CALC_MATH1(asin)
VSR_CALC_MATH1(acos)
VSR_CALC_MATH1(atan)
VSR_CALC_MATH1(floor)
VSR_CALC_MATH1(ceil)
VSR_CALC_MATH1(rint)
#undef VSR_CALC_MATH1

#define VSR_CALC_MATH2(name)           \
  template <class C>                   \
  VSR_HD inline C m_##name(C x, C y) { \
    if constexpr (sizeof(C) == 4) {    \
      return name##f(x, y);            \
    } else {                           \
      return name(x, y);               \
    }                                  \
  }
VSR_CALC_MATH2(pow)
VSR_CALC_MATH2(atan2)
#undef VSR_CALC_MATH2

template <class C>
VSR_HD inline C truth(bool b) {
  return b ? C(1) : C(0);
}

template <class C>
VSR_HD inline C infinity() {
  return cuda::std::numeric_limits<C>::infinity();
}

// The operations as X-macros: X(op, expression of a [, b [, c]] in C). Comparisons and logic give
// 1 or 0; a value is true when it is not 0 (NaN is true, as in C and numpy). round is rint in the
// default rounding mode: halves to even, as numpy.round. min/max propagate NaN (numpy.minimum).
// clang-format off
#define VSR_CALC_UNARY_OPS(X)                                        \
  X(neg, -a)                                                         \
  X(logical_not, truth<C>(a == C(0)))                                \
  X(abs, m_fabs(a))                                                  \
  X(sqrt, m_sqrt(a))                                                 \
  X(exp, m_exp(a))                                                   \
  X(log, m_log(a))                                                   \
  X(log10, m_log10(a))                                               \
  X(sin, m_sin(a))                                                   \
  X(cos, m_cos(a))                                                   \
  X(tan, m_tan(a))                                                   \
  X(asin, m_asin(a))                                                 \
  X(acos, m_acos(a))                                                 \
  X(atan, m_atan(a))                                                 \
  X(floor, m_floor(a))                                               \
  X(ceil, m_ceil(a))                                                 \
  X(round, m_rint(a))                                                \
  X(isnan, truth<C>(a != a))                                         \
  X(isinf, truth<C>((a == infinity<C>()) || (a == -infinity<C>())))  \
  X(square, a * a)                                                   \
  X(reciprocal, C(1) / a)

#define VSR_CALC_BINARY_OPS(X)                                       \
  X(add, a + b)                                                      \
  X(sub, a - b)                                                      \
  X(mul, a * b)                                                      \
  X(div, a / b)                                                      \
  X(pow, m_pow(a, b))                                                \
  X(atan2, m_atan2(a, b))                                            \
  X(min, (a != a) ? a : ((a < b) ? a : b))                           \
  X(max, (a != a) ? a : ((a > b) ? a : b))                           \
  X(lt, truth<C>(a < b))                                             \
  X(le, truth<C>(a <= b))                                            \
  X(gt, truth<C>(a > b))                                             \
  X(ge, truth<C>(a >= b))                                            \
  X(eq, truth<C>(a == b))                                            \
  X(ne, truth<C>(a != b))                                            \
  X(logical_and, truth<C>((a != C(0)) && (b != C(0))))               \
  X(logical_or, truth<C>((a != C(0)) || (b != C(0))))

#define VSR_CALC_TERNARY_OPS(X)                                      \
  X(select, (a != C(0)) ? b : c)
// clang-format on

// One functor per operation (Op_add, ...), usable in host and device loops alike.
#define VSR_CALC_UNARY_FUNCTOR(name, expr) \
  struct Op_##name {                       \
    template <class C>                     \
    VSR_HD C operator()(C a) const {       \
      return expr;                         \
    }                                      \
  };
#define VSR_CALC_BINARY_FUNCTOR(name, expr) \
  struct Op_##name {                        \
    template <class C>                      \
    VSR_HD C operator()(C a, C b) const {   \
      return expr;                          \
    }                                       \
  };
#define VSR_CALC_TERNARY_FUNCTOR(name, expr)   \
  struct Op_##name {                           \
    template <class C>                         \
    VSR_HD C operator()(C a, C b, C c) const { \
      return expr;                             \
    }                                          \
  };
VSR_CALC_UNARY_OPS(VSR_CALC_UNARY_FUNCTOR)
VSR_CALC_BINARY_OPS(VSR_CALC_BINARY_FUNCTOR)
VSR_CALC_TERNARY_OPS(VSR_CALC_TERNARY_FUNCTOR)
#undef VSR_CALC_UNARY_FUNCTOR
#undef VSR_CALC_BINARY_FUNCTOR
#undef VSR_CALC_TERNARY_FUNCTOR

/// Whether @p op reads one, two or three registers (0 for load, constant and store).
constexpr int operand_count(CalcOp op) {
  switch (op) {
#define VSR_CALC_COUNT(name, expr) case CalcOp::name:
    VSR_CALC_UNARY_OPS(VSR_CALC_COUNT)
    return 1;
    VSR_CALC_BINARY_OPS(VSR_CALC_COUNT)
    return 2;
    VSR_CALC_TERNARY_OPS(VSR_CALC_COUNT)
    return 3;
#undef VSR_CALC_COUNT
    default:
      return 0;
  }
}

/// @p op on one value of each operand (unused ones ignored): constant folding. Load, constant
/// and store give a.
template <class C>
C apply(CalcOp op, C a, C b, C c) {
  (void)b, (void)c;
  switch (op) {
#define VSR_CALC_APPLY1(name, expr) \
  case CalcOp::name:                \
    return Op_##name{}(a);
#define VSR_CALC_APPLY2(name, expr) \
  case CalcOp::name:                \
    return Op_##name{}(a, b);
#define VSR_CALC_APPLY3(name, expr) \
  case CalcOp::name:                \
    return Op_##name{}(a, b, c);
    VSR_CALC_UNARY_OPS(VSR_CALC_APPLY1)
    VSR_CALC_BINARY_OPS(VSR_CALC_APPLY2)
    VSR_CALC_TERNARY_OPS(VSR_CALC_APPLY3)
#undef VSR_CALC_APPLY1
#undef VSR_CALC_APPLY2
#undef VSR_CALC_APPLY3
    default:
      return a;
  }
}

}  // namespace vibespatial::raster::detail::ops::calc
