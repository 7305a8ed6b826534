// SPDX-License-Identifier: Apache-2.0
// process_facts.hpp: the forked-child state and its error.
#include "memory/process_facts.hpp"

#include <vibespatial/raster/errors.hpp>

#include <cuda.h>

#include <string>

namespace vibespatial::raster::detail {

std::atomic<bool> g_forked_child{false};

void throw_forked_child(const char* function) {
  throw DriverUnavailableError(
      CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED",
      std::string(function) +
          ": this process was forked from one that had used the device memory pool, and CUDA "
          "cannot be used after fork() without exec(): use the pool in the parent, or start "
          "worker processes with exec (Python multiprocessing: the 'spawn' or 'forkserver' start "
          "method)");
}

}  // namespace vibespatial::raster::detail
