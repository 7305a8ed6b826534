// SPDX-License-Identifier: Apache-2.0
// Band math (calc): the compiled form of an expression as the backends run it. Plain C++, no
// templates: the compiler (expression.cpp) writes it, the facade (ops.cpp) binds it to rasters,
// the evaluator (calc_eval.hpp, in ops_host.cpp and ops_cuda.cu) runs it.
//
// Glossary
// - program: the instructions of every expression, one after another; expression k ends with a
//   store to output band k. One pass over the pixels runs it all.
// - register: one value per pixel (per lane on the host); an instruction reads up to three
//   registers and writes one that is none of them (so the host's lane loops never alias).
// - slot: one band of one input that the program reads (loads convert it to the compute type).
// - mask: per pixel, whether every band the current expression loaded so far was valid; a store
//   writes the output's nodata where it is false (nodata propagation) and resets it.
#pragma once

#include <vibespatial/raster/buffers.hpp>

#include <cstdint>

namespace vibespatial::raster::detail::ops {

/// The most registers a program may use; a program needing more is refused when compiled. A
/// tree of n leaves needs about log2(n) + 2, so even 1 MB expressions stay well below it.
inline constexpr int kCalcMaxRegisters = 32;

/// Instructions. Unary ops read `a`, binary ops `a` and `b`, select reads `a` (the condition),
/// `b` (taken where a != 0, NaN included) and `c`.
enum class CalcOp : std::uint8_t {
  // leaves and the end of an expression
  load,      ///< dst = slot[arg] converted to the compute type; mask &= valid (when propagating)
  constant,  ///< dst = constants[arg] (as the compute type)
  store,     ///< output band arg = a converted to its dtype, or its nodata; mask reset
  // unary
  neg,
  logical_not,
  abs,
  sqrt,
  exp,
  log,
  log10,
  sin,
  cos,
  tan,
  asin,
  acos,
  atan,
  floor,
  ceil,
  round,  ///< to nearest, halves to even (numpy's round / rint)
  isnan,
  isinf,
  square,      ///< a * a (x ** 2, as numpy's ** computes it)
  reciprocal,  ///< 1 / a (x ** -1, as numpy's **)
  // binary
  add,
  sub,
  mul,
  div,
  pow,
  atan2,
  min,  ///< NaN if either is NaN (numpy.minimum)
  max,  ///< NaN if either is NaN (numpy.maximum)
  lt,
  le,
  gt,
  ge,
  eq,
  ne,
  logical_and,
  logical_or,
  // ternary
  select,
};

/// One instruction: 8 bytes.
struct CalcInstr {
  CalcOp op = CalcOp::constant;
  std::uint8_t dst = 0, a = 0, b = 0;
  std::uint8_t c = 0;
  std::uint8_t reserved[3] = {0, 0, 0};
  std::int32_t arg = 0;  ///< load: slot; constant: index into the constants; store: output band
};

/// One input band a program reads, as the backend sees it.
struct CalcSlot {
  const void* data = nullptr;  ///< the band's first pixel (host or device memory)
  DType dtype = DType::float32;
  bool has_nodata = false;   ///< compare with `nodata` (float NaN pixels are always invalid)
  std::uint64_t nodata = 0;  ///< the sentinel as a value of `dtype`, in the low bytes
};

/// One output band.
struct CalcOutputBand {
  void* data = nullptr;
  DType dtype = DType::float32;
  std::uint64_t nodata = 0;  ///< the output's nodata as a value of `dtype`, in the low bytes
};

/// Everything one evaluation needs. The pointers are host memory when handed to a backend; the
/// device backend copies the tables (not the pixels) to the device first.
struct CalcLaunch {
  const CalcInstr* code = nullptr;
  int code_size = 0;
  const double* constants = nullptr;
  int constant_count = 0;
  const CalcSlot* slots = nullptr;
  int slot_count = 0;
  const CalcOutputBand* outputs = nullptr;
  int output_count = 0;
  std::int64_t pixels = 0;  ///< pixels per band
  bool compute_float32 = false;
  bool propagate_nodata = true;
};

}  // namespace vibespatial::raster::detail::ops
