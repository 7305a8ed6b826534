// SPDX-License-Identifier: Apache-2.0
// Number formatting of the tools' human-readable output: vsr_cli::format_bytes ("1.53 MiB"), the
// library's own (src/common/byte_text.hpp), so that a tool and a library message agree.
#pragma once

#include "byte_text.hpp"

#include <cstdint>
#include <string>

namespace vsr_cli {

/// A byte count for people: "512 B", "1.53 MiB" (see byte_text).
inline std::string format_bytes(std::uint64_t bytes) {
  return vibespatial::raster::detail::byte_text(bytes);
}

}  // namespace vsr_cli
