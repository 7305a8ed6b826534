// SPDX-License-Identifier: Apache-2.0
// vsr-bench alloc's traces (trace.hpp) and the interleaved rounds of its contenders.
#include "trace.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace vsr_bench {

const char* dist_name(Dist d) {
  return d == Dist::uniform ? "uniform" : "log-uniform";
}

std::size_t draw(std::mt19937_64& rng, std::size_t lo, std::size_t hi, Dist d) {
  if (d == Dist::uniform) return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
  std::uniform_real_distribution<double> u(std::log(static_cast<double>(lo)),
                                           std::log(static_cast<double>(hi)));
  return std::clamp(static_cast<std::size_t>(std::exp(u(rng))), lo, hi);
}

double mean_size(std::size_t lo, std::size_t hi, Dist d) {
  const double a = static_cast<double>(lo), b = static_cast<double>(hi);
  return d == Dist::uniform ? 0.5 * (a + b) : (b - a) / std::log(b / a);
}

Trace make_trace(std::string name, std::size_t live, std::size_t lo, std::size_t hi,
                 std::size_t steps, std::uint64_t seed, Dist dist) {
  Trace t{std::move(name), lo, hi, dist, {}, {}};
  std::mt19937_64 rng(seed);
  t.fill.resize(live);
  for (auto& s : t.fill) s = draw(rng, lo, hi, dist);
  t.steps.resize(steps);
  for (auto& s : t.steps) {
    s.slot =
        static_cast<std::uint32_t>(std::uniform_int_distribution<std::size_t>(0, live - 1)(rng));
    s.size = draw(rng, lo, hi, dist);
  }
  return t;
}

std::uint64_t fingerprint(const Trace& t) {
  std::uint64_t h = 14695981039346656037ull;
  const auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const std::size_t s : t.fill) mix(s);
  for (const Trace::Step& s : t.steps) {
    mix(s.slot);
    mix(s.size);
  }
  return h;
}

// samples[c][r]: ns/op of contender c in round r. One untimed warm-up round per contender first.
std::vector<std::vector<double>> interleave(const std::string& label, const Trace& t,
                                            std::size_t steps, int rounds,
                                            std::vector<Contender>& cs) {
  progress("%s: %s trace, warm-up", label.c_str(), t.name.c_str());
  for (auto& c : cs) c.round(t, steps);
  std::vector<std::vector<double>> samples(cs.size());
  for (int r = 0; r < rounds; ++r) {
    progress("%s: %s trace, round %d/%d", label.c_str(), t.name.c_str(), r + 1, rounds);
    for (std::size_t c = 0; c < cs.size(); ++c) samples[c].push_back(cs[c].round(t, steps));
  }
  return samples;
}

}  // namespace vsr_bench
