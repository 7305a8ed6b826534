// SPDX-License-Identifier: Apache-2.0
// memory.hpp's configuration: the tier a process gets, from its environment variables
// (VIBESPATIAL_GPU_MANAGED_MEMORY, VIBESPATIAL_GPU_POOL_ONLY, VIBESPATIAL_GPU_POOL_RESERVE) and
// what its device supports (VMM, with a self-test; managed memory).
#include "common/expects.hpp"
#include "common/text_escape.hpp"
#include "memory/registry_state.hpp"
#include "memory/vmm_pool_impl.hpp"

#include <vibespatial/raster/memory.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

namespace vibespatial::raster::detail {
namespace {

// A boolean tier variable: unset, or 0/false/no/off, is false; 1/true/yes/on is true (any case).
// Anything else, the empty string included, is an error rather than a silent "off".
bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  throw std::invalid_argument(std::string("configure_memory_pool: ") + name + "=\"" + printable(v) +
                              "\" is not a boolean: set 1, true, yes or on to enable it, 0, false, "
                              "no or off to disable it (any case), or leave it unset");
}

// VIBESPATIAL_GPU_POOL_RESERVE: the VMM pool's slack, a fraction from 0 to 1 written as a
// decimal number ("0.1"); unset or "auto": kDefaultReserve (adaptive). Anything else is an error.
double env_reserve() {
  const char* v = std::getenv("VIBESPATIAL_GPU_POOL_RESERVE");
  if (v == nullptr || std::string_view(v) == "auto") return kDefaultReserve;
  double value = -1;
  std::size_t used = 0;
  try {
    value = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string_view text(v);
  const bool plain = !text.empty() && text.find_first_not_of("0123456789.") == std::string::npos;
  if (!plain || used != text.size() || !(value >= 0 && value <= 1)) {
    throw std::invalid_argument(
        "configure_memory_pool: VIBESPATIAL_GPU_POOL_RESERVE=\"" + printable(v) +
        "\" is not a fraction from 0 to 1: set a decimal number such as 0.1 (10% more pages than "
        "the peak of live large blocks), 0 (no slack), or auto or leave it unset (the adaptive "
        "default)");
  }
  return value;
}

bool device_attribute(int device, CUdevice_attribute attribute) {
  const DriverApi& api = driver();
  CUdevice dev = 0;
  VSR_CU_TRY(api.cuDeviceGet(&dev, device));
  int value = 0;
  VSR_CU_TRY(api.cuDeviceGetAttribute(&value, attribute, dev));
  return value != 0;
}

}  // namespace

const char* tier_name(Tier t) noexcept {
  switch (t) {
    case Tier::a:
      return "A";
    case Tier::b:
      return "B";
    case Tier::c:
      return "C";
    case Tier::fallback:
      return "fallback";
    default:
      return "";
  }
}

// The attribute is not enough (§3.1: some drivers claim VMM and fail the calls), so a one-page
// self-test runs once per device and configuration.
bool device_has_vmm(int device, std::string* why) {
  const std::string name = "device " + std::to_string(device);
  if (!driver().has_vmm()) {
    if (why) *why = "the driver lacks the virtual memory management entry points";
    return false;
  }
  if (!device_attribute(device, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)) {
    if (why) {
      *why = name +
             " does not support virtual memory management "
             "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)";
    }
    return false;
  }
  Registry& r = registry();
  const auto d = static_cast<std::size_t>(device);
  if (device >= 0 && device < kMaxDevices && r.vmm_checked[d] == 0) {
    r.vmm_failure[d] = vmm_self_test(device);
    r.vmm_checked[d] = r.vmm_failure[d].empty() ? 1 : 2;
  }
  if (device >= 0 && device < kMaxDevices && r.vmm_checked[d] == 2) {
    if (why) {
      *why = name + " claims virtual memory management support, but its VMM self-test failed (" +
             r.vmm_failure[d] + ")";
    }
    return false;
  }
  return true;
}

void set_reason(int device, std::string text) {
  if (device < 0 || device >= kMaxDevices) return;
  Registry& r = registry();
  auto& slot = r.reasons[static_cast<std::size_t>(device)];
  if (slot.load(std::memory_order_relaxed) != nullptr) return;
  r.reason_text.push_back(std::move(text));
  slot.store(&r.reason_text.back(), std::memory_order_release);
}

}  // namespace vibespatial::raster::detail

