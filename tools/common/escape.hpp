// SPDX-License-Identifier: Apache-2.0
// Escaping of user bytes for the tools' output: vsr_cli::printable (terminal and error text) and
// vsr_cli::json_string (a JSON string literal that is always valid UTF-8). One implementation,
// shared with the library's io messages: src/common/text_escape.hpp says what each escapes.
#pragma once

#include "text_escape.hpp"

namespace vsr_cli {

using vibespatial::raster::detail::json_string;
using vibespatial::raster::detail::printable;

}  // namespace vsr_cli
