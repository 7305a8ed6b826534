// SPDX-License-Identifier: Apache-2.0
// Band math's constant folding against its pixels: every operator and function, spelled every
// way the grammar allows, evaluated on constants (folded when compiled) and on pixels holding
// the same values (run by the evaluator), over the values where implementations part: signed
// zeros, infinities, NaN, negatives, tiny and huge values, in both compute types and from every
// input dtype. docs/band-math.md: constant subexpressions are computed "by the same code".
#include "ops/calc_program.hpp"
#include "ops/expression.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/ops.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

using namespace vibespatial::raster;

namespace {

/// An expression with placeholders {a}, {b}, {c}. The operands in `pixels` become bands A, B, C
/// in the pixel form; the others (the exponent of `**`, which decides numpy's fast paths when
/// compiled) stay literals in both forms.
struct Case {
  const char* text;
  int operands;
  int pixels;  ///< the first `pixels` operands are bands in the pixel form
};

// clang-format off
const Case kCases[] = {
    {"-{a}", 1, 1}, {"+{a}", 1, 1}, {"!{a}", 1, 1}, {"not {a}", 1, 1},
    {"logical_not({a})", 1, 1},
    {"abs({a})", 1, 1}, {"absolute({a})", 1, 1}, {"fabs({a})", 1, 1}, {"sqrt({a})", 1, 1},
    {"exp({a})", 1, 1}, {"log({a})", 1, 1}, {"ln({a})", 1, 1}, {"log10({a})", 1, 1},
    {"sin({a})", 1, 1}, {"cos({a})", 1, 1}, {"tan({a})", 1, 1},
    {"asin({a})", 1, 1}, {"arcsin({a})", 1, 1}, {"acos({a})", 1, 1}, {"arccos({a})", 1, 1},
    {"atan({a})", 1, 1}, {"arctan({a})", 1, 1},
    {"floor({a})", 1, 1}, {"ceil({a})", 1, 1}, {"round({a})", 1, 1}, {"rint({a})", 1, 1},
    {"isnan({a})", 1, 1}, {"isinf({a})", 1, 1},
    {"{a} + {b}", 2, 2}, {"{a} - {b}", 2, 2}, {"{a} * {b}", 2, 2}, {"{a} / {b}", 2, 2},
    {"pow({a}, {b})", 2, 2}, {"power({a}, {b})", 2, 2},
    {"{a} ** {b}", 2, 1}, {"{a} ^ {b}", 2, 1},  // the exponent a literal: the fast paths
    {"atan2({a}, {b})", 2, 2}, {"arctan2({a}, {b})", 2, 2},
    {"min({a}, {b})", 2, 2}, {"minimum({a}, {b})", 2, 2},
    {"max({a}, {b})", 2, 2}, {"maximum({a}, {b})", 2, 2},
    {"{a} < {b}", 2, 2}, {"{a} <= {b}", 2, 2}, {"{a} > {b}", 2, 2}, {"{a} >= {b}", 2, 2},
    {"{a} == {b}", 2, 2}, {"{a} != {b}", 2, 2},
    {"{a} && {b}", 2, 2}, {"{a} || {b}", 2, 2}, {"{a} and {b}", 2, 2}, {"{a} or {b}", 2, 2},
    {"logical_and({a}, {b})", 2, 2}, {"logical_or({a}, {b})", 2, 2},
    {"{a} ? {b} : {c}", 3, 3}, {"where({a}, {b}, {c})", 3, 3},
    {"min({a}, {b}, {c})", 3, 3}, {"max({a}, {b}, {c})", 3, 3},
};
// clang-format on

/// The values where implementations part, as doubles (each is exact in float32 too, except where
/// float32 makes it 0 or inf, which is then the float32 value tested).
const double kSpecials[] = {0.0,
                            -0.0,
                            std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN(),
                            1.0,
                            -1.0,
                            0.5,
                            -0.5,
                            2.0,
                            -2.5,
                            3.0,
                            0.1,
                            -7.25,
                            1e-300,
                            1e-40,
                            3.4028234663852886e38,
                            1e300,
                            -1e300};

/// The exponents whose `**` numpy (and calc) treats apart, and some that it does not.
const double kExponents[] = {2.0, 0.5, -1.0, 1.0, 0.0, -0.0, 3.0, -0.5, 2.5};

/// A smaller set for three operands (19^3 combinations would be slow in a debug build).
const double kTernary[] = {0.0,  -0.0, std::numeric_limits<double>::infinity(),
                           -2.5, 1.0,  std::numeric_limits<double>::quiet_NaN()};

/// `v` as a literal of the expression language that gives exactly `v` in the compute type.
std::string literal(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "(-inf)";
  if (v == 0) return std::signbit(v) ? "(-0.0)" : "0.0";
  char buf[64];
  std::snprintf(buf, sizeof buf, v < 0 ? "(%.17g)" : "%.17g", v);
  return buf;
}

std::string substitute(std::string text, const std::string (&with)[3]) {
  const char* names[3] = {"{a}", "{b}", "{c}"};
  for (int k = 0; k < 3; ++k) {
    for (std::size_t at = text.find(names[k]); at != std::string::npos;
         at = text.find(names[k], at + with[k].size())) {
      text.replace(at, 3, with[k]);
    }
  }
  return text;
}

/// Equal as values of the output: both NaN, or the same bits (so -0.0 is not +0.0).
bool same(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, sizeof a) == 0;
}

