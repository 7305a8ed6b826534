// SPDX-License-Identifier: Apache-2.0
// memory.hpp's check_device_range: whether a caller's device pointer and size lie in memory that
// may be read whole, asked before any copy (a copy past an allocation reads whatever neighbours
// it, or faults with a sticky error that ends the context for the whole process, §3.6). The pool
// answers for its own memory, exactly (DevicePool::block_at); the driver for the rest
// (cuMemGetAddressRange, §3.4.10, §3.5).
#include "common/expects.hpp"
#include "memory/registry_state.hpp"

#include <vibespatial/raster/memory.hpp>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace vibespatial::raster {

namespace {

std::string hex(std::uintptr_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

/// Throws unless [p, p + bytes) lies in [begin, begin + size), `holder` naming what that is.
void expect_within(const std::string& who, std::uintptr_t p, std::size_t bytes,
                   std::uintptr_t begin, std::size_t size, const char* holder) {
  const std::uintptr_t end = begin + size;
  if (p >= begin && p < end && bytes <= end - p) return;
  throw std::invalid_argument(who + ": " + std::to_string(bytes) + " bytes at " + hex(p) +
                              " run past the end of " + holder + " (" + std::to_string(size) +
                              " bytes at " + hex(begin) + ", so " + std::to_string(end - p) +
                              " from " + hex(p) + ")");
}

}  // namespace

void check_device_range(const void* ptr, std::size_t bytes, std::string_view what) {
  if (bytes == 0) return;
  const std::string who(what);
  if (detail::in_forked_child()) [[unlikely]]
    detail::throw_forked_child(who.c_str());
  VSR_EXPECTS(ptr != nullptr, who + ": null device pointer");
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  VSR_EXPECTS(bytes - 1 <= UINTPTR_MAX - p, who + ": " + std::to_string(bytes) + " bytes at " +
                                                hex(p) + " wrap around the address space");
  // The pool first: a pointer into its memory is checked against the block that holds it, not
  // against the driver's mapping, which may be a whole reservation of blocks.
  if (detail::current_tier() != detail::Tier::none) {
    for (auto& slot : detail::registry().pools) {
      const detail::DevicePool* pool = slot.load(std::memory_order_acquire);
      if (pool == nullptr) continue;
      const detail::BlockAt at = pool->block_at(ptr);
      if (at.kind == detail::BlockAt::Kind::none) continue;
      VSR_EXPECTS(at.kind == detail::BlockAt::Kind::live,
                  who + ": " + hex(p) +
                      " is device memory of the pool but in no live block (freed, or never "
                      "handed out)");
      expect_within(who, p, bytes, at.begin, at.bytes, "the pool block holding it");
      return;
    }
  }
  const detail::DriverApi& api = detail::driver();
  detail::bind_current_device();
  CUdeviceptr base = 0;
  std::size_t size = 0;
  const CUresult r = api.cuMemGetAddressRange(&base, &size, detail::to_device_ptr(ptr));
  if (r == CUDA_ERROR_NOT_FOUND || r == CUDA_ERROR_INVALID_VALUE) {
    throw std::invalid_argument(who + ": " + hex(p) +
                                " is not device memory: the driver knows no allocation there in "
                                "the current context (cuMemGetAddressRange: " +
                                detail::cu_result_name(r) + ")");
  }
  if (r != CUDA_SUCCESS) detail::throw_cuda_error(r, "cuMemGetAddressRange", __FILE__, __LINE__);
  expect_within(who, p, bytes, base, size, "the device allocation holding it");
}

}  // namespace vibespatial::raster
