// SPDX-License-Identifier: Apache-2.0
// Band math (calc): the expression compiler. Parses expressions (our own recursive-descent
// parser, depth-bounded; never an evaluator of host code), resolves input names and bands, folds
// constants and lowers each expression to the evaluator's register program (calc_program.hpp),
// once per compute type. Plain C++: the facade (ops.cpp) and CalcProgram use it.
#pragma once

#include "ops/calc_program.hpp"

#include <vibespatial/raster/ops.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace vibespatial::raster::detail {

/// The deepest nesting an expression may have: parentheses, function calls, unary operators,
/// `?:` branches and exponents each open a level. The parser recurses once per level, so this
/// bounds its stack (a few KiB per level even in sanitizer builds).
inline constexpr int kCalcMaxDepth = 256;

/// One band an expression reads.
struct CalcSlotRef {
  int input = 0;  ///< index into CalcCompiled::inputs
  int band = 1;   ///< 1-based band of that input
};

/// A lowered program: instructions and constants for one compute type.
struct CalcCode {
  std::vector<ops::CalcInstr> code;
  std::vector<double> constants;
  int registers = 0;
};

/// What compile_calc produces (CalcProgram holds it).
struct CalcCompiled {
  std::vector<std::string> expressions;
  std::vector<CalcInputBands> inputs;
  std::vector<CalcBandUse> bands_read;  ///< per input, in inputs' order
  std::vector<CalcSlotRef> slots;       ///< every band read, in order of first use
  CalcCode f64, f32;                    ///< the program computing in float64 / float32
};

/// Compiles @p expressions; errors (std::invalid_argument) start with "<who>: ".
CalcCompiled compile_calc_expressions(const char* who, const std::vector<std::string>& expressions,
                                      const std::vector<CalcInputBands>& inputs);

/// The facade's way into CalcProgram.
struct CalcAccess {
  static CalcProgram make(CalcCompiled compiled);
  static const CalcCompiled* get(const CalcProgram& program) { return program.impl_.get(); }
};

}  // namespace vibespatial::raster::detail