/// `v` as the compute type sees it.
double in_compute(double v, bool f32) {
  return f32 ? static_cast<double>(static_cast<float>(v)) : v;
}

/// A one-row raster of `dtype` holding `values` (each converted to the dtype).
OwnedRasterArray row(const std::vector<double>& values, DType dtype) {
  std::vector<unsigned char> bytes(values.size() * itemsize(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    unsigned char* at = bytes.data() + i * itemsize(dtype);
    const double v = values[i];
    switch (dtype) {
#define VSR_PUT(D, T)              \
  case DType::D: {                 \
    const T x = static_cast<T>(v); \
    std::memcpy(at, &x, sizeof x); \
    break;                         \
  }
      VSR_PUT(uint8, std::uint8_t)
      VSR_PUT(int8, std::int8_t)
      VSR_PUT(uint16, std::uint16_t)
      VSR_PUT(int16, std::int16_t)
      VSR_PUT(uint32, std::uint32_t)
      VSR_PUT(int32, std::int32_t)
      VSR_PUT(uint64, std::uint64_t)
      VSR_PUT(int64, std::int64_t)
      VSR_PUT(float32, float)
      VSR_PUT(float64, double)
#undef VSR_PUT
    }
  }
  return OwnedRasterArray::from_host(bytes.data(), dtype, 1, 1,
                                     static_cast<std::int64_t>(values.size()));
}

std::vector<double> values_of(const OwnedRasterArray& r) {
  std::vector<double> out(static_cast<std::size_t>(r.band_count() * r.height() * r.width()));
  r.copy_to_host(out.data());
  return out;
}

/// Checks `c` on every combination of `values` for its pixel operands (inputs of `dtype`) and
/// of `literals` for the others: folded (every operand a literal) against the pixel form.
/// Returns the number of combinations compared.
std::size_t check_case(const Case& c, bool f32, DType dtype, const std::vector<double>& values,
                       const std::vector<double>& literals) {
  CalcOptions opt;
  opt.output = DType::float64;
  opt.compute_float32 = f32;
  opt.propagate_nodata = false;  // NaN inputs go through the expression, as a NaN literal does
  const int pixel_operands = c.pixels;
  const int literal_operands = c.operands - c.pixels;
  std::size_t combos = 1;
  for (int k = 0; k < pixel_operands; ++k) combos *= values.size();
  const std::size_t literal_combos = literal_operands == 0 ? 1 : literals.size();
  std::size_t compared = 0;
  for (std::size_t l = 0; l < literal_combos; ++l) {
    // The pixel form: bands A, B, C holding every combination, literals for the rest.
    std::vector<double> operand[3];
    for (std::size_t i = 0; i < combos; ++i) {
      std::size_t rest = i;
      for (int k = 0; k < pixel_operands; ++k) {
        operand[k].push_back(values[rest % values.size()]);
        rest /= values.size();
      }
    }
    std::string pixel_text[3] = {"A", "B", "C"};
    for (int k = pixel_operands; k < c.operands; ++k) pixel_text[k] = literal(literals[l]);
    std::vector<CalcInput> inputs;
    const char* names[3] = {"A", "B", "C"};
    for (int k = 0; k < pixel_operands; ++k) {
      inputs.push_back({names[k], row(operand[k], dtype)});
    }
    const std::string pixel_expr = substitute(c.text, pixel_text);
    const std::vector<double> by_pixel = values_of(calc({pixel_expr}, inputs, opt));
    // The folded form: one expression per combination, every operand a literal.
    std::vector<std::string> folded_exprs;
    for (std::size_t i = 0; i < combos; ++i) {
      std::string text[3];
      for (int k = 0; k < pixel_operands; ++k) text[k] = literal(operand[k][i]);
      for (int k = pixel_operands; k < c.operands; ++k) text[k] = literal(literals[l]);
      folded_exprs.push_back(substitute(c.text, text));
    }
    const std::vector<double> by_fold =
        values_of(calc(folded_exprs, {{"A", row({0.0}, DType::float64)}}, opt));
    REQUIRE(by_fold.size() == combos);
    REQUIRE(by_pixel.size() == combos);
    for (std::size_t i = 0; i < combos; ++i) {
      if (same(by_fold[i], by_pixel[i])) continue;
      CAPTURE(pixel_expr);
      CAPTURE(folded_exprs[i]);
      CAPTURE(f32);
      const std::string dtype_name(to_string(dtype));
      CAPTURE(dtype_name);
      FAIL_CHECK("folded " << by_fold[i] << " but pixels give " << by_pixel[i]);
    }
    compared += combos;
  }
  return compared;
}

std::vector<double> in_compute(const double* begin, const double* end, bool f32) {
  std::vector<double> out;
  for (const double* p = begin; p != end; ++p) out.push_back(in_compute(*p, f32));
  return out;
}

}  // namespace

