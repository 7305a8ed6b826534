// SPDX-License-Identifier: Apache-2.0
// Band math (calc) against a reference computed pixel by pixel in plain C++: every case is an
// expression beside the same formula written in C++, evaluated in double (float64 compute) and
// in float (float32 compute), with the nodata rule applied by hand. Built into test-ops (host
// inputs) and test-ops-gpu (device inputs, through where_ops_run): on the host every value must
// be equal; on the device too, except for cases using exp, log, pow and trigonometric functions
// (the device's math library), which may differ by a few ulps.
#include "reference.hpp"

#include <vibespatial/raster/ops.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using namespace vsr_ops_test;

namespace {

constexpr std::int64_t kH = 17, kW = 19;  // 323 pixels: two lane groups of 128 and a tail
constexpr std::size_t kN = static_cast<std::size_t>(kH * kW);
constexpr double kNodataA = -9999;

/// The test inputs: A (float32, 4 bands, nodata -9999), B (one band of T, nodata at a type
/// limit), C (int16, one band, no nodata).
template <class T>
struct Data {
  std::vector<float> a;
  std::vector<T> b;
  T b_nodata{};
  std::vector<std::int16_t> c;
};

template <class T>
T limit_nodata() {
  if constexpr (std::is_floating_point_v<T>) {
    return std::numeric_limits<T>::lowest();
  } else if constexpr (std::is_signed_v<T>) {
    return std::numeric_limits<T>::lowest();
  } else {
    return std::numeric_limits<T>::max();
  }
}

template <class T>
Data<T> make_data(unsigned seed) {
  std::mt19937_64 rng(seed);
  Data<T> d;
  d.a.resize(4 * kN);
  for (std::size_t i = 0; i < d.a.size(); ++i) {
    const std::size_t kind = rng() % 4;
    float v = 0;
    if (kind == 0) {
      v = static_cast<float>(static_cast<int>(rng() % 41) - 20);  // integers: ties for round
    } else if (kind == 1) {
      v = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(rng));
    } else {
      v = static_cast<float>(std::uniform_real_distribution<double>(-1000, 1000)(rng));
    }
    if (i % 31 == 4) v = 0;
    if (i % 11 == 2) v = static_cast<float>(kNodataA);
    if (i % 23 == 7) v = std::numeric_limits<float>::quiet_NaN();
    d.a[i] = v;
  }
  d.b_nodata = limit_nodata<T>();
  d.b.resize(kN);
  for (std::size_t i = 0; i < kN; ++i) {
    T v{};
    if constexpr (std::is_floating_point_v<T>) {
      v = static_cast<T>(std::uniform_real_distribution<double>(-500, 500)(rng));
      if (i % 29 == 3) v = std::numeric_limits<T>::quiet_NaN();
    } else if constexpr (sizeof(T) == 1) {
      v = static_cast<T>(rng());
      if (v == d.b_nodata) v = 1;
    } else if constexpr (std::is_signed_v<T>) {
      v = static_cast<T>(static_cast<long long>(rng() % 2001) - 1000);
    } else {
      v = static_cast<T>(rng() % 2001);
    }
    if (i % 13 == 6) v = 0;
    if (i % 7 == 1) v = d.b_nodata;
    d.b[i] = v;
  }
  d.c.resize(kN);
  for (auto& v : d.c) v = static_cast<std::int16_t>(static_cast<int>(rng() % 60001) - 30000);
  return d;
}

/// One pixel as the reference formulas see it: each accessor converts to C and records whether
/// the band read is valid (its input's nodata, or NaN). A formula must call every accessor its
/// expression names (no short-circuit && or ||, no ?: around a read), since calc's nodata
/// propagation looks at every band an expression names.
template <class C, class T>
struct Px {
  const Data<T>& d;
  std::size_t i;
  mutable bool valid = true;
  C A(int band) const {
    const float v = d.a[static_cast<std::size_t>(band - 1) * kN + i];
    valid = valid && !std::isnan(v) && v != static_cast<float>(kNodataA);
    return static_cast<C>(v);
  }
  C B() const {
    const T v = d.b[i];
    bool ok = v != d.b_nodata;
    if constexpr (std::is_floating_point_v<T>) ok = ok && !std::isnan(v);
    valid = valid && ok;
    return static_cast<C>(v);
  }
  C Cb() const { return static_cast<C>(d.c[i]); }
};

