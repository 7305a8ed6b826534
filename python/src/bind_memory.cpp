// SPDX-License-Identifier: Apache-2.0
// vibespatial_raster._core: the driver, the pool (configuration, statistics, OOM handlers),
// device buffers from the pool, copies and stream synchronisation, and PyTorch's allocator entry
// points as PyTorch calls them.
#include "bindings.hpp"

#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/memory_history.hpp>

#include <dlfcn.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

using namespace nb::literals;

extern "C" {
void* vsr_torch_malloc(ssize_t size, int device, CUstream stream);
void vsr_torch_free(void* ptr, ssize_t size, int device, CUstream stream) noexcept;
}

namespace vsr_python {

namespace {

// ---- callbacks into Python -------------------------------------------------------------------

/// Registers `fn(requested_bytes) -> bool` with the pool's OOM chain. A handler that raises an
/// Exception is reported through sys.unraisablehook and counts as having freed nothing; any
/// other BaseException (KeyboardInterrupt, SystemExit, GeneratorExit) leaves the chain as a
/// PyException and comes out of the allocating call (the chain holds no lock while handlers
/// run, and leaves the registry as it was). On an interpreter that is exiting, the handler is
/// not called (freed nothing) and the GIL is not taken.
std::uint64_t add_oom_handler(const nb::callable& fn) {
  auto ref = std::make_shared<PyRef>(nb::borrow<nb::object>(fn));
  return vsr::add_oom_handler([ref](std::size_t requested) -> bool {
    if (!vsr_python::python_alive()) return false;
    try {
      return with_gil([&]() -> bool {
        // Reported after the catch block: sys.unraisablehook may be Python code, which must not
        // run inside a C++ exception handler (see set_package_error).
        std::optional<nb::python_error> failed;
        std::string failed_cpp;
        try {
          return nb::cast<bool>(nb::bool_(ref->get()(requested)));
        } catch (nb::python_error& e) {
          if (!e.matches(PyExc_Exception)) throw;  // a BaseException: the caller's to see
          failed.emplace(std::move(e));
        } catch (const std::exception& e) {
          failed_cpp = e.what();
        }
        // The pool cannot carry an ordinary exception; report it as Python reports errors in
        // callbacks it cannot propagate, and count the handler as having freed nothing.
        if (failed) {
          failed->discard_as_unraisable("vibespatial_raster OOM handler");
        } else {
          PyErr_SetString(PyExc_RuntimeError, failed_cpp.c_str());
          PyErr_WriteUnraisable(ref->get().ptr());
        }
        return false;
      });
    } catch (const vsr_python::InterpreterExiting&) {
      return false;
    }
  });
}

// ---- memory ----------------------------------------------------------------------------------

void put(nb::dict& d, const char* key, const std::optional<std::size_t>& v) {
  if (v) d[key] = *v;
}

/// The seed's dict: tier and configured always; the tier's keys when it reports them; then ours.
/// The seed's fallback tier has used_bytes, free_bytes and total_bytes only: the counts the
/// library also reports there go under names of their own.
nb::dict stats_dict(const vsr::MemoryPoolStats& s) {
  nb::dict d;
  d["tier"] = s.tier;
  d["configured"] = s.configured;
  const bool fallback = s.tier == "fallback";
  put(d, "current_bytes", s.current_bytes);
  put(d, fallback ? "used_count" : "current_count", s.current_count);
  put(d, fallback ? "peak_used_bytes" : "peak_bytes", s.peak_bytes);
  put(d, fallback ? "peak_used_count" : "peak_count", s.peak_count);
  put(d, "total_bytes", s.total_bytes);
  put(d, fallback ? "allocation_count" : "total_count", s.total_count);
  put(d, "pool_size", s.pool_size);
  put(d, "used_bytes", s.used_bytes);
  put(d, "free_bytes", s.free_bytes);
  d["device"] = s.device;
  d["mapped_bytes"] = s.mapped_bytes;
  d["reserved_bytes"] = s.reserved_bytes;
  d["pool_free_bytes"] = s.pool_free_bytes;
  d["largest_free_block"] = s.largest_free_block;
  d["oom_recoveries"] = s.oom_recoveries;
  d["granularity"] = s.granularity;
  d["small_block_limit"] = s.small_block_limit;
  d["tier_reason"] = s.tier_reason;
  nb::dict owners;  // largest first (dicts keep their order)
  for (const vsr::OwnerUsage& o : s.owners) {
    nb::dict u;
    u["live_bytes"] = o.live_bytes;
    u["live_count"] = o.live_count;
    owners[o.owner.c_str()] = u;
  }
  d["owners"] = owners;
  return d;
}

/// Device memory from the pool, freed (stream-ordered, on the stream it was allocated on) when
/// the object goes or close() is called. The owner behind CuPy and Numba allocations.
class DeviceBuffer {
 public:
  /// `owner`: the default owner tag of the block in the memory history (a tag the caller set
  /// wins), or empty.
  DeviceBuffer(std::size_t size, std::uintptr_t stream, const std::string& owner = {})
      : size_(size), stream_(stream) {
    if (owner.empty()) {
      ptr_ = vsr::device_allocate(size, stream_of(stream));
    } else {
      vsr::DefaultMemoryTag tag(owner);
      ptr_ = vsr::device_allocate(size, stream_of(stream));
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    try {
      close();
    } catch (...) {
      // A destructor cannot report; close() only fails for a pointer the pool disowns, which
      // this object never holds.
    }
  }

  /// Frees the memory now; later calls do nothing. Safe from several threads at once (close()
  /// runs without the GIL): exactly one of them frees.
  void close() {
    void* p = ptr_.exchange(nullptr);
    if (p == nullptr) return;
    vsr::device_deallocate(p, size_, stream_of(stream_));
  }

  std::uintptr_t ptr() const { return reinterpret_cast<std::uintptr_t>(ptr_.load()); }
  std::size_t size() const { return size_; }
  std::uintptr_t stream() const { return stream_; }
  bool closed() const { return ptr_.load() == nullptr && size_ != 0; }

 private:
  std::atomic<void*> ptr_{nullptr};
  std::size_t size_ = 0;
  std::uintptr_t stream_ = 0;
};

// ---- PyTorch entry points, called as PyTorch calls them (tests) --------------------------------

/// The address of an exported symbol of this module, as PyTorch's dlopen + dlsym finds it.
void* exported(const char* name) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&exported), &info) == 0 || info.dli_fname == nullptr) {
    throw std::runtime_error("dladdr failed on the extension module");
  }
  void* self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (self == nullptr) throw std::runtime_error(std::string("dlopen: ") + dlerror());
  void* sym = dlsym(self, name);
  dlclose(self);
  if (sym == nullptr) throw std::runtime_error(std::string(name) + " is not exported");
  return sym;
}

}  // namespace

