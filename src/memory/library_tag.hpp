// SPDX-License-Identifier: Apache-2.0
// The owner tag of the library's own device memory (memory_history.hpp): "raster" for a scope,
// unless the caller set a tag. Kept free of intrinsics so that CUDA sources may include it.
#pragma once

namespace vibespatial::raster::detail::history {

/// Pushes the library's default tag "raster" for a scope when the thread has no tag pushed.
/// Never throws.
class LibraryTag {
 public:
  LibraryTag() noexcept;
  ~LibraryTag();
  LibraryTag(const LibraryTag&) = delete;
  LibraryTag& operator=(const LibraryTag&) = delete;

 private:
  bool pushed_;
};

}  // namespace vibespatial::raster::detail::history
