// SPDX-License-Identifier: Apache-2.0
// Command-line parsing shared by the tools: integers and byte sizes with unit suffixes.
#pragma once

#include "escape.hpp"

#include <cctype>
#include <charconv>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vsr_cli {

/// A bad command line; the tools print it and exit 2. The message is printable() already.
struct UsageError : std::runtime_error {
  explicit UsageError(const std::string& what) : std::runtime_error(printable(what)) {}
};

/// Parses a whole integer for `option`; throws UsageError naming the option.
template <typename Int>
Int parse_integer(std::string_view option, std::string_view text) {
  Int value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range) {
    throw UsageError(std::string(option) + ": '" + std::string(text) + "' is out of range");
  }
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw UsageError(std::string(option) + ": '" + std::string(text) + "' is not an integer");
  }
  return value;
}

/// Parses a byte size: digits and an optional suffix (K/M/G/T powers of 1000, KiB/MiB/GiB/TiB
/// powers of 1024, case-insensitive); throws UsageError on bad or overflowing input.
inline std::uint64_t parse_size(std::string_view option, std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])) != 0) {
    ++digits;
  }
  if (digits == 0) {
    throw UsageError(std::string(option) + ": '" + std::string(text) +
                     "' is not a byte size (e.g. 1000000, 80M, 2GiB)");
  }
  const auto number = parse_integer<std::uint64_t>(option, text.substr(0, digits));
  std::string suffix(text.substr(digits));
  for (char& ch : suffix) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  static const std::vector<std::pair<std::string_view, std::uint64_t>> units{
      {"", 1},
      {"b", 1},
      {"k", 1000},
      {"kb", 1000},
      {"m", 1000 * 1000},
      {"mb", 1000 * 1000},
      {"g", 1000ull * 1000 * 1000},
      {"gb", 1000ull * 1000 * 1000},
      {"t", 1000ull * 1000 * 1000 * 1000},
      {"tb", 1000ull * 1000 * 1000 * 1000},
      {"kib", 1ull << 10},
      {"mib", 1ull << 20},
      {"gib", 1ull << 30},
      {"tib", 1ull << 40},
  };
  for (const auto& [name, scale] : units) {
    if (suffix == name) {
      std::uint64_t bytes = 0;
      if (__builtin_mul_overflow(number, scale, &bytes)) {
        throw UsageError(std::string(option) + ": '" + std::string(text) +
                         "' does not fit in 64 bits");
      }
      return bytes;
    }
  }
  throw UsageError(std::string(option) + ": unknown size suffix in '" + std::string(text) +
                   "' (use K, M, G, T, KiB, MiB, GiB or TiB)");
}

}  // namespace vsr_cli