// numpy's meanings, written out.
template <class C>
C truth(bool b) {
  return b ? C(1) : C(0);
}
template <class C>
C sel(C cond, C yes, C no) {
  return cond != C(0) ? yes : no;
}
template <class C>
C mn(C a, C b) {
  return std::isnan(a) ? a : (a < b ? a : b);
}
template <class C>
C mx(C a, C b) {
  return std::isnan(a) ? a : (a > b ? a : b);
}
template <class C>
bool t(C x) {
  return x != C(0);
}

template <class T>
struct Case {
  const char* expression;
  std::function<double(const Px<double, T>&)> f64;
  std::function<float(const Px<float, T>&)> f32;
  bool libm;  ///< uses the math library beyond sqrt: the device may differ by a few ulps
};

// The formula is written once, with C the compute type and p the pixel.
#define CALC_CASE(expr, libm, ...)                 \
  Case<T> {                                        \
    expr,                                          \
        [](const Px<double, T>& p) -> double {     \
          using C [[maybe_unused]] = double;       \
          (void)p;                                 \
          return static_cast<double>(__VA_ARGS__); \
        },                                         \
        [](const Px<float, T>& p) -> float {       \
          using C [[maybe_unused]] = float;        \
          (void)p;                                 \
          return static_cast<float>(__VA_ARGS__);  \
        },                                         \
        libm                                       \
  }

template <class T>
std::vector<Case<T>> cases() {
  return {
      CALC_CASE("A[1] + B", false, p.A(1) + p.B()),
      CALC_CASE("A[1] - B * 2", false, p.A(1) - p.B() * C(2)),
      CALC_CASE("(A[4]-A[3])/(A[4]+A[3])", false, (p.A(4) - p.A(3)) / (p.A(4) + p.A(3))),
      CALC_CASE("A[1] / B", false, p.A(1) / p.B()),
      CALC_CASE("-A[1]**2", false, -(p.A(1) * p.A(1))),
      CALC_CASE("2**-1 * A[2]", false, C(0.5) * p.A(2)),
      CALC_CASE("A[1] ** 3", true, std::pow(p.A(1), C(3))),
      CALC_CASE("A[1] ^ 0.5", false, std::sqrt(p.A(1))),
      CALC_CASE("pow(A[1], 0.5)", true, std::pow(p.A(1), C(0.5))),
      CALC_CASE("A[2] ** -1 + A[3] ** 1", false, C(1) / p.A(2) + p.A(3)),
      CALC_CASE("sqrt(abs(A[1]))", false, std::sqrt(std::fabs(p.A(1)))),
      CALC_CASE("exp(A[1] / 1000)", true, std::exp(p.A(1) / C(1000))),
      CALC_CASE("log(A[1])", true, std::log(p.A(1))),
      CALC_CASE("log10(abs(B) + 1)", true, std::log10(std::fabs(p.B()) + C(1))),
      CALC_CASE("sin(A[1]) + cos(A[2]) * tan(B)", true,
                std::sin(p.A(1)) + std::cos(p.A(2)) * std::tan(p.B())),
      CALC_CASE("asin(A[1] / 1000) - acos(A[2]/1000)", true,
                std::asin(p.A(1) / C(1000)) - std::acos(p.A(2) / C(1000))),
      CALC_CASE("atan(A[1]) + arctan2(A[2], B)", true,
                std::atan(p.A(1)) + std::atan2(p.A(2), p.B())),
      CALC_CASE("floor(A[1] / 7) + ceil(B / 3)", false,
                std::floor(p.A(1) / C(7)) + std::ceil(p.B() / C(3))),
      CALC_CASE("round(A[1] / 2) + rint(A[2] * 0.5)", false,
                std::nearbyint(p.A(1) / C(2)) + std::nearbyint(p.A(2) * C(0.5))),
      CALC_CASE("min(A[1], A[2], B)", false, mn(mn(p.A(1), p.A(2)), p.B())),
      CALC_CASE("max(A[1], B) - minimum(A[3], 0)", false, mx(p.A(1), p.B()) - mn(p.A(3), C(0))),
      CALC_CASE("A[1] > B", false, truth<C>(p.A(1) > p.B())),
      CALC_CASE("(A[1] <= B) + (A[1] == A[2]) * 2 + (A[1] != B) * 4 + (A[1] >= 0) * 8", false,
                truth<C>(p.A(1) <= p.B()) + truth<C>(p.A(1) == p.A(2)) * C(2) +
                    truth<C>(p.A(1) != p.B()) * C(4) + truth<C>(p.A(1) >= C(0)) * C(8)),
      CALC_CASE("A[1] > 0 && B < 0", false, truth<C>((p.A(1) > C(0)) & (p.B() < C(0)))),
      CALC_CASE("A[1] > 0 and B < 0 or not A[2] > 0", false,
                truth<C>(((p.A(1) > C(0)) & (p.B() < C(0))) | !(p.A(2) > C(0)))),
      CALC_CASE("!(A[1] > 0) || B", false, truth<C>(!(p.A(1) > C(0)) | t(p.B()))),
      CALC_CASE("A[1] > B ? A[1] : B * 2", false,
                sel(truth<C>(p.A(1) > p.B()), p.A(1), p.B() * C(2))),
      CALC_CASE("where(A[1] > 0, A[1], -A[1])", false,
                sel(truth<C>(p.A(1) > C(0)), p.A(1), -p.A(1))),
      CALC_CASE("isnan(A[1] / B) + isinf(A[1] / B) * 2", false,
                truth<C>(std::isnan(p.A(1) / p.B())) + truth<C>(std::isinf(p.A(1) / p.B())) * C(2)),
      CALC_CASE("1 + 2 * 3", false, C(7)),
      CALC_CASE("2 ** 3 ** 2 + -2**2", false, C(512) + C(-4)),
      CALC_CASE("A[1] * pi", false, p.A(1) * static_cast<C>(3.141592653589793)),
      CALC_CASE("nan", false, std::numeric_limits<C>::quiet_NaN()),
      CALC_CASE("-inf + A[1] * 0", false, -std::numeric_limits<C>::infinity() + p.A(1) * C(0)),
      CALC_CASE("-(-(A[1])) + +A[2]", false, p.A(1) + p.A(2)),
      CALC_CASE("(A[1] + A[2]) * (A[3] - A[4]) / (B + 1)", false,
                (p.A(1) + p.A(2)) * (p.A(3) - p.A(4)) / (p.B() + C(1))),
      CALC_CASE("logical_and(A[1] > 0, B > 0) + logical_not(B)", false,
                truth<C>((p.A(1) > C(0)) & (p.B() > C(0))) + truth<C>(p.B() == C(0))),
      CALC_CASE("A[1]*1e-3 + 1.5e2 - .5 + 3. + 2E+1", false,
                p.A(1) * static_cast<C>(1e-3) + C(150) - C(0.5) + C(3) + C(20)),
      CALC_CASE("A[2] > 0 ? A[2] > 10 ? 2 : 1 : 0", false,
                sel(truth<C>(p.A(2) > C(0)), sel(truth<C>(p.A(2) > C(10)), C(2), C(1)), C(0))),
      CALC_CASE("C * 2 + A[1]", false, p.Cb() * C(2) + p.A(1)),
      CALC_CASE("maximum(C, B) / (A[3] - A[3])", false, mx(p.Cb(), p.B()) / (p.A(3) - p.A(3))),
  };
}
#undef CALC_CASE

