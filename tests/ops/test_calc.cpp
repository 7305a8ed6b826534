// SPDX-License-Identifier: Apache-2.0
// Band math (calc) on the host: the compiler's errors (each with its column and caret), limits
// (deep nesting, 1 MB expressions), what compile_calc reports, and calc's argument checks. The
// values of expressions are checked against a reference in calc_cases.cpp.
#include "ops/expression.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/ops.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace vibespatial::raster;

namespace {

const std::vector<CalcInputBands> kShapes{{"A", 4}, {"B", 1}, {"nir", 1}};

/// The message compile_calc throws for @p exprs (empty when it compiles).
std::string error_of(const std::vector<std::string>& exprs,
                     const std::vector<CalcInputBands>& shapes = kShapes) {
  try {
    (void)compile_calc(exprs, shapes);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

/// The column the caret line points at (1-based), from the message's third line.
std::size_t caret_column(const std::string& msg) {
  const std::size_t l1 = msg.find('\n');
  const std::size_t l2 = msg.find('\n', l1 + 1);
  if (l1 == std::string::npos || l2 == std::string::npos) return 0;
  const std::string caret = msg.substr(l2 + 1);
  const std::size_t at = caret.find('^');
  return at == std::string::npos ? 0 : at - 2 + 1;  // the lines are indented by two spaces
}

/// Checks the first line of the error for @p expr, and that the caret is under its column.
void check_error(const std::string& expr, const std::string& want) {
  CAPTURE(expr);
  const std::string msg = error_of({expr});
  REQUIRE_MESSAGE(!msg.empty(), "compiled without error");
  CHECK(first_line(msg) == want);
  // "... at column N": the caret points at column N of the shown line (short expressions are
  // shown whole).
  const std::size_t pos = msg.rfind(" at column ", msg.find('\n'));
  REQUIRE(pos != std::string::npos);
  const std::size_t column = std::stoul(msg.substr(pos + 11));
  if (expr.size() < 60) CHECK(caret_column(msg) == column);
}

OwnedRasterArray raster(int bands, std::int64_t h, std::int64_t w, DType dt = DType::float32,
                        std::optional<double> nodata = {}, Affine af = {}, std::string crs = {}) {
  std::vector<unsigned char> bytes(static_cast<std::size_t>(bands * h * w) * itemsize(dt), 0);
  return OwnedRasterArray::from_host(bytes.data(), dt, bands, h, w, nodata, af, std::move(crs));
}

std::string calc_error(const std::vector<std::string>& exprs, const std::vector<CalcInput>& in,
                       const CalcOptions& opt = {}) {
  try {
    (void)calc(exprs, in, opt);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_SUITE("ops") {
  TEST_CASE("calc errors: the message names the problem, its column and shows a caret") {
    const std::string msg = error_of({"A[1] + C"});
    CHECK(msg == "compile_calc: unknown name 'C' at column 8\n  A[1] + C\n         ^");
    // The one-call form says calc.
    const std::string via_calc = calc_error({"A[1] + C"}, {CalcInput{"A", raster(4, 2, 2)}});
    CHECK(first_line(via_calc) == "calc: unknown name 'C' at column 8");
  }

  TEST_CASE("calc errors: every kind, with its column") {
    check_error("", "compile_calc: empty expression at column 1");
    check_error("   ", "compile_calc: empty expression at column 1");
    check_error("(A[1] + 1",
                "compile_calc: expected ')' to close the '(' at column 1, found end "
                "of the expression at column 10");
    check_error("A[1] + 1)", "compile_calc: unmatched ')' at column 9");
    check_error("((B)",
                "compile_calc: expected ')' to close the '(' at column 1, found end of "
                "the expression at column 5");
    check_error("sqrt(B",
                "compile_calc: expected ',' or ')' in the call of sqrt() at column 1, "
                "found end of the expression at column 7");
    check_error("B + D", "compile_calc: unknown name 'D' at column 5");
    check_error("B + D @", "compile_calc: unknown name 'D' at column 5");
    check_error("A[0]",
                "compile_calc: band 0 of input 'A' does not exist (it has bands 1 to 4; "
                "bands are numbered from 1) at column 3");
    check_error("A[5] * 2",
                "compile_calc: band 5 of input 'A' does not exist (it has bands 1 to "
                "4; bands are numbered from 1) at column 3");
    check_error("B[2]",
                "compile_calc: band 2 of input 'B' does not exist (it has 1 band; bands "
                "are numbered from 1) at column 3");
    check_error("A[99999999999999999999999]",
                "compile_calc: band 99999999999999999999999 of input 'A' does not exist (it has "
                "bands 1 to 4; bands are numbered from 1) at column 3");
    check_error("1 + A",
                "compile_calc: input 'A' has 4 bands: name one, as A[1] to A[4] at "
                "column 5");
    check_error("A[1.5]",
                "compile_calc: a band of 'A' is a whole number, as in A[1], not number "
                "'1.5' at column 3");
    check_error("A[-1]",
                "compile_calc: a band of 'A' is a whole number, as in A[1], not '-' at "
                "column 3");
    check_error("A[1",
                "compile_calc: expected ']' after the band of 'A', found end of the "
                "expression at column 4");
    check_error("B B",
                "compile_calc: unexpected name 'B' after a complete expression at column "
                "3");
    check_error("B + 1 2",
                "compile_calc: unexpected number '2' after a complete expression at "
                "column 7");
    check_error("B +",
                "compile_calc: unexpected end of the expression (expected a value) at "
                "column 4");
    check_error("B * / 2", "compile_calc: unexpected '/' (expected a value) at column 5");
    check_error("sqrt(B, B)", "compile_calc: sqrt() takes 1 argument, not 2 at column 1");
    check_error("atan2(B)", "compile_calc: atan2() takes 2 arguments, not 1 at column 1");
    check_error("min(B)", "compile_calc: min() takes 2 or more arguments, not 1 at column 1");
    check_error("where(B, 1)", "compile_calc: where() takes 3 arguments, not 2 at column 1");
    check_error("sqrt()", "compile_calc: sqrt() takes 1 argument, not 0 at column 1");
    check_error("2 * sqrt",
                "compile_calc: function 'sqrt' needs its arguments in parentheses, "
                "as sqrt(...) at column 5");
    check_error("B(2)", "compile_calc: input 'B' is not a function at column 1");
    check_error("pi(2)", "compile_calc: 'pi' is a constant, not a function at column 1");
    check_error("B ? 1",
                "compile_calc: expected ':' for the '?' at column 3, found end of the "
                "expression at column 6");
    check_error("B : 1", "compile_calc: unexpected ':' after a complete expression at column 3");
    check_error("B = 1", "compile_calc: '=' is not an operator: compare with '==' at column 3");
    check_error("(B > 0) & (B < 9)",
                "compile_calc: '&' (numpy's bitwise and) is not an operator "
                "here: write '&&' or 'and' at column 9");
    check_error("B | 1",
                "compile_calc: '|' (numpy's bitwise or) is not an operator here: write "
                "'||' or 'or' at column 3");
    check_error("~B",
                "compile_calc: '~' (numpy's bitwise not) is not an operator here: write "
                "'!' or 'not' at column 1");
    check_error("B % 2", "compile_calc: '%' (remainder) is not an operator here at column 3");
    check_error("0 < B < 9",
                "compile_calc: chained comparison (Python would read it as two "
                "joined by 'and', C as the first result compared again): add "
                "parentheses at column 7");
    check_error("1e", "compile_calc: malformed number '1e' at column 1");
    check_error("2B", "compile_calc: malformed number '2B' at column 1");
    check_error("1.2.3", "compile_calc: malformed number '1.2.3' at column 1");
    check_error("B + 1e999",
                "compile_calc: number '1e999' is out of range for a float64 at "
                "column 5");
    check_error("B and",
                "compile_calc: unexpected end of the expression (expected a value) at "
                "column 6");
    check_error("B + not B",
                "compile_calc: unexpected keyword 'not' (expected a value) at "
                "column 5");
    check_error("B @ 2", "compile_calc: unexpected character '@' (U+0040) at column 3");
    check_error("B \xE2\x88\x92 2",  // U+2212 MINUS SIGN, a common paste
                "compile_calc: unexpected character '\xE2\x88\x92' (U+2212) at column 3");
    check_error("B\x01", "compile_calc: unexpected character '\\x01' (U+0001) at column 2");
  }

  TEST_CASE("calc errors: bytes that are not UTF-8 are escaped, columns count characters") {
    const std::string msg = error_of({"\xC3\xA9 + \xFF"});  // "é + " then a stray byte
    // é is one column: the stray byte is at column 5; the shown line escapes it as \xFF and the
    // caret sits under its backslash.
    CHECK(first_line(msg) == "compile_calc: unexpected character '\xC3\xA9' (U+00E9) at column 1");
    const std::string bad = error_of({"B + \xFF"});
    CHECK(bad == "compile_calc: invalid UTF-8 byte \\xFF at column 5\n  B + \\xFF\n      ^");
    const std::string after = error_of({"B + \xFF\xFE + C"});
    CHECK(first_line(after) == "compile_calc: invalid UTF-8 byte \\xFF at column 5");
    const std::string ctrl = error_of({"B +\n C"});
    CHECK(ctrl == "compile_calc: unknown name 'C' at column 6\n  B +\\n C\n        ^");
  }

  TEST_CASE("calc errors: several expressions say which one") {
    const std::string msg = error_of({"B + 1", "A[1] * 2", "A[9]"});
    CHECK(first_line(msg) ==
          "compile_calc: expression 3: band 9 of input 'A' does not exist (it "
          "has bands 1 to 4; bands are numbered from 1) at column 3");
    CHECK(error_of({}) == "compile_calc: no expressions");
  }

  TEST_CASE("calc errors: nesting 10,000 deep is refused early, without deep recursion") {
    for (const char* open : {"(", "-", "sqrt(", "!", "not ", "2**", "B?1:"}) {
      std::string e;
      for (int i = 0; i < 10000; ++i) e += open;
      e += "B";
      CAPTURE(open);
      const std::string msg = error_of({e});
      CHECK(first_line(msg).find("compile_calc: expression nested too deeply (more than 256 "
                                 "levels) at column ") == 0);
      // The window of a long expression is shown with "..." around it.
      CHECK(msg.find("\n  ...") != std::string::npos);
    }
    // 256 levels compile.
    std::string ok(256, '(');
    ok += "B";
    ok += std::string(256, ')');
    CHECK(error_of({ok}).empty());
  }

  TEST_CASE("calc: a 1 MB expression compiles in linear time and evaluates") {
    // A left-deep chain of 250,000 additions: as deep as it is long, so every pass over it must
    // be iterative (a recursive one would overflow the stack), and linear (a quadratic one
    // would not finish within the test's timeout).
    std::string e = "B";
    const int terms = 250000;
    for (int i = 1; i < terms; ++i) e += i % 2 ? " + B" : " - 0.5";
    REQUIRE(e.size() > 1000000);
    const CalcProgram p = compile_calc({e}, kShapes);
    CHECK(p.registers() <= 3);
    const std::vector<float> px{1, 2, 3};
    const OwnedRasterArray b = OwnedRasterArray::from_host(px.data(), DType::float32, 1, 1, 3);
    CalcOptions opt;
    opt.output = DType::float64;
    const OwnedRasterArray out = calc(p, {CalcInput{"B", b}}, opt);
    std::vector<double> got(3);
    out.copy_to_host(got.data());
    for (int k = 0; k < 3; ++k) {
      double want = px[static_cast<std::size_t>(k)];
      for (int i = 1; i < terms; ++i)
        want = i % 2 ? want + px[static_cast<std::size_t>(k)] : want - 0.5;
      CHECK(got[static_cast<std::size_t>(k)] == want);
    }
    // A balanced 1 MB tree needs about log2 of its size in registers.
    std::string t = "B";
    while (t.size() < 1000000) t = "(" + t + "*" + t + ")";
    const CalcProgram q = compile_calc({t}, kShapes);
    CHECK(q.registers() <= 24);
    // An error in a 1 MB expression reports its column and a short window.
    const std::string msg = error_of({e + " + C"});
    CHECK(first_line(msg) ==
          "compile_calc: unknown name 'C' at column " + std::to_string(e.size() + 4));
    CHECK(msg.size() < 400);
  }

  TEST_CASE("calc: the deep operand is evaluated first, so chains need few registers") {
    // where(B > i, B, <deeper>) 40 times: evaluated deepest first (Sethi-Ullman order), the
    // chain needs 4 registers (3 for the condition and the deep value held, 1 for the result).
    std::string deep = "B";
    for (int i = 0; i < 40; ++i) deep = "where(B > " + std::to_string(i) + ", B, " + deep + ")";
    CHECK(compile_calc({deep}, kShapes).registers() == 4);
    std::string right = "B";
    for (int i = 0; i < 200; ++i) right = "B - (" + right + ")";
    CHECK(compile_calc({right}, kShapes).registers() == 3);
  }

  TEST_CASE("calc: a program's register count is the registers its code names") {
    // The device sizes each thread's registers by calc_registers_used; the compiler's count
    // (CalcProgram::registers) must agree with it for both compute types.
    std::string tree = "B";
    for (int level = 0; level < 10; ++level) tree = "(" + tree + " * " + tree + ")";
    std::string deep = "B";
    for (int i = 0; i < 40; ++i) deep = "where(B > " + std::to_string(i) + ", B, " + deep + ")";
    for (const std::vector<std::string>& exprs : std::vector<std::vector<std::string>>{
             {"B"}, {"3"}, {tree}, {deep}, {"A[1] + 1", tree, "sqrt(A[2]) * nir - 2"}}) {
      const CalcProgram p = compile_calc(exprs, kShapes);
      const detail::CalcCompiled* c = detail::CalcAccess::get(p);
      REQUIRE(c != nullptr);
      for (const detail::CalcCode* code : {&c->f64, &c->f32}) {
        CHECK(detail::ops::calc_registers_used(
                  code->code.data(), static_cast<int>(code->code.size())) == code->registers);
      }
      CHECK(p.registers() == std::max(c->f64.registers, c->f32.registers));
    }
    CHECK(compile_calc({tree}, kShapes).registers() == 12);  // 10 levels: 10 + 2
  }

  TEST_CASE("compile_calc: bands read, per input, for a tiled reader") {
    const CalcProgram p = compile_calc({"(A[4] - A[3]) / (A[4] + A[3])", "A[1] * nir"}, kShapes);
    REQUIRE(p.valid());
    CHECK(p.expressions().size() == 2);
    REQUIRE(p.bands_read().size() == 3);
    CHECK(p.bands_read()[0].name == "A");
    CHECK(p.bands_read()[0].bands == std::vector<int>{1, 3, 4});
    CHECK(p.bands_read()[1].bands.empty());  // B is not read
    CHECK(p.bands_read("nir") == std::vector<int>{1});
    CHECK_THROWS_AS((void)p.bands_read("X"), std::invalid_argument);
    CHECK(p.registers() >= 1);
    CHECK(p.instruction_count() > 0);
    // A tile holding only the bands read, mapped with CalcInput::bands; B need not be given.
    std::vector<float> tile{2, 4, 1, 1, 3, 5};  // bands 1, 3, 4
    const OwnedRasterArray t = OwnedRasterArray::from_host(tile.data(), DType::float32, 3, 1, 2);
    std::vector<float> nir_px{10, 100};
    const OwnedRasterArray nir =
        OwnedRasterArray::from_host(nir_px.data(), DType::float32, 1, 1, 2);
    CalcOptions opt;
    opt.output = DType::float64;
    const OwnedRasterArray out =
        calc(p, {CalcInput{"A", t, {1, 3, 4}}, CalcInput{"nir", nir}}, opt);
    std::vector<double> got(4);
    out.copy_to_host(got.data());
    CHECK(got[0] == (3.0 - 1.0) / (3.0 + 1.0));
    CHECK(got[1] == (5.0 - 1.0) / (5.0 + 1.0));
    CHECK(got[2] == 20);
    CHECK(got[3] == 400);
    // A band read but not held, a map of the wrong length, a band beyond the count.
    CHECK(first_line([&] {
            try {
              (void)calc(p, {CalcInput{"A", t.band(0), {1}}, CalcInput{"nir", nir}});
            } catch (const std::invalid_argument& e) {
              return std::string(e.what());
            }
            return std::string();
          }()) ==
          "calc: input 'A' lacks band 4, which the expressions read (see "
          "CalcInput::bands)");
    CHECK_THROWS_WITH_AS(calc(p, {CalcInput{"A", t, {1, 3}}, CalcInput{"nir", nir}}),
                         "calc: input 'A' has 3 bands, but its CalcInput::bands lists 2",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(calc(p, {CalcInput{"A", t, {1, 3, 7}}, CalcInput{"nir", nir}}),
                         "calc: CalcInput::bands of 'A' lists band 7, not one of 1 to 4",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(calc(p, {CalcInput{"A", t, {1, 3, 3}}, CalcInput{"nir", nir}}),
                         "calc: CalcInput::bands of 'A' lists band 3 twice", std::invalid_argument);
    CHECK_THROWS_WITH_AS(calc(p, {CalcInput{"A", t}, CalcInput{"nir", nir}}),
                         "calc: input 'A' has 3 bands, the program was compiled for 4 (give "
                         "CalcInput::bands when it holds some of them)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(calc(p, {CalcInput{"A", t, {1, 3, 4}}}),
                         "calc: the expressions read input 'nir', which is not given",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        calc(p, {CalcInput{"A", t, {1, 3, 4}}, CalcInput{"nir", nir}, CalcInput{"Q", nir}}),
        "calc: input 'Q' is not one the program was compiled for", std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        calc(p, {CalcInput{"A", t, {1, 3, 4}}, CalcInput{"nir", nir}, CalcInput{"nir", nir}}),
        "calc: input 'nir' is given twice", std::invalid_argument);
    CHECK_THROWS_WITH_AS(calc(CalcProgram{}, {CalcInput{"nir", nir}}),
                         "calc: the program is empty (default-constructed)", std::invalid_argument);
    CHECK_THROWS_WITH_AS(calc(p, {}), "calc: no inputs (the output's size comes from them)",
                         std::invalid_argument);
  }

  TEST_CASE("calc: one program run from several threads at once gives one result") {
    const CalcProgram p = compile_calc({"sqrt(abs(A[1] - A[2])) * (A[3] > 0 ? 1 : -1)"}, kShapes);
    std::vector<float> px(4 * 64 * 65);
    for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<float>(i % 97) - 40.5f;
    const OwnedRasterArray a = OwnedRasterArray::from_host(px.data(), DType::float32, 4, 64, 65);
    std::vector<float> first(64 * 65);
    calc(p, {CalcInput{"A", a}}).copy_to_host(first.data());
    std::vector<int> same(8, 0);
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < same.size(); ++t) {
      threads.emplace_back([&, t] {
        std::vector<float> got(first.size());
        for (int k = 0; k < 5; ++k) {
          calc(p, {CalcInput{"A", a}}).copy_to_host(got.data());
          same[t] += got == first ? 1 : 0;
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int n : same) CHECK(n == 5);
  }

  TEST_CASE("compile_calc: input names are checked") {
    const std::vector<std::string> e{"1"};
    CHECK_THROWS_WITH_AS(compile_calc(e, {{"sqrt", 1}}),
                         "compile_calc: input name 'sqrt' is the name of a function",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(compile_calc(e, {{"nan", 1}}),
                         "compile_calc: input name 'nan' is the name of a constant",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(compile_calc(e, {{"and", 1}}),
                         "compile_calc: input name 'and' is a keyword", std::invalid_argument);
    CHECK_THROWS_WITH_AS(compile_calc(e, {{"1A", 1}}),
                         "compile_calc: input name '1A' is not a name (letters, digits and '_', "
                         "not starting with a digit)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(compile_calc(e, {{"", 1}}),
                         "compile_calc: input name '' is not a name (letters, digits and '_', "
                         "not starting with a digit)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(compile_calc(e, {{"a\xFF", 1}}),
                         "compile_calc: input name 'a\\xFF' is not a name (letters, digits and "
                         "'_', not starting with a digit)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(compile_calc(e, {{"A", 1}, {"A", 2}}),
                         "compile_calc: input name 'A' is given twice", std::invalid_argument);
    CHECK_THROWS_WITH_AS(compile_calc(e, {{"A", 0}}),
                         "compile_calc: input 'A' has 0 bands (at least 1)", std::invalid_argument);
    // Names are case-sensitive; the lower-case letters of gdal_calc.py are names too.
    CHECK(compile_calc({"a + A + _x1"}, {{"a", 1}, {"A", 1}, {"_x1", 1}}).valid());
  }

  TEST_CASE("calc: inputs must share size, residency, affine and CRS; the message names both") {
    const Affine af{10, 0, 100, 0, -10, 200};
    const OwnedRasterArray a = raster(1, 3, 4, DType::float32, {}, af, "EPSG:4326");
    CHECK(calc_error({"A + B"},
                     {{"A", a}, {"B", raster(1, 3, 5, DType::uint8, {}, af, "EPSG:4326")}}) ==
          "calc: inputs 'A' and 'B' differ in size (3 x 4 and 3 x 5, height x width)");
    CHECK(calc_error({"A + B"},
                     {{"A", a}, {"B", raster(1, 3, 4, DType::uint8, {}, Affine{}, "EPSG:4326")}}) ==
          "calc: inputs 'A' and 'B' differ in affine: (10, 0, 100, 0, -10, 200) and (1, 0, 0, 0, "
          "-1, 0)");
    CHECK(calc_error({"A + B"},
                     {{"A", a}, {"B", raster(1, 3, 4, DType::uint8, {}, af, "EPSG:3857")}}) ==
          "calc: inputs 'A' and 'B' differ in CRS (compared as text)");
    // An input no expression reads is checked too: the output's grid comes from all of them.
    CHECK(calc_error({"A"}, {{"A", a}, {"Z", raster(1, 3, 4)}}).find("inputs 'A' and 'Z' differ") !=
          std::string::npos);
    CHECK(calc_error({"A"}, {}) == "calc: no inputs (the output's size comes from them)");
    CalcOptions opt;
    opt.output = static_cast<DType>(99);
    CHECK(calc_error({"A"}, {{"A", a}}, opt) == "calc: the output dtype is not a DType");
  }

  TEST_CASE("the output-nodata rule: asked for, none, candidates in order, markers, fallback") {
    const NodataValue nan(NAN);
    CHECK(output_nodata(DType::uint8, OutputNodata::of(0.0), {}, false) == NodataValue(0.0));
    CHECK_FALSE(output_nodata(DType::uint8, OutputNodata::none(), {{5.0}}, true));
    CHECK_FALSE(output_nodata(DType::uint8, OutputNodata::by_rule(), {{5.0}}, false));
    CHECK(output_nodata(DType::uint8, {}, {{std::nullopt}, {-1.0}, {7.0}}, true) ==
          NodataValue(7.0));
    CHECK(output_nodata(DType::uint8, {}, {{-1.0}}, true) == NodataValue(255.0));
    // A value that only marks masked pixels: kept by an integer output, not by a float one.
    CHECK(output_nodata(DType::uint8, {}, {{NodataValue(255.0), true}}, true) ==
          NodataValue(255.0));
    CHECK(output_nodata(DType::float32, {}, {{NodataValue(255.0), true}}, true)->is_nan());
    CHECK(output_nodata(DType::float32, {}, {{NodataValue(255.0), false}}, true) ==
          NodataValue(255.0));
    CHECK(output_nodata(DType::int64, {}, {{NodataValue::from_int64(INT64_MAX)}}, true) ==
          NodataValue::from_int64(INT64_MAX));
    CHECK(default_nodata(DType::int16) == NodataValue(32767.0));
    CHECK(default_nodata(DType::float64).is_nan());
    CHECK_THROWS_AS(output_nodata(DType::uint8, OutputNodata::of(nan), {}, true),
                    std::invalid_argument);
    CHECK_THROWS_AS(output_nodata(DType::uint8, OutputNodata::of(256.0), {}, true),
                    std::invalid_argument);
  }

  TEST_CASE("convert_output: exact sentinels, valid values kept, no valid pixel as nodata") {
    const std::vector<std::int64_t> big{INT64_MAX - 1, 5, -1, 9007199254740993};
    const OwnedRasterArray r = OwnedRasterArray::from_host(big.data(), DType::int64, 1, 1, 4)
                                   .with_nodata(NodataValue(-1.0));
    // Same dtype: only the invalid pixel is rewritten, exactly, to a sentinel no double holds.
    const OwnedRasterArray t = convert_output(r, DType::int64, NodataValue::from_int64(INT64_MAX));
    CHECK(t.exact_nodata() == NodataValue::from_int64(INT64_MAX));
    std::vector<std::int64_t> got(4);
    t.copy_to_host(got.data());
    CHECK(got == std::vector<std::int64_t>{INT64_MAX - 1, 5, INT64_MAX, 9007199254740993});
    // A valid pixel equal to the nodata: refused.
    CHECK_THROWS_WITH_AS(convert_output(r, DType::int64, NodataValue(5.0)),
                         doctest::Contains("1 valid pixel(s) of band 1 convert to 5 (int64)"),
                         std::invalid_argument);
    // Converted: 300.4 saturates to 255, the uint8 nodata.
    const std::vector<float> f{1, 300.4F, -1, 2};
    const OwnedRasterArray g = OwnedRasterArray::from_host(f.data(), DType::float32, 1, 1, 4)
                                   .with_nodata(NodataValue(-1.0));
    CHECK_THROWS_WITH_AS(convert_output(g, DType::uint8, NodataValue(255.0)),
                         doctest::Contains("equal the output nodata"), std::invalid_argument);
    const OwnedRasterArray u = convert_output(g, DType::uint8, NodataValue(0.0));
    std::vector<std::uint8_t> u8(4);
    u.copy_to_host(u8.data());
    CHECK(u8 == std::vector<std::uint8_t>{1, 255, 0, 2});
    CHECK_FALSE(convert_output(g, DType::uint8, std::nullopt).exact_nodata());
  }

  TEST_CASE("calc: the output nodata: given, the first input's when held, else the type's") {
    const OwnedRasterArray n9 = raster(1, 2, 2, DType::int16, -9999.0);
    const OwnedRasterArray nnan = raster(1, 2, 2, DType::float32, NAN);
    const OwnedRasterArray none = raster(1, 2, 2, DType::uint8);
    CalcOptions opt;
    opt.output = DType::uint8;
    // -9999 is no uint8: the type's largest value.
    CHECK(calc({"a"}, {{"n", none}, {"a", n9}}, opt).nodata() == 255.0);
    opt.output = DType::int16;
    CHECK(calc({"a"}, {{"n", none}, {"a", n9}}, opt).nodata() == -9999.0);
    // The first input read with a nodata decides, even when a later one's would fit.
    opt.output = DType::int32;
    CHECK(calc({"a + f"}, {{"f", nnan}, {"a", n9}}, opt).nodata() == 2147483647.0);
    opt.output = DType::float64;
    CHECK(std::isnan(*calc({"a + f"}, {{"f", nnan}, {"a", n9}}, opt).nodata()));
    // An input no expression reads plays no part: a's nodata.
    opt.output = DType::int32;
    CHECK(calc({"a"}, {{"f", nnan}, {"a", n9}}, opt).nodata() == -9999.0);
    opt.output = DType::float32;
    CHECK(std::isnan(*calc({"n + 1"}, {{"a", n9}, {"n", none}}, opt).nodata()));
    opt.output_nodata = NodataValue(0.25);
    CHECK(calc({"a"}, {{"a", n9}}, opt).nodata() == 0.25);
    opt.output = DType::uint8;
    CHECK(calc_error({"a"}, {{"a", n9}}, opt) ==
          "calc: the output nodata 0.25 is not a value of uint8");
    opt.output_nodata = NodataValue(NAN);
    CHECK(calc_error({"a"}, {{"a", n9}}, opt) ==
          "calc: the output nodata nan is not a value of uint8");
    opt.output = DType::float32;
    opt.output_nodata = NodataValue(1e300);
    CHECK(calc_error({"a"}, {{"a", n9}}, opt) ==
          "calc: the output nodata 1e+300 is not a value of float32");
    opt.output = DType::int64;
    opt.output_nodata = NodataValue::from_int64(INT64_MAX);
    CHECK(calc({"a"}, {{"a", n9}}, opt).exact_nodata() == NodataValue::from_int64(INT64_MAX));
  }

  TEST_CASE("calc: numpy's ** fast paths and muparser's precedence of unary minus") {
    const std::vector<double> v{-0.0, -INFINITY, 2, 3};
    const OwnedRasterArray b = OwnedRasterArray::from_host(v.data(), DType::float64, 1, 1, 4);
    CalcOptions opt;
    opt.output = DType::float64;
    const auto run = [&](const char* e) {
      std::vector<double> got(4);
      calc({e}, {{"B", b}}, opt).copy_to_host(got.data());
      return got;
    };
    // x ** 0.5 is sqrt(x) (numpy's **): -0 stays -0 and sqrt(-inf) is NaN, where pow() gives
    // +0 and +inf.
    auto s = run("B ** 0.5");
    CHECK(std::signbit(s[0]));
    CHECK(std::isnan(s[1]));
    auto p = run("pow(B, 0.5)");
    CHECK(!std::signbit(p[0]));
    CHECK(p[1] == INFINITY);
    CHECK(run("-B**2")[2] == -4);
    CHECK(run("-B^2")[3] == -9);
    CHECK(run("(-B)**2")[3] == 9);
    CHECK(run("B**-1")[2] == 0.5);
    CHECK(run("B**B**2")[2] == 16);
    CHECK(run("2**-B")[2] == 0.25);
  }
}
