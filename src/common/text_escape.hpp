// SPDX-License-Identifier: Apache-2.0
// Escaping of user bytes (paths, option values, GDAL messages) before they reach a terminal, an
// exception message or a JSON document. Header-only; the library's io layer and the tools share
// it (tools/common/escape.hpp).
//
// - printable(): valid UTF-8 text stays as it is, except control characters (C0, DEL, C1) and
//   the Unicode bidirectional overrides and isolates, which become \n, \r, \t or \xNN /
//   \u{NNNN}; every byte that is not part of a valid UTF-8 sequence becomes \xNN. The result is
//   valid UTF-8 with no control character, so it is safe on a terminal and decodes in any
//   UTF-8 decoder. Backslashes are kept as they are, which makes printable() idempotent:
//   escaping an escaped text again changes nothing.
// - json_string(): a JSON string literal (quotes included) that is always valid UTF-8 JSON:
//   valid UTF-8 is kept (", \ escaped; control characters and bidirectional controls as \uNNNN,
//   so the raw document is safe on a terminal too), every invalid byte becomes U+FFFD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace vibespatial::raster::detail {

/// The length (1 to 4) of the valid UTF-8 sequence at s[i] and its code point, or 0 when the
/// bytes there are not valid UTF-8 (overlong forms, surrogates and values above U+10FFFF are
/// invalid).
inline std::size_t utf8_sequence(std::string_view s, std::size_t i, char32_t& cp) noexcept {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  std::size_t n = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

/// Whether @p s is valid UTF-8 text throughout (utf8_sequence's rules).
inline bool valid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const std::size_t n = utf8_sequence(s, i, cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

/// Whether code point @p cp is shown escaped by printable(): C0 controls, DEL, C1 controls and
/// the bidirectional embeddings, overrides and isolates (U+202A..U+202E, U+2066..U+2069).
inline bool needs_escape(char32_t cp) noexcept {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

/// @p text with control characters and invalid UTF-8 escaped (see the file comment).
inline std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char buf[16];
  for (std::size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    const std::size_t n = utf8_sequence(text, i, cp);
    if (n == 0) {
      std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned char>(text[i]));
      out += buf;
      ++i;
      continue;
    }
    if (!needs_escape(cp)) {
      out.append(text.substr(i, n));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x80) {
      std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned>(cp));
      out += buf;
    } else {
      std::snprintf(buf, sizeof buf, "\\u{%04X}", static_cast<unsigned>(cp));
      out += buf;
    }
    i += n;
  }
  return out;
}

/// @p text as a JSON string literal, quotes included (see the file comment).
inline std::string json_string(std::string_view text) {
  std::string out = "\"";
  out.reserve(text.size() + 2);
  for (std::size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    const std::size_t n = utf8_sequence(text, i, cp);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      ++i;
      continue;
    }
    if (cp == '"') {
      out += "\\\"";
    } else if (cp == '\\') {
      out += "\\\\";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (needs_escape(cp)) {
      // Four hex digits: every code point needs_escape admits is below U+FFFF.
      constexpr char hex[] = "0123456789abcdef";
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += hex[(cp >> shift) & 0xF];
    } else {
      out.append(text.substr(i, n));
    }
    i += n;
  }
  out += '"';
  return out;
}

}  // namespace vibespatial::raster::detail