template <class T>
std::vector<CalcInput> make_inputs(const Data<T>& d) {
  const Affine af{30, 0, 500000, 0, -30, 4000000};
  std::vector<CalcInput> in;
  in.push_back(CalcInput{
      "A", input(d.a.data(), DType::float32, 4, kH, kW, kNodataA, af, std::string("EPSG:32633"))});
  OwnedRasterArray b =
      OwnedRasterArray::from_host(d.b.data(), dtype_of<T>(), 1, kH, kW, {}, af, "EPSG:32633");
  if constexpr (std::is_same_v<T, std::int64_t>) {
    b = b.with_nodata(NodataValue::from_int64(d.b_nodata));
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {
    b = b.with_nodata(NodataValue::from_uint64(d.b_nodata));
  } else {
    b = b.with_nodata(NodataValue(static_cast<double>(d.b_nodata)));
  }
  in.push_back(CalcInput{"B", where_ops_run(b)});
  in.push_back(CalcInput{"C", input(d.c.data(), DType::int16, 1, kH, kW, std::nullopt, af,
                                    std::string("EPSG:32633"))});
  return in;
}

bool ops_on_device(const std::vector<CalcInput>& in) {
  return in.front().raster.residency() == Residency::device;
}

/// Float results equal (NaN equals NaN), or within @p ulps of each other, or of 1 for results
/// below 1 (a sum such as sin + cos near 0 carries its terms' absolute error).
template <class F>
bool close(F got, F want, int ulps) {
  if (std::isnan(got) || std::isnan(want)) return std::isnan(got) && std::isnan(want);
  if (got == want) return true;
  if (std::isinf(got) || std::isinf(want)) return false;
  if (ulps == 0) return false;
  F x = want;
  for (int k = 0; k < ulps; ++k) x = std::nextafter(x, got);
  if (want < got ? got <= x : got >= x) return true;
  if (std::fabs(want) >= F(1)) return false;
  return std::fabs(got - want) <= F(ulps) * (std::nextafter(F(1), F(2)) - F(1));
}

/// Runs one expression and checks every pixel against @p ref (the value and whether the pixel
/// is valid), as output dtype O.
template <class O, class Ref>
void check_case(const char* expr, const std::vector<CalcInput>& in, const CalcOptions& opt, Ref ref,
                int ulps) {
  const OwnedRasterArray out = calc({expr}, in, opt);
  REQUIRE(out.dtype() == opt.output);
  REQUIRE(out.band_count() == 1);
  const std::vector<O> got = read<O>(out);
  const O nd = static_cast<O>(out.nodata().value());
  int bad = 0;
  for (std::size_t i = 0; i < kN && bad < 5; ++i) {
    bool valid = true;
    const O want_raw = static_cast<O>(ref(i, valid));
    const O want = (opt.propagate_nodata && !valid) ? nd : want_raw;
    if (!close(got[i], want, ulps)) {
      ++bad;
      FAIL_CHECK("'" << std::string(expr) << "' pixel " << i << ": got "
                     << static_cast<double>(got[i]) << ", want " << static_cast<double>(want)
                     << std::string(valid ? "" : " (nodata pixel)")
                     << std::string(opt.compute_float32 ? " f32" : "")
                     << std::string(opt.propagate_nodata ? "" : " raw"));
    }
  }
}

template <class T>
void run_all_cases() {
  const Data<T> d = make_data<T>(1234 + sizeof(T) * 7 + std::is_signed_v<T>);
  const std::vector<CalcInput> in = make_inputs(d);
  const bool dev = ops_on_device(in);
  for (const Case<T>& c : cases<T>()) {
    const std::string expression = c.expression;
    CAPTURE(expression);
    const int ulps = dev && c.libm ? 4 : 0;
    // NaN as the output's nodata, which no valid result takes: the values themselves are
    // compared (an input's nodata as the output's, which a result may hit, is tested apart).
    const NodataValue nan(std::numeric_limits<double>::quiet_NaN());
    CalcOptions o64;
    o64.output = DType::float64;
    o64.output_nodata = nan;
    const auto ref64 = [&](std::size_t i, bool& valid) {
      Px<double, T> p{d, i};
      const double r = c.f64(p);
      valid = p.valid;
      return r;
    };
    check_case<double>(c.expression, in, o64, ref64, ulps);
    o64.propagate_nodata = false;
    check_case<double>(c.expression, in, o64, ref64, ulps);
    // float64 compute, float32 output: the double result rounded once.
    CalcOptions o32;
    o32.output_nodata = nan;
    check_case<float>(c.expression, in, o32, ref64, ulps);
    CalcOptions f32;
    f32.compute_float32 = true;
    f32.output_nodata = nan;
    check_case<float>(
        c.expression, in, f32,
        [&](std::size_t i, bool& valid) {
          Px<float, T> p{d, i};
          const float r = c.f32(p);
          valid = p.valid;
          return r;
        },
        ulps);
  }
}

}  // namespace

