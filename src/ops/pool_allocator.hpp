// SPDX-License-Identifier: Apache-2.0
// Device temporaries from the pool: a Thrust allocator for par_nosync(alloc).on(stream) and an
// RAII buffer for CUB's two-phase temporary storage. CUDA backend only (ops_cuda.cu, tests).
#pragma once

#include "memory/library_tag.hpp"

#include <vibespatial/raster/memory.hpp>

#include <cstddef>

namespace vibespatial::raster::detail::ops {

/// A Thrust temporary allocator over device_allocate/device_deallocate on one stream. Thrust
/// asks for char buffers; the block is freed in stream order, so par_nosync stays asynchronous.
/// Must outlive every algorithm call that uses a policy built from it. Counts its allocations.
struct PoolThrustAllocator {
  using value_type = char;

  CUstream stream = nullptr;
  std::size_t* allocations = nullptr;  ///< optional counter of allocate() calls

  char* allocate(std::size_t n) {
    if (allocations) ++*allocations;
    history::LibraryTag tag;
    return static_cast<char*>(device_allocate(n, stream));
  }
  void deallocate(char* p, std::size_t n) { device_deallocate(p, n, stream); }
};

/// An RAII device buffer from the pool, freed on `stream` (CUB temporary storage, outputs).
class PoolBuffer {
 public:
  PoolBuffer(std::size_t bytes, CUstream stream)
      : ptr_(allocate(bytes, stream)), bytes_(bytes), stream_(stream) {}
  ~PoolBuffer() {
    try {
      device_deallocate(ptr_, bytes_, stream_);
    } catch (...) {  // a destructor must not throw; the pool stays consistent
    }
  }
  PoolBuffer(const PoolBuffer&) = delete;
  PoolBuffer& operator=(const PoolBuffer&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t size() const { return bytes_; }

 private:
  static void* allocate(std::size_t bytes, CUstream stream) {
    history::LibraryTag tag;
    return bytes ? device_allocate(bytes, stream) : nullptr;
  }
  void* ptr_;
  std::size_t bytes_;
  CUstream stream_;
};

}  // namespace vibespatial::raster::detail::ops
