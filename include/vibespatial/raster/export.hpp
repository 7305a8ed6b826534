// SPDX-License-Identifier: Apache-2.0
// Symbol visibility for the vibespatial-raster shared library.
#pragma once

/// Marks an entity as part of the library's exported ABI. The library is built with hidden
/// visibility; everything a user may name (functions, exception types) carries this.
#define VSR_EXPORT __attribute__((visibility("default")))