TEST_SUITE("ops") {
  TEST_CASE_TEMPLATE("calc: 40 expressions against the reference, B of every dtype", T,
                     ALL_DTYPES) {
    run_all_cases<T>();
  }

  TEST_CASE(
      "calc: the output's nodata is the first input's, written where a band read is invalid") {
    const Data<float> d = make_data<float>(9);
    const std::vector<CalcInput> in = make_inputs(d);
    const OwnedRasterArray out = calc({"A[2]"}, in);
    REQUIRE(out.nodata().has_value());
    CHECK(*out.nodata() == kNodataA);
    CHECK(out.affine() == in.front().raster.affine());
    CHECK(out.crs() == "EPSG:32633");
    CHECK(out.residency() == in.front().raster.residency());
    // C has no nodata and is read alone: no pixel is nodata.
    const auto c_only = read<float>(calc({"C + 0.5"}, in));
    for (std::size_t i = 0; i < kN; ++i) {
      CHECK(c_only[i] == static_cast<float>(d.c[i]) + 0.5f);
    }
  }

  TEST_CASE("calc: a program of 14 registers (a balanced tree) evaluates right") {
    // ((C + C) + (C + C)) ... 12 levels deep: 4096 leaves, 14 registers, 4096 * C exactly.
    const Data<float> d = make_data<float>(5);
    const std::vector<CalcInput> in = make_inputs(d);
    std::string t = "C";
    for (int level = 0; level < 12; ++level) t = "(" + t + " + " + t + ")";
    const CalcProgram p = compile_calc({t}, {{"A", 4}, {"B", 1}, {"C", 1}});
    CHECK(p.registers() == 14);
    CalcOptions opt;
    opt.output = DType::float64;
    const auto got = read<double>(calc(p, in, opt));
    for (std::size_t i = 0; i < kN; ++i) CHECK(got[i] == 4096.0 * static_cast<double>(d.c[i]));
  }

  TEST_CASE("calc: several expressions give several bands, each with its own nodata pixels") {
    const Data<std::uint16_t> d = make_data<std::uint16_t>(3);
    const std::vector<CalcInput> in = make_inputs(d);
    CalcOptions opt;
    opt.output = DType::float64;
    const OwnedRasterArray out = calc({"A[1] + 1", "A[2] * B", "C", "A[4] > A[3]"}, in, opt);
    REQUIRE(out.band_count() == 4);
    const auto got = read<double>(out);
    for (std::size_t i = 0; i < kN; ++i) {
      Px<double, std::uint16_t> p{d, i};
      const double r0 = p.A(1) + 1;
      const double want0 = p.valid ? r0 : kNodataA;
      Px<double, std::uint16_t> q{d, i};
      const double r1 = q.A(2) * q.B();
      const double want1 = q.valid ? r1 : kNodataA;
      Px<double, std::uint16_t> s{d, i};
      const double r3 = truth<double>(s.A(4) > s.A(3));
      const double want3 = s.valid ? r3 : kNodataA;
      CHECK(same(got[i], want0));
      CHECK(same(got[kN + i], want1));
      CHECK(got[2 * kN + i] == static_cast<double>(d.c[i]));
      CHECK(same(got[3 * kN + i], want3));
    }
  }

  TEST_CASE_TEMPLATE("calc: every output dtype, converted as convert_dtype", O, ALL_DTYPES) {
    // Values with ties (x.5), beyond every integer range, and NaN from 0/0.
    const std::vector<double> v{0.5,   -0.5,  1.5,    -1.5, 2.5,  -2.5,    127.5, 128.0, -128.5,
                                255.5, 1e300, -1e300, 0.0,  -0.0, 65535.4, 4e9,   -3e9,  0.0};
    const std::vector<double> w{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1};
    const std::int64_t n = static_cast<std::int64_t>(v.size());
    const std::vector<CalcInput> in{CalcInput{"x", input(v.data(), DType::float64, 1, 1, n)},
                                    CalcInput{"y", input(w.data(), DType::float64, 1, 1, n)}};
    CalcOptions opt;
    opt.output = dtype_of<O>();
    // No input has a nodata: NaN for floats, the type's largest value for integers (for 64-bit
    // types the largest double below 2^63 / 2^64, as vsr-run's --ot). Up to 32 bits, values
    // saturate to that largest value: valid results equal to the nodata, which calc refuses.
    O nd{};
    if constexpr (std::is_floating_point_v<O>) {
      nd = std::numeric_limits<O>::quiet_NaN();
    } else if constexpr (sizeof(O) == 8) {
      nd = static_cast<O>(std::nextafter(
          std::is_signed_v<O> ? 9223372036854775808.0 : 18446744073709551616.0, 0.0));
      CHECK(default_nodata(opt.output) == NodataValue(static_cast<double>(nd)));
    } else {
      CHECK(default_nodata(opt.output) ==
            NodataValue(static_cast<double>(std::numeric_limits<O>::max())));
      CHECK_THROWS_WITH_AS(calc({"x / y"}, in, opt),
                           doctest::Contains(("valid pixel(s) of band 1 convert to " +
                                              default_nodata(opt.output).to_string() + " (")
                                                 .c_str()),
                           std::invalid_argument);
      // A nodata no result takes: the conversions themselves.
      nd = 77;
      opt.output_nodata = NodataValue(77.0);
    }
    const OwnedRasterArray out = calc({"x / y"}, in, opt);
    REQUIRE(out.exact_nodata().has_value());
    const auto got = read<O>(out);
    if constexpr (std::is_floating_point_v<O>) CHECK(std::isnan(*out.nodata()));
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double r = v[i] / w[i];
      O want{};
      if constexpr (std::is_floating_point_v<O>) {
        want = static_cast<O>(r);
      } else {
        want = std::isnan(r) ? nd : ref_convert<O>(r);
      }
      CHECK_MESSAGE(same(got[i], want), "pixel " << i << " (" << r << ")");
      if constexpr (std::is_floating_point_v<O>) {
        if (r == 0) CHECK(std::signbit(got[i]) == std::signbit(r));  // -0.0 stays -0.0
      }
    }
    // A given nodata replaces the rule; one a valid result takes is refused.
    opt.output_nodata = NodataValue(-1.0);
    if constexpr (std::is_floating_point_v<O>) {
      const OwnedRasterArray given = calc({"x / y"}, in, opt);
      CHECK(given.exact_nodata() == opt.output_nodata);
      CHECK(read<O>(given)[12] == O(-1));  // 0/0
    } else if constexpr (std::is_signed_v<O>) {
      // -0.5 rounds to -1 (half away from zero).
      CHECK_THROWS_WITH_AS(calc({"x / y"}, in, opt), doctest::Contains("band 1 convert to -1 ("),
                           std::invalid_argument);
    }
  }

  TEST_CASE("calc: 64-bit nodata at the type limits compare exactly, in the input's type") {
    // INT64_MAX and INT64_MAX - 1 are one double (2^63): only the sentinel itself is nodata.
    const std::vector<std::int64_t> i64{INT64_MAX, INT64_MAX - 1, INT64_MIN, 0};
    const std::vector<std::uint64_t> u64{UINT64_MAX, UINT64_MAX - 1, 0, 1};
    const OwnedRasterArray a =
        where_ops_run(OwnedRasterArray::from_host(i64.data(), DType::int64, 1, 1, 4)
                          .with_nodata(NodataValue::from_int64(INT64_MAX)));
    const OwnedRasterArray b =
        where_ops_run(OwnedRasterArray::from_host(u64.data(), DType::uint64, 1, 1, 4)
                          .with_nodata(NodataValue::from_uint64(UINT64_MAX)));
    CalcOptions opt;
    opt.output = DType::float64;
    opt.output_nodata = NodataValue(-1.0);
    const auto got = read<double>(calc({"a", "b", "a * 0 + b"}, {{"a", a}, {"b", b}}, opt));
    CHECK(got[0] == -1);
    CHECK(got[1] == 9223372036854775808.0);
    CHECK(got[2] == -9223372036854775808.0);
    CHECK(got[3] == 0);
    CHECK(got[4] == -1);
    CHECK(got[5] == 18446744073709551616.0);
    CHECK(got[6] == 0);
    CHECK(got[7] == 1);
    CHECK(got[8] == -1);  // a (and b) nodata
    CHECK(got[9] == 18446744073709551616.0);
    CHECK(got[10] == 0);
    CHECK(got[11] == 1);
  }

  TEST_CASE("calc: NaN and nodata propagation on and off") {
    const std::vector<float> a{1, NAN, -5, 4, 0};
    const std::vector<float> b{2, 2, 2, 0, 0};
    const std::vector<CalcInput> in{CalcInput{"A", input(a.data(), DType::float32, 1, 1, 5, -5.0)},
                                    CalcInput{"B", input(b.data(), DType::float32, 1, 1, 5)}};
    CalcOptions opt;
    auto got = read<float>(calc({"A / B"}, in, opt));
    CHECK(got[0] == 0.5f);
    CHECK(got[1] == -5.0f);  // NaN input: nodata
    CHECK(got[2] == -5.0f);  // nodata input
    CHECK(std::isinf(got[3]));
    CHECK(got[4] == -5.0f);  // 0/0 of valid pixels is invalid: written as the nodata
    opt.propagate_nodata = false;
    got = read<float>(calc({"A / B"}, in, opt));
    CHECK(got[0] == 0.5f);
    CHECK(got[1] == -5.0f);  // NaN / 2: a NaN result, the nodata
    CHECK(got[2] == -2.5f);
    // An integer output: NaN becomes the nodata (-5 held by int16), inf saturates.
    opt.propagate_nodata = true;
    opt.output = DType::int16;
    const auto i16 = read<std::int16_t>(calc({"A / B"}, in, opt));
    CHECK(i16[0] == 1);  // 0.5 rounds half away from zero
    CHECK(i16[1] == -5);
    CHECK(i16[3] == 32767);
    CHECK(i16[4] == -5);
  }
}