namespace vibespatial::raster {

using detail::registry;
using detail::Tier;

std::string configure_memory_pool() {
  if (detail::in_forked_child()) [[unlikely]]
    detail::throw_forked_child(__func__);
  detail::Registry& r = registry();
  Tier t = detail::current_tier();
  if (t != Tier::none) return detail::tier_name(t);
  detail::note_pool_use();
  std::lock_guard lock(r.config_mutex);
  t = detail::current_tier();
  if (t != Tier::none) return detail::tier_name(t);

  // Both variables are checked, whichever wins: a value that means nothing is an error.
  const bool managed = detail::env_flag("VIBESPATIAL_GPU_MANAGED_MEMORY");
  const bool pool_only = detail::env_flag("VIBESPATIAL_GPU_POOL_ONLY");
  const double reserve = detail::env_reserve();
  detail::driver();  // throws DriverUnavailableError, saying why
  const int device = detail::bind_current_device();
  if (managed) {
    if (!detail::driver().cuMemAllocManaged ||
        !detail::device_attribute(device, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)) {
      throw CudaError(CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
                      "VIBESPATIAL_GPU_MANAGED_MEMORY=1 asks for tier C, but device " +
                          std::to_string(device) + " does not support managed memory");
    }
    if (pool_only) {
      std::fprintf(stderr,
                   "vibespatial-raster: warning: VIBESPATIAL_GPU_MANAGED_MEMORY=\"%s\" and "
                   "VIBESPATIAL_GPU_POOL_ONLY=\"%s\" are both set: tier C (managed memory) wins, "
                   "VIBESPATIAL_GPU_POOL_ONLY is ignored\n",
                   detail::printable(std::getenv("VIBESPATIAL_GPU_MANAGED_MEMORY")).c_str(),
                   detail::printable(std::getenv("VIBESPATIAL_GPU_POOL_ONLY")).c_str());
    }
    t = Tier::c;
    detail::set_reason(device, pool_only ? "VIBESPATIAL_GPU_MANAGED_MEMORY is set: managed memory "
                                           "(tier C; VIBESPATIAL_GPU_POOL_ONLY is ignored)"
                                         : "VIBESPATIAL_GPU_MANAGED_MEMORY is set: managed memory "
                                           "(tier C)");
  } else if (pool_only) {
    std::string why;
    if (!detail::device_has_vmm(device, &why)) {
      if (device >= 0 && device < detail::kMaxDevices) {
        r.vmm_checked[static_cast<std::size_t>(device)] =
            0;  // nothing cached: a later call retries
      }
      throw CudaError(CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
                      "VIBESPATIAL_GPU_POOL_ONLY=1 asks for tier A, but " + why);
    }
    t = Tier::a;
    detail::set_reason(
        device, "VIBESPATIAL_GPU_POOL_ONLY is set: the VMM pool without OOM recovery (tier A)");
  } else {
    std::string why;
    t = detail::device_has_vmm(device, &why) ? Tier::b : Tier::fallback;
    detail::set_reason(device, t == Tier::fallback
                                   ? why + ": a caching pool over cuMemAlloc (fallback)"
                                   : "the device supports virtual memory management: the VMM pool "
                                     "with OOM recovery (tier B)");
  }
  r.reserve = reserve;
  r.tier.store(static_cast<int>(t), std::memory_order_release);
  return detail::tier_name(t);
}

}  // namespace vibespatial::raster
