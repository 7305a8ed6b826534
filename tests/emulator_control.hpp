// SPDX-License-Identifier: Apache-2.0
// Test helper: the host emulator's control functions (vsr_emulator.h), resolved from the library
// the runtime loaded (VIBESPATIAL_CUDA_DRIVER), so both see the same emulator state.
#pragma once

#include <dlfcn.h>
#include <vsr_emulator.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace vsr_test {

struct Emulator {
  decltype(&vsr_emu_query_outstanding) query_outstanding = nullptr;
  decltype(&vsr_emu_set_fail) set_fail = nullptr;
  decltype(&vsr_emu_call_count) call_count = nullptr;
  decltype(&vsr_emu_set_option) set_option = nullptr;
  decltype(&vsr_emu_stream_pause) stream_pause = nullptr;
  /// Host threads blocked in the emulator until stream work completes (nullptr: an emulator
  /// older than this API).
  decltype(&vsr_emu_waiting_threads) waiting_threads = nullptr;

  /// Everything still outstanding on all devices.
  vsr_emu_outstanding outstanding() const {
    vsr_emu_outstanding o{};
    query_outstanding(&o, -1);
    return o;
  }
};

inline const Emulator& emulator() {
  static const Emulator e = [] {
    const char* path = std::getenv("VIBESPATIAL_CUDA_DRIVER");
    if (path == nullptr) throw std::runtime_error("VIBESPATIAL_CUDA_DRIVER is not set");
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) throw std::runtime_error(std::string("cannot load ") + path);
    Emulator x;
    x.query_outstanding =
        reinterpret_cast<decltype(x.query_outstanding)>(dlsym(h, "vsr_emu_query_outstanding"));
    x.set_fail = reinterpret_cast<decltype(x.set_fail)>(dlsym(h, "vsr_emu_set_fail"));
    x.call_count = reinterpret_cast<decltype(x.call_count)>(dlsym(h, "vsr_emu_call_count"));
    x.set_option = reinterpret_cast<decltype(x.set_option)>(dlsym(h, "vsr_emu_set_option"));
    x.stream_pause = reinterpret_cast<decltype(x.stream_pause)>(dlsym(h, "vsr_emu_stream_pause"));
    x.waiting_threads =
        reinterpret_cast<decltype(x.waiting_threads)>(dlsym(h, "vsr_emu_waiting_threads"));
    if (!x.query_outstanding || !x.set_fail || !x.call_count || !x.set_option || !x.stream_pause) {
      throw std::runtime_error(std::string(path) + " is not the vibespatial-raster emulator");
    }
    return x;
  }();
  return e;
}

}  // namespace vsr_test
