// SPDX-License-Identifier: Apache-2.0
// A byte count as people read it, for messages of the library and the tools' output
// (tools/common/format.hpp uses this one).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace vibespatial::raster::detail {

/// "512 B", then KiB, MiB, GiB or TiB (powers of 1024) with two decimals: "1.53 MiB".
inline std::string byte_text(std::uint64_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  }
  return buf;
}

}  // namespace vibespatial::raster::detail
