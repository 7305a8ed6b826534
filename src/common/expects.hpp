// SPDX-License-Identifier: Apache-2.0
// The library's precondition check (docs/architecture.md, "Errors").
#pragma once

#include <stdexcept>
#include <string>

/// Checks a precondition of a public call: throws std::invalid_argument with `message` (a string
/// expression, evaluated only when `cond` is false) unless `cond` holds. Messages start with the
/// public call's name: "clip: lower > upper".
#define VSR_EXPECTS(cond, message)                                  \
  do {                                                              \
    if (!(cond)) throw std::invalid_argument(std::string(message)); \
  } while (0)