TEST_SUITE("ops") {
  TEST_CASE("calc: the cases below spell every operation of the evaluator") {
    std::set<int> seen;
    for (const Case& c : kCases) {
      const std::string text[3] = {"A", "B", "C"};
      std::string expr = substitute(c.text, text);
      if (c.pixels < c.operands) {
        // `**` with each exponent that has a path of its own, and one that has none.
        for (double e : kExponents) {
          const std::string with[3] = {"A", literal(e), "C"};
          const detail::CalcCompiled compiled = detail::compile_calc_expressions(
              "test", {substitute(c.text, with)}, {{"A", 1}, {"B", 1}, {"C", 1}});
          for (const auto& in : compiled.f64.code) seen.insert(static_cast<int>(in.op));
        }
        continue;
      }
      const detail::CalcCompiled compiled =
          detail::compile_calc_expressions("test", {expr}, {{"A", 1}, {"B", 1}, {"C", 1}});
      for (const auto& in : compiled.f64.code) seen.insert(static_cast<int>(in.op));
    }
    using detail::ops::CalcOp;
    for (int op = static_cast<int>(CalcOp::neg); op <= static_cast<int>(CalcOp::select); ++op) {
      CAPTURE(op);
      CHECK(seen.count(op) == 1);
    }
  }

  TEST_CASE("calc: constants fold to what the same values give as pixels") {
    // The edges named in docs/band-math.md first: (-inf) ** 0.5 is NaN and (-0.0) ** 0.5 is
    // -0.0, folded or not (numpy's sqrt fast path), where pow() gives +inf and +0.
    CalcOptions opt;
    opt.output = DType::float64;
    const OwnedRasterArray one = row({0.0}, DType::float64);
    const std::vector<double> edges = values_of(calc(
        {"(-inf) ** 0.5", "(-0.0) ** 0.5", "pow(-inf, 0.5)", "(-0.0) ^ 0.5"}, {{"A", one}}, opt));
    CHECK(std::isnan(edges[0]));
    CHECK(edges[1] == 0.0);
    CHECK(std::signbit(edges[1]));
    CHECK(edges[2] == INFINITY);
    CHECK(std::signbit(edges[3]));

    std::size_t compared = 0;
    for (const bool f32 : {false, true}) {
      const DType input = f32 ? DType::float32 : DType::float64;
      const std::vector<double> specials =
          in_compute(std::begin(kSpecials), std::end(kSpecials), f32);
      const std::vector<double> ternary = in_compute(std::begin(kTernary), std::end(kTernary), f32);
      const std::vector<double> exponents =
          in_compute(std::begin(kExponents), std::end(kExponents), f32);
      for (const Case& c : kCases) {
        CAPTURE(c.text);
        const bool three = c.operands == 3;
        compared += check_case(c, f32, input, three ? ternary : specials, exponents);
      }
    }
    CHECK(compared > 10000);
  }

  TEST_CASE("calc: constants fold to what integer pixels of every dtype give") {
    // Integer inputs: zero, negatives and each dtype's limits, converted to the compute type when
    // read as a literal is when compiled.
    const DType dtypes[] = {DType::uint8,  DType::int8,  DType::uint16, DType::int16,
                            DType::uint32, DType::int32, DType::uint64, DType::int64};
    const double exponents[] = {2.0, 0.5, -1.0, 1.0, 3.0};
    for (const DType dtype : dtypes) {
      double lo = 0, hi = 0;
      switch (dtype) {
        case DType::uint8:
          hi = 255;
          break;
        case DType::int8:
          lo = -128, hi = 127;
          break;
        case DType::uint16:
          hi = 65535;
          break;
        case DType::int16:
          lo = -32768, hi = 32767;
          break;
        case DType::uint32:
          hi = 4294967295.0;
          break;
        case DType::int32:
          lo = -2147483648.0, hi = 2147483647.0;
          break;
        case DType::uint64:
          hi = 18446744073709551616.0 / 2;
          break;  // 2^63: exact in both types
        case DType::int64:
          lo = -9223372036854775808.0, hi = 4611686018427387904.0;
          break;
        default:
          break;
      }
      std::vector<double> values{0, 1, 2, 3, 100, hi};
      if (lo < 0) values.insert(values.end(), {-1, -3, lo});
      for (const bool f32 : {false, true}) {
        for (const Case& c : kCases) {
          if (c.operands == 3) continue;  // the float cases cover select, min and max of three
          CAPTURE(c.text);
          const std::string dtype_name(to_string(dtype));
          CAPTURE(dtype_name);
          // Each literal is the integer as a double; the compute type then rounds it as it rounds
          // the pixel.
          (void)check_case(c, f32, dtype, values,
                           std::vector<double>(std::begin(exponents), std::end(exponents)));
        }
      }
    }
  }
}
