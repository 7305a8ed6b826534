// SPDX-License-Identifier: Apache-2.0
#include "memory/asymmetric_fence.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace vibespatial::raster::detail {
namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

long membarrier(int command) noexcept {
  return syscall(__NR_membarrier, command, 0, 0);
}

bool register_membarrier() noexcept {
  if (kThreadSanitizer) return false;
  const long supported = membarrier(MEMBARRIER_CMD_QUERY);
  if (supported < 0 || (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

}  // namespace

bool asymmetric_fence_available() noexcept {
  static const bool available = register_membarrier();
  return available;
}

bool heavy_fence() noexcept {
  return asymmetric_fence_available() && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
}

}  // namespace vibespatial::raster::detail