void bind_memory(nb::module_& m) {
  // ---- driver ----
  m.def("driver_info", [] {
    vsr::DriverInfo info;
    {
      GilRelease release;
      info = vsr::driver_info();
    }
    nb::list devices;
    for (const vsr::DeviceInfo& dev : info.devices) {
      nb::dict d;
      d["ordinal"] = dev.ordinal;
      d["name"] = dev.name;
      d["compute_capability"] =
          nb::make_tuple(dev.compute_capability_major, dev.compute_capability_minor);
      d["virtual_memory_management"] = dev.virtual_memory_management;
      d["managed_memory"] = dev.managed_memory;
      d["memory_pools"] = dev.memory_pools;
      d["granularity"] = dev.granularity;
      d["recommended_granularity"] = dev.recommended_granularity;
      d["free_bytes"] = dev.free_bytes;
      d["total_bytes"] = dev.total_bytes;
      devices.append(d);
    }
    nb::dict d;
    d["available"] = info.available;
    d["library"] = info.library;
    d["reason"] = info.reason;
    d["emulated"] = info.emulated;
    d["driver_version"] = info.driver_version;
    d["devices"] = devices;
    return d;
  });

  // ---- memory ----
  m.def("configure_memory_pool", &vsr::configure_memory_pool, nb::call_guard<GilRelease>());
  m.def("free_pool_memory", &vsr::free_pool_memory, nb::call_guard<GilRelease>());
  m.def(
      "forget_stream", [](std::uintptr_t stream) { vsr::forget_stream(stream_of(stream)); },
      "stream"_a, nb::call_guard<GilRelease>());
  m.def(
      "memory_pool_stats",
      [](std::optional<nb::int_> device) {
        vsr::MemoryPoolStats s;
        int overflow = 0;
        const long long d = device ? PyLong_AsLongLongAndOverflow(device->ptr(), &overflow) : 0;
        if (device && (overflow != 0 || d < std::numeric_limits<int>::min() ||
                       d > std::numeric_limits<int>::max())) {
          s.no_such_device = true;
        } else {
          GilRelease release;
          s = device ? vsr::memory_pool_stats(static_cast<int>(d)) : vsr::memory_pool_stats();
        }
        if (s.no_such_device) {
          // As the C ABI (VSR_ERROR_OUT_OF_RANGE), but a ValueError: the argument is wrong.
          vsr::DriverInfo info;
          {
            GilRelease release;
            info = vsr::driver_info();
          }
          const std::size_t n = info.devices.size();
          std::string have =
              !info.available ? "no usable CUDA device (" + info.reason + ")"
              : n == 1        ? std::string("1 device (0)")
                              : std::to_string(n) + " devices (0 to " + std::to_string(n - 1) + ")";
          throw nb::value_error((std::string("memory_pool_stats: device ") +
                                 nb::str(*device).c_str() + " does not exist: this process has " +
                                 have)
                                    .c_str());
        }
        return stats_dict(s);
      },
      "device"_a = nb::none());
  // ---- memory history and snapshots ----
  m.def("record_memory_history", &vsr::record_memory_history, "enabled"_a, "max_entries"_a,
        nb::call_guard<GilRelease>());
  m.def("memory_history_enabled", &vsr::memory_history_enabled);
  m.def(
      "push_memory_tag", [](const std::string& tag) { vsr::push_memory_tag(tag); }, "tag"_a);
  m.def("pop_memory_tag", &vsr::pop_memory_tag);
  m.def("memory_tag_depth", &vsr::memory_tag_depth);
  m.def("current_memory_tag", &vsr::current_memory_tag);
  m.def(
      "memory_history_marker", [](const std::string& name) { vsr::memory_history_marker(name); },
      "name"_a);
  m.def("memory_snapshot_pickle", [] {
    std::string data;
    {
      GilRelease release;
      data = vsr::memory_snapshot_pickle(vsr::memory_snapshot());
    }
    return nb::bytes(data.data(), data.size());
  });
  m.def("dump_memory_snapshot", &vsr::dump_memory_snapshot, "path"_a, "overwrite"_a,
        nb::call_guard<GilRelease>());
  m.attr("MAX_MEMORY_HISTORY_ENTRIES") = vsr::kMaxMemoryHistoryEntries;
  m.attr("MAX_MEMORY_TAG_LENGTH") = vsr::kMaxMemoryTagLength;
  m.def("add_oom_handler", &add_oom_handler, "handler"_a);
  m.def("remove_oom_handler", &vsr::remove_oom_handler, "handler_id"_a);

  nb::class_<DeviceBuffer>(m, "DeviceBuffer")
      .def(
          "__init__",
          [](DeviceBuffer* self, std::size_t size, std::uintptr_t stream,
             std::optional<std::string> owner) {
            GilRelease release;
            new (self) DeviceBuffer(size, stream, owner ? *owner : std::string());
          },
          "size"_a, "stream"_a = 0, "owner"_a = nb::none())
      .def_prop_ro("ptr", &DeviceBuffer::ptr)
      .def_prop_ro("size", &DeviceBuffer::size)
      .def_prop_ro("stream", &DeviceBuffer::stream)
      .def_prop_ro("closed", &DeviceBuffer::closed)
      .def("close", &DeviceBuffer::close, nb::call_guard<GilRelease>());

  m.def(
      "memcpy",
      [](std::uintptr_t dst, std::uintptr_t src, std::size_t bytes, int kind,
         std::uintptr_t stream) {
        check(vsr_memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes,
                         kind, reinterpret_cast<void*>(stream)));
      },
      "dst"_a, "src"_a, "nbytes"_a, "kind"_a, "stream"_a = 0, nb::call_guard<GilRelease>());
  m.def(
      "check_device_range",
      [](std::uintptr_t ptr, std::size_t bytes, const std::string& what) {
        vsr::check_device_range(reinterpret_cast<const void*>(ptr), bytes, what);
      },
      "ptr"_a, "nbytes"_a, "what"_a, nb::call_guard<GilRelease>());
  m.def(
      "stream_synchronize",
      [](std::uintptr_t stream) { check(vsr_stream_synchronize(reinterpret_cast<void*>(stream))); },
      "stream"_a = 0, nb::call_guard<GilRelease>());
  m.attr("COPY_HOST_TO_DEVICE") = static_cast<int>(VSR_COPY_HOST_TO_DEVICE);
  m.attr("COPY_DEVICE_TO_HOST") = static_cast<int>(VSR_COPY_DEVICE_TO_HOST);
  m.attr("COPY_DEVICE_TO_DEVICE") = static_cast<int>(VSR_COPY_DEVICE_TO_DEVICE);

  m.def(
      "torch_malloc",
      [](std::int64_t size, int device, std::uintptr_t stream) {
        auto fn = reinterpret_cast<decltype(&vsr_torch_malloc)>(exported("vsr_torch_malloc"));
        GilRelease release;
        return reinterpret_cast<std::uintptr_t>(
            fn(static_cast<ssize_t>(size), device, stream_of(stream)));
      },
      "size"_a, "device"_a, "stream"_a);
  m.def(
      "torch_free",
      [](std::uintptr_t ptr, std::int64_t size, int device, std::uintptr_t stream) {
        auto fn = reinterpret_cast<decltype(&vsr_torch_free)>(exported("vsr_torch_free"));
        GilRelease release;
        fn(reinterpret_cast<void*>(ptr), static_cast<ssize_t>(size), device, stream_of(stream));
      },
      "ptr"_a, "size"_a, "device"_a, "stream"_a);
}

}  // namespace vsr_python
