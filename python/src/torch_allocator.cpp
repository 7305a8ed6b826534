// SPDX-License-Identifier: Apache-2.0
// PyTorch's pluggable allocator entry points, exported from the extension module so that
//
//   torch.cuda.memory.CUDAPluggableAllocator(vibespatial_raster._core.__file__,
//                                            "vsr_torch_malloc", "vsr_torch_free")
//
// draws PyTorch's device memory from the pool (vibespatial_raster.allocators.torch_allocator()).
// The signatures are PyTorch's (torch/csrc/cuda/CUDAPluggableAllocator.h; its documentation
// declares them with ssize_t sizes): PyTorch dlopens this file and calls them as
//   void* alloc(ssize_t size, int device, cudaStream_t stream)
//   void  free(void* ptr, ssize_t size, int device, cudaStream_t stream)
// cudaStream_t is the driver's CUstream (both are `struct CUstream_st*`).
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/memory_history.hpp>

#include <sys/types.h>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#define VSR_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

/// Allocates `size` bytes from the pool of the calling thread's current device, stream-ordered on
/// `stream` (PyTorch calls it under a device guard for `device`, whose primary context is then
/// current; the pool serves that context's device). Counted in memory_pool_stats().
/// Like RMM's PyTorch allocator, a failure throws (OutOfMemoryError, a std::bad_alloc; CudaError;
/// std::invalid_argument for a negative size): PyTorch's caller is C++ and reports it as a Python
/// exception, where a null pointer would only fail later, inside a kernel. size 0 returns null.
VSR_TORCH_EXPORT void* vsr_torch_malloc(ssize_t size, int device, CUstream stream) {
  (void)device;
  if (size < 0) {
    throw std::invalid_argument("vsr_torch_malloc: negative size " + std::to_string(size));
  }
  vibespatial::raster::DefaultMemoryTag tag("torch");  // its owner in the memory history
  return vibespatial::raster::device_allocate(static_cast<std::size_t>(size), stream);
}

/// Frees a block from vsr_torch_malloc on the stream it was allocated on (PyTorch passes that
/// stream back): reusable at once on `stream`, on other streams once its queued work completes.
/// Never throws: PyTorch calls it from deleters, where an exception would end the process; a
/// bad free (a pointer the pool never handed out, a wrong size) is reported on stderr and
/// changes nothing.
VSR_TORCH_EXPORT void vsr_torch_free(void* ptr, ssize_t size, int device,
                                     CUstream stream) noexcept {
  (void)device;
  try {
    vibespatial::raster::device_deallocate(ptr, size < 0 ? 0 : static_cast<std::size_t>(size),
                                           stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vsr_torch_free: %s\n", e.what());
  }
}
