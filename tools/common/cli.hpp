// SPDX-License-Identifier: Apache-2.0
// Command-line parsing shared by the tools: a word scanner that takes `--name value` and
// `--name=value`, integers and byte sizes with unit suffixes. Every value is checked: an empty
// or malformed value is a UsageError (the tools print it and exit 2), never "not given".
#pragma once

#include "escape.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vsr_cli {

/// A bad command line; the tools print it and exit 2. The message is printable() already.
struct UsageError : std::runtime_error {
  explicit UsageError(const std::string& what) : std::runtime_error(printable(what)) {}

  /// A message of several lines, each made printable and the line breaks kept (an expression
  /// with a caret under the column of its error, say).
  static UsageError lines(const std::string& what) {
    std::string text;
    std::size_t start = 0;
    while (true) {
      const std::size_t end = what.find('\n', start);
      text += printable(what.substr(start, end == std::string::npos ? end : end - start));
      if (end == std::string::npos) break;
      text += '\n';
      start = end + 1;
    }
    return UsageError(Raw{}, text);
  }

 private:
  struct Raw {};
  UsageError(Raw, const std::string& text) : std::runtime_error(text) {}
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

/// Parses a finite floating-point number for `option`; throws UsageError naming the option.
inline double parse_double(std::string_view option, std::string_view text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw UsageError(std::string(option) + ": '" + std::string(text) + "' is not a number");
  }
  if (!std::isfinite(value)) {
    throw UsageError(std::string(option) + ": '" + std::string(text) + "' is not finite");
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

/// A VRAM budget given by the user: a positive byte size. 0 is refused: no pass fits in 0 bytes,
/// and the planner reads a budget of 0 as "no GPU" (whole raster, no tiling), which is not what a
/// user asking for 0 bytes means.
inline std::uint64_t parse_budget(std::string_view option, std::string_view text) {
  const std::uint64_t bytes = parse_size(option, text);
  if (bytes == 0) {
    throw UsageError(std::string(option) +
                     ": a budget of 0 bytes fits no pass; give a positive size, or auto");
  }
  return bytes;
}

/**
 * Walks argv: `while (args.next()) { if (args.is("--x")) use(args.value()); ... }`.
 * A word `--name=value` is the option `--name` with an inline value; other words are options as
 * they are. value() takes the inline value or the next word and refuses an empty one; flag()
 * refuses an inline value.
 */
class ArgScanner {
 public:
  ArgScanner(int argc, char** argv, int first = 1) : words_(argv + first, argv + argc) {}

  /// Moves to the next word; false when none is left.
  bool next() {
    if (pos_ >= words_.size()) return false;
    option_ = words_[pos_++];
    inline_.reset();
    if (const auto eq = option_.find('='); option_.starts_with("--") && eq != option_.npos) {
      inline_ = option_.substr(eq + 1);
      option_ = option_.substr(0, eq);
    }
    return true;
  }

  /// The current option (for `--name=value`, `--name`).
  std::string_view option() const { return option_; }

  /// Whether the current option is @p a or @p b.
  bool is(std::string_view a, std::string_view b = {}) const {
    return option_ == a || (!b.empty() && option_ == b);
  }

  /// The option's value: the inline value or the next word. UsageError when there is none or it
  /// is empty.
  std::string_view value() {
    std::string_view v;
    if (inline_) {
      v = *inline_;
    } else {
      if (pos_ >= words_.size()) throw UsageError(std::string(option_) + ": needs a value");
      v = words_[pos_++];
    }
    if (v.empty()) throw UsageError(std::string(option_) + ": the value is empty");
    return v;
  }

  /// The option's @p n values, the next @p n words (gdalwarp's `-tr XRES YRES`): UsageError when
  /// fewer are left, one is empty, or the first came inline (`--tr=1 2` is refused, not half
  /// read).
  std::vector<std::string_view> values(std::size_t n) {
    if (inline_ && n > 1) {
      throw UsageError(std::string(option_) + ": takes " + std::to_string(n) +
                       " values, as separate words (" + std::string(option_) + " A B ...)");
    }
    std::vector<std::string_view> out;
    for (std::size_t k = 0; k < n; ++k) {
      if (!inline_ && pos_ >= words_.size()) {
        throw UsageError(std::string(option_) + ": needs " + std::to_string(n) + " values, got " +
                         std::to_string(k));
      }
      out.push_back(value());
    }
    return out;
  }

  /// Checks that a flag option got no inline value.
  void flag() const {
    if (inline_) throw UsageError(std::string(option_) + ": takes no value");
  }

  /// UsageError for an option no branch took.
  [[noreturn]] void unknown() const {
    throw UsageError("unknown option '" + std::string(option_) + "' (see --help)");
  }

 private:
  std::vector<std::string_view> words_;
  std::size_t pos_ = 0;
  std::string_view option_;
  std::optional<std::string_view> inline_;
};

}  // namespace vsr_cli
