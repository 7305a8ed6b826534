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

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

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

/// The registers @p code names: one more than the highest register any instruction reads or
/// writes (unused operand fields are 0), so at least 1. The compiler's CalcCode::registers for
/// the programs it writes; the device sizes each thread's registers by it.
inline int calc_registers_used(const CalcInstr* code, int code_size) {
  int highest = 0;
  for (int i = 0; i < code_size; ++i) {
    const CalcInstr& in = code[i];
    for (const std::uint8_t r : {in.dst, in.a, in.b, in.c}) highest = r > highest ? r : highest;
  }
  return highest + 1;
}

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

/// A launch's tables (instructions, constants, slots, outputs) packed into one buffer, each at a
/// 16-byte aligned offset, for a device backend to copy in one piece: the pixels stay where they
/// are, the tables go where the device reads them.
struct CalcTables {
  std::vector<unsigned char> bytes;
  std::size_t at_constants = 0, at_slots = 0, at_outputs = 0;

  explicit CalcTables(const CalcLaunch& launch) {
    const auto aligned = [](std::size_t n) { return (n + 15) / 16 * 16; };
    const std::size_t code = sizeof(CalcInstr) * static_cast<std::size_t>(launch.code_size);
    const std::size_t constants = sizeof(double) * static_cast<std::size_t>(launch.constant_count);
    const std::size_t slots = sizeof(CalcSlot) * static_cast<std::size_t>(launch.slot_count);
    const std::size_t outputs =
        sizeof(CalcOutputBand) * static_cast<std::size_t>(launch.output_count);
    at_constants = aligned(code);
    at_slots = at_constants + aligned(constants);
    at_outputs = at_slots + aligned(slots);
    bytes.assign(at_outputs + aligned(outputs), 0);
    const auto put = [&](std::size_t at, const void* src, std::size_t n) {
      if (n > 0) std::memcpy(bytes.data() + at, src, n);
    };
    put(0, launch.code, code);
    put(at_constants, launch.constants, constants);
    put(at_slots, launch.slots, slots);
    put(at_outputs, launch.outputs, outputs);
  }

  /// @p launch with its tables read from @p base, where a copy of `bytes` lives.
  CalcLaunch at(const CalcLaunch& launch, const void* base) const {
    const auto* b = static_cast<const unsigned char*>(base);
    CalcLaunch out = launch;
    out.code = reinterpret_cast<const CalcInstr*>(b);
    out.constants = reinterpret_cast<const double*>(b + at_constants);
    out.slots = reinterpret_cast<const CalcSlot*>(b + at_slots);
    out.outputs = reinterpret_cast<const CalcOutputBand*>(b + at_outputs);
    return out;
  }
};

}  // namespace vibespatial::raster::detail::ops
