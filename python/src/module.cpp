// SPDX-License-Identifier: Apache-2.0
// vibespatial_raster._core: the nanobind bindings of the C++ library, used by the package's
// Python modules (memory, dispatch, buffers, ops, io, allocators). Private: names and
// signatures here may change with the Python modules; users import those.
//
// Conventions
// - The GIL is released around every call that can take long (copies, ops, dispatch, I/O, pool
//   configuration and trimming, device allocation) and taken again only to call back into
//   Python (band ops, OOM handlers, progress callbacks).
// - Errors: the library's CudaError / DriverUnavailableError / OutOfMemoryError become the
//   package's classes of the same names (vibespatial_raster._errors); std::invalid_argument ->
//   ValueError, std::out_of_range -> IndexError, std::overflow_error -> OverflowError (nanobind's
//   defaults); a wrong argument type -> TypeError.
// - dtypes cross as numpy names ("float32"), residencies as "host" / "device", streams and
//   pointers as integers (a CUstream value; 0 is the legacy default stream).
// - Rasters (vsr::OwnedRasterArray, Python name Raster) are handles: copies share storage. No
//   binding changes the residency of a storage in place: moving makes a new storage, so a NumPy
//   view or a device view of the old one stays valid for as long as it holds its handle.
#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/c_api.h>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/ops.hpp>

#include <dlfcn.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <sys/types.h>

#include <array>
#include <atomic>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace nb = nanobind;
namespace vsr = vibespatial::raster;
using namespace nb::literals;

extern "C" {
void* vsr_torch_malloc(ssize_t size, int device, CUstream stream);
void vsr_torch_free(void* ptr, ssize_t size, int device, CUstream stream) noexcept;
}

namespace {

using Raster = vsr::OwnedRasterArray;
using AffineTuple = std::array<double, 6>;

// ---- Python references held by C++ ----------------------------------------------------------

/// Whether Python objects may still be touched: the interpreter runs and is not finalizing.
bool python_alive() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() != 0 && Py_IsFinalizing() == 0;
#else
  return Py_IsInitialized() != 0 && _Py_IsFinalizing() == 0;
#endif
}

/// A Python object owned by C++ code that may drop it on any thread, even after the interpreter
/// is gone (the pool's handler registry is a static): released under the GIL while Python
/// runs, leaked afterwards.
class PyRef {
 public:
  explicit PyRef(nb::object obj) : obj_(std::move(obj)) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() {
    if (!obj_.is_valid()) return;
    if (python_alive()) {
      nb::gil_scoped_acquire gil;
      obj_.reset();
    } else {
      (void)obj_.release();
    }
  }
  const nb::object& get() const noexcept { return obj_; }

 private:
  nb::object obj_;
};

// ---- errors ----------------------------------------------------------------------------------

/// Raises vibespatial_raster._errors.<name>(*args) as the pending Python error.
void set_package_error(const char* name, const nb::tuple& args) {
  try {
    nb::object cls = nb::module_::import_("vibespatial_raster._errors").attr(name);
    nb::object instance = cls(*args);
    PyErr_SetObject(cls.ptr(), instance.ptr());
  } catch (nb::python_error& e) {
    e.restore();
  }
}

void translate_exception(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const vsr::DriverUnavailableError& e) {
    set_package_error("DriverUnavailableError", nb::make_tuple(e.what(), e.code(), e.name()));
  } catch (const vsr::CudaError& e) {
    set_package_error("CudaError", nb::make_tuple(e.what(), e.code(), e.name()));
  } catch (const vsr::OutOfMemoryError& e) {
    set_package_error("OutOfMemoryError", nb::make_tuple(e.what(), e.requested_bytes()));
  } catch (const std::system_error& e) {
    // An errno (a missing file): OSError(errno, message) is the errno's subclass, e.g.
    // FileNotFoundError. Other categories fall through to nanobind's RuntimeError.
    if (e.code().category() != std::generic_category() &&
        e.code().category() != std::system_category()) {
      throw;
    }
    try {
      nb::object error = nb::handle(PyExc_OSError)(e.code().value(), e.what());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    } catch (nb::python_error& pe) {
      pe.restore();
    }
  }
}

/// The CUresult enumerator name in a C ABI error message ("CUDA_ERROR_..."), or "".
std::string cuda_error_name(const std::string& message) {
  const std::size_t at = message.find("CUDA_ERROR_");
  if (at == std::string::npos) return {};
  std::size_t end = at;
  while (end < message.size() &&
         (std::isupper(static_cast<unsigned char>(message[end])) != 0 ||
          std::isdigit(static_cast<unsigned char>(message[end])) != 0 || message[end] == '_')) {
    ++end;
  }
  return message.substr(at, end - at);
}

/// Turns a failed C ABI status into the library's C++ exception, so it maps like any other.
void check(vsr_status status) {
  if (status == VSR_OK) return;
  const std::string message = vsr_last_error_message();
  const int code = vsr_last_cuda_error();
  switch (status) {
    case VSR_ERROR_INVALID_ARGUMENT:
      throw std::invalid_argument(message);
    case VSR_ERROR_OUT_OF_MEMORY:
      throw vsr::OutOfMemoryError(0, message);
    case VSR_ERROR_CUDA:
      throw vsr::CudaError(code, cuda_error_name(message), message);
    case VSR_ERROR_NO_DRIVER:
      throw vsr::DriverUnavailableError(code, cuda_error_name(message), message);
    case VSR_ERROR_OVERFLOW:
      throw std::overflow_error(message);
    case VSR_ERROR_OUT_OF_RANGE:
      throw std::out_of_range(message);
    default:
      throw std::runtime_error(message);
  }
}

// ---- conversions -----------------------------------------------------------------------------

vsr::DType dtype_of(const std::string& name) {
  const std::optional<vsr::DType> d = vsr::dtype_from_string(name);
  if (!d) {
    throw nb::type_error(("unsupported raster dtype '" + name +
                          "': expected one of uint8, int8, uint16, int16, uint32, int32, uint64, "
                          "int64, float32, float64")
                             .c_str());
  }
  return *d;
}

std::string dtype_name(vsr::DType d) {
  return std::string(vsr::to_string(d));
}

vsr::Residency residency_of(const std::string& name) {
  if (name == "host") return vsr::Residency::host;
  if (name == "device") return vsr::Residency::device;
  throw std::invalid_argument("residency must be 'host' or 'device', not '" + name + "'");
}

const char* residency_name(vsr::Residency r) {
  return r == vsr::Residency::host ? "host" : "device";
}

vsr::TilingStrategy strategy_of(const std::string& name) {
  if (name == "whole") return vsr::TilingStrategy::whole;
  if (name == "band_batches") return vsr::TilingStrategy::band_batches;
  if (name == "tiled") return vsr::TilingStrategy::tiled;
  throw std::invalid_argument("strategy must be 'whole', 'band_batches' or 'tiled', not '" + name +
                              "'");
}

vsr::EdgeMode edge_of(const std::string& name) {
  if (name == "nearest") return vsr::EdgeMode::nearest;
  if (name == "reflect") return vsr::EdgeMode::reflect;
  if (name == "constant_nodata") return vsr::EdgeMode::constant_nodata;
  throw std::invalid_argument("edge must be 'nearest', 'reflect' or 'constant_nodata', not '" +
                              name + "'");
}

vsr::Affine affine_of(const AffineTuple& t) {
  return vsr::Affine{t[0], t[1], t[2], t[3], t[4], t[5]};
}

AffineTuple tuple_of(const vsr::Affine& a) {
  return {a.a, a.b, a.c, a.d, a.e, a.f};
}

CUstream stream_of(std::uintptr_t s) {
  return reinterpret_cast<CUstream>(s);
}

/// DLPack (code, bits) -> our dtype name; throws TypeError for the others.
std::string dtype_from_dlpack(const nb::dlpack::dtype& t) {
  if (t.lanes != 1) throw nb::type_error("vector (multi-lane) DLPack dtypes are not supported");
  const auto code = static_cast<nb::dlpack::dtype_code>(t.code);
  std::string base;
  if (code == nb::dlpack::dtype_code::Int) base = "int";
  if (code == nb::dlpack::dtype_code::UInt) base = "uint";
  if (code == nb::dlpack::dtype_code::Float && (t.bits == 32 || t.bits == 64)) base = "float";
  if (base.empty() ||
      (base != "float" && t.bits != 8 && t.bits != 16 && t.bits != 32 && t.bits != 64)) {
    throw nb::type_error(("unsupported DLPack dtype (code " + std::to_string(t.code) + ", " +
                          std::to_string(t.bits) + " bits)")
                             .c_str());
  }
  return base + std::to_string(t.bits);
}

nb::dlpack::dtype dlpack_of(vsr::DType d) {
  const auto bits = static_cast<std::uint8_t>(vsr::itemsize(d) * 8);
  nb::dlpack::dtype t;
  t.bits = bits;
  t.lanes = 1;
  switch (d) {
    case vsr::DType::float32:
    case vsr::DType::float64:
      t.code = static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float);
      break;
    case vsr::DType::int8:
    case vsr::DType::int16:
    case vsr::DType::int32:
    case vsr::DType::int64:
      t.code = static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int);
      break;
    default:
      t.code = static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt);
      break;
  }
  return t;
}

// ---- callbacks into Python -------------------------------------------------------------------

/// A BandOp that calls `fn(Raster) -> Raster` under the GIL. The dispatchers may call it from
/// worker threads (dispatch_per_band_cpu) and copy it freely; the Python reference goes with the
/// last copy.
vsr::BandOp band_op(const nb::callable& fn) {
  auto ref = std::make_shared<PyRef>(nb::borrow<nb::object>(fn));
  return [ref](const Raster& band) -> Raster {
    nb::gil_scoped_acquire gil;
    nb::object arg = nb::cast(band, nb::rv_policy::copy);
    nb::object result = ref->get()(arg);
    if (!nb::isinstance<Raster>(result)) {
      throw nb::type_error("the band operation must return a Raster (internal adapter error)");
    }
    return nb::cast<Raster>(result);
  };
}

std::uint64_t add_oom_handler(const nb::callable& fn) {
  auto ref = std::make_shared<PyRef>(nb::borrow<nb::object>(fn));
  return vsr::add_oom_handler([ref](std::size_t requested) -> bool {
    if (!python_alive()) return false;
    nb::gil_scoped_acquire gil;
    try {
      return nb::cast<bool>(nb::bool_(ref->get()(requested)));
    } catch (nb::python_error& e) {
      // The pool cannot carry a Python exception; report it as Python reports errors in
      // callbacks it cannot propagate, and count the handler as having freed nothing.
      e.discard_as_unraisable("vibespatial_raster OOM handler");
      return false;
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      PyErr_WriteUnraisable(ref->get().ptr());
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
  return d;
}

/// Device memory from the pool, freed (stream-ordered, on the stream it was allocated on) when
/// the object goes or close() is called. The owner behind CuPy and Numba allocations.
class DeviceBuffer {
 public:
  DeviceBuffer(std::size_t size, std::uintptr_t stream) : size_(size), stream_(stream) {
    ptr_ = vsr::device_allocate(size, stream_of(stream));
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

// ---- rasters ---------------------------------------------------------------------------------

Raster raster_from_host(const nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>& data,
                        const std::string& dtype, int bands, std::int64_t height,
                        std::int64_t width, std::optional<double> nodata, const AffineTuple& affine,
                        std::string crs) {
  const vsr::DType d = dtype_of(dtype);
  if (data.itemsize() != vsr::itemsize(d)) {
    throw std::invalid_argument("from_host: the array's itemsize (" +
                                std::to_string(data.itemsize()) + ") is not that of " + dtype);
  }
  if (bands <= 0 || height <= 0 || width <= 0) {
    throw std::invalid_argument("from_host: bands, height and width must be positive");
  }
  const std::size_t expected = static_cast<std::size_t>(bands) * static_cast<std::size_t>(height) *
                               static_cast<std::size_t>(width);
  if (data.size() != expected) {
    throw std::invalid_argument("from_host: the array has " + std::to_string(data.size()) +
                                " elements, the raster " + std::to_string(expected));
  }
  const void* p = data.data();
  nb::gil_scoped_release release;
  return Raster::from_host(p, d, bands, height, width, nodata, affine_of(affine), std::move(crs));
}

/// A copy of `r` with residency `target`, in new storage (the old storage stays as it is).
Raster copy_to(const Raster& r, vsr::Residency target) {
  Raster out = Raster::allocate(target, r.dtype(), r.band_count(), r.height(), r.width(),
                                r.nodata(), r.affine(), r.crs());
  if (target == vsr::Residency::host) {
    r.copy_to_host(out.mutable_host_data());
  } else if (r.residency() == vsr::Residency::host) {
    check(vsr_memcpy(out.device_data(), r.host_data(), r.byte_size(), VSR_COPY_HOST_TO_DEVICE,
                     nullptr));
  } else {
    check(vsr_memcpy(out.device_data(), r.device_pointer(), r.byte_size(),
                     VSR_COPY_DEVICE_TO_DEVICE, nullptr));
  }
  return out;
}

nb::tuple metadata_tuple(const vsr::RasterMetadata& m) {
  return nb::make_tuple(m.height, m.width, m.band_count, dtype_name(m.dtype), m.nodata,
                        tuple_of(m.affine), m.crs, m.driver);
}

vsr::RasterMetadata metadata_of(std::int64_t height, std::int64_t width, int band_count,
                                const std::string& dtype, std::optional<double> nodata,
                                const AffineTuple& affine, std::string crs, std::string driver) {
  vsr::RasterMetadata m;
  m.height = height;
  m.width = width;
  m.band_count = band_count;
  m.dtype = dtype_of(dtype);
  m.nodata = nodata;
  m.affine = affine_of(affine);
  m.crs = std::move(crs);
  m.driver = std::move(driver);
  return m;
}

nb::tuple plan_tuple(const vsr::RasterPlan& p) {
  nb::object tile = nb::none();
  if (p.tile_shape) tile = nb::make_tuple(p.tile_shape->first, p.tile_shape->second);
  return nb::make_tuple(std::string(vsr::to_string(p.strategy)), tile, p.halo, p.n_tiles,
                        p.estimated_vram_per_tile, p.bands_per_pass, p.fits_budget);
}

vsr::RasterPlan plan_of(const std::string& strategy,
                        std::optional<std::pair<std::int64_t, std::int64_t>> tile_shape, int halo,
                        std::int64_t n_tiles, std::uint64_t estimate, int bands_per_pass,
                        bool fits_budget) {
  vsr::RasterPlan p;
  p.strategy = strategy_of(strategy);
  p.tile_shape = tile_shape;
  p.halo = halo;
  p.n_tiles = n_tiles;
  p.estimated_vram_per_tile = estimate;
  p.bands_per_pass = bands_per_pass;
  p.fits_budget = fits_budget;
  return p;
}

vsr::PlanOptions plan_options(int band_count, int buffers_per_band, std::uint64_t scratch_bytes,
                              int halo, std::optional<std::uint64_t> vram_budget, bool per_band) {
  vsr::PlanOptions o;
  o.band_count = band_count;
  o.buffers_per_band = buffers_per_band;
  o.scratch_bytes = scratch_bytes;
  o.halo = halo;
  o.vram_budget = vram_budget;
  o.per_band = per_band;
  return o;
}

vsr::WriteOptions write_options(const std::string& driver, const std::string& compress, bool tiled,
                                int block) {
  vsr::WriteOptions o;
  o.driver = driver;
  o.compress = compress;
  o.tiled = tiled;
  o.block = block;
  return o;
}

/// A zero-copy array object (nanobind's, speaking DLPack and, on the host, the buffer protocol)
/// over `ptr`, kept alive by `owner`.
nb::object array_view(std::uintptr_t ptr, const std::vector<std::size_t>& shape,
                      const std::string& dtype, int device_type, int device_id,
                      const nb::object& owner, bool writable) {
  const nb::dlpack::dtype t = dlpack_of(dtype_of(dtype));
  if (writable) {
    nb::ndarray<nb::array_api> a(reinterpret_cast<void*>(ptr), shape.size(), shape.data(), owner,
                                 nullptr, t, device_type, device_id);
    return nb::cast(a, nb::rv_policy::reference);
  }
  nb::ndarray<nb::array_api, nb::ro> a(reinterpret_cast<const void*>(ptr), shape.size(),
                                       shape.data(), owner, nullptr, t, device_type, device_id);
  return nb::cast(a, nb::rv_policy::reference);
}

/// Reads a DLPack capsule: (owner, ptr, shape, strides in elements, dtype name, device type,
/// device id). The owner (nanobind's array object) keeps the producer's tensor alive and calls
/// its deleter when it goes.
nb::tuple import_dlpack(const nb::ndarray<>& a) {
  std::vector<std::int64_t> shape(a.ndim());
  std::vector<std::int64_t> strides(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<std::int64_t>(a.shape(i));
    strides[i] = a.stride_ptr() != nullptr ? a.stride(i) : 0;
  }
  if (a.stride_ptr() == nullptr) {  // DLPack: NULL strides mean compact row-major
    std::int64_t s = 1;
    for (std::size_t i = a.ndim(); i-- > 0;) {
      strides[i] = s;
      s *= shape[i];
    }
  }
  const std::string dtype = dtype_from_dlpack(a.dtype());
  nb::object owner = nb::cast(nb::ndarray<nb::array_api>(a), nb::rv_policy::reference);
  return nb::make_tuple(owner, reinterpret_cast<std::uintptr_t>(a.data()), shape, strides, dtype,
                        a.device_type(), a.device_id());
}

/// The histogram counts[band][bin] as a (bands, bins) int64 NumPy array.
nb::object histogram_array(const std::vector<std::vector<std::int64_t>>& counts, int bins) {
  auto* flat = new std::vector<std::int64_t>();
  flat->reserve(counts.size() * static_cast<std::size_t>(bins));
  for (const auto& band : counts) flat->insert(flat->end(), band.begin(), band.end());
  nb::capsule owner(flat,
                    [](void* p) noexcept { delete static_cast<std::vector<std::int64_t>*>(p); });
  const std::size_t shape[2] = {counts.size(), static_cast<std::size_t>(bins)};
  nb::ndarray<nb::numpy, std::int64_t> a(flat->data(), 2, shape, owner);
  return nb::cast(a, nb::rv_policy::reference);
}

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

NB_MODULE(_core, m) {
  m.doc() = "Bindings of the vibespatial-raster C++ library (private: use the package's modules).";
  nb::register_exception_translator(translate_exception, nullptr);

  m.attr("__version__") = vsr_version();

  // ---- driver ----
  m.def("driver_info", [] {
    vsr::DriverInfo info;
    {
      nb::gil_scoped_release release;
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
  m.def("configure_memory_pool", &vsr::configure_memory_pool,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("free_pool_memory", &vsr::free_pool_memory, nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "forget_stream", [](std::uintptr_t stream) { vsr::forget_stream(stream_of(stream)); },
      "stream"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "memory_pool_stats",
      [](std::optional<int> device) {
        vsr::MemoryPoolStats s;
        {
          nb::gil_scoped_release release;
          s = device ? vsr::memory_pool_stats(*device) : vsr::memory_pool_stats();
        }
        return stats_dict(s);
      },
      "device"_a = nb::none());
  m.def("add_oom_handler", &add_oom_handler, "handler"_a);
  m.def("remove_oom_handler", &vsr::remove_oom_handler, "handler_id"_a);

  nb::class_<DeviceBuffer>(m, "DeviceBuffer")
      .def(
          "__init__",
          [](DeviceBuffer* self, std::size_t size, std::uintptr_t stream) {
            nb::gil_scoped_release release;
            new (self) DeviceBuffer(size, stream);
          },
          "size"_a, "stream"_a = 0)
      .def_prop_ro("ptr", &DeviceBuffer::ptr)
      .def_prop_ro("size", &DeviceBuffer::size)
      .def_prop_ro("stream", &DeviceBuffer::stream)
      .def_prop_ro("closed", &DeviceBuffer::closed)
      .def("close", &DeviceBuffer::close, nb::call_guard<nb::gil_scoped_release>());

  m.def(
      "memcpy",
      [](std::uintptr_t dst, std::uintptr_t src, std::size_t bytes, int kind,
         std::uintptr_t stream) {
        check(vsr_memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes,
                         kind, reinterpret_cast<void*>(stream)));
      },
      "dst"_a, "src"_a, "nbytes"_a, "kind"_a, "stream"_a = 0,
      nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "stream_synchronize",
      [](std::uintptr_t stream) { check(vsr_stream_synchronize(reinterpret_cast<void*>(stream))); },
      "stream"_a = 0, nb::call_guard<nb::gil_scoped_release>());
  m.attr("COPY_HOST_TO_DEVICE") = static_cast<int>(VSR_COPY_HOST_TO_DEVICE);
  m.attr("COPY_DEVICE_TO_HOST") = static_cast<int>(VSR_COPY_DEVICE_TO_HOST);
  m.attr("COPY_DEVICE_TO_DEVICE") = static_cast<int>(VSR_COPY_DEVICE_TO_DEVICE);

  m.def("array_view", &array_view, "ptr"_a, "shape"_a, "dtype"_a, "device_type"_a, "device_id"_a,
        "owner"_a, "writable"_a);
  m.def("import_dlpack", &import_dlpack, "capsule"_a);

  m.def(
      "torch_malloc",
      [](std::int64_t size, int device, std::uintptr_t stream) {
        auto fn = reinterpret_cast<decltype(&vsr_torch_malloc)>(exported("vsr_torch_malloc"));
        nb::gil_scoped_release release;
        return reinterpret_cast<std::uintptr_t>(
            fn(static_cast<ssize_t>(size), device, stream_of(stream)));
      },
      "size"_a, "device"_a, "stream"_a);
  m.def(
      "torch_free",
      [](std::uintptr_t ptr, std::int64_t size, int device, std::uintptr_t stream) {
        auto fn = reinterpret_cast<decltype(&vsr_torch_free)>(exported("vsr_torch_free"));
        nb::gil_scoped_release release;
        fn(reinterpret_cast<void*>(ptr), static_cast<ssize_t>(size), device, stream_of(stream));
      },
      "ptr"_a, "size"_a, "device"_a, "stream"_a);

  // ---- budget and planning ----
  m.def("available_vram_bytes", &vsr::available_vram_bytes,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("usable_vram_budget", &vsr::usable_vram_budget, "vram_budget"_a);
  m.def(
      "max_bands_for_budget",
      [](std::int64_t height, std::int64_t width, const std::string& dtype, int buffers_per_band,
         std::uint64_t scratch_bytes, std::optional<std::uint64_t> vram_budget) {
        const vsr::DType d = dtype_of(dtype);
        nb::gil_scoped_release release;
        return vsr::max_bands_for_budget(height, width, d, buffers_per_band, scratch_bytes,
                                         vram_budget);
      },
      "height"_a, "width"_a, "dtype"_a, "buffers_per_band"_a, "scratch_bytes"_a,
      "vram_budget"_a.none());
  m.def(
      "analyze_raster_plan",
      [](std::int64_t height, std::int64_t width, const std::string& dtype, int band_count,
         int buffers_per_band, std::uint64_t scratch_bytes, int halo,
         std::optional<std::uint64_t> vram_budget, bool per_band) {
        const vsr::DType d = dtype_of(dtype);
        vsr::RasterPlan p;
        {
          nb::gil_scoped_release release;
          p = vsr::analyze_raster_plan(height, width, d,
                                       plan_options(band_count, buffers_per_band, scratch_bytes,
                                                    halo, vram_budget, per_band));
        }
        return plan_tuple(p);
      },
      "height"_a, "width"_a, "dtype"_a, "band_count"_a, "buffers_per_band"_a, "scratch_bytes"_a,
      "halo"_a, "vram_budget"_a.none(), "per_band"_a);
  m.def(
      "plan_from_metadata",
      [](std::int64_t height, std::int64_t width, int band_count, const std::string& dtype,
         int buffers_per_band, std::uint64_t scratch_bytes, int halo,
         std::optional<std::uint64_t> vram_budget, bool per_band) {
        vsr::RasterMetadata meta = metadata_of(height, width, band_count, dtype, {}, {}, {}, {});
        vsr::RasterPlan p;
        {
          nb::gil_scoped_release release;
          p = vsr::plan_from_metadata(
              meta, plan_options(1, buffers_per_band, scratch_bytes, halo, vram_budget, per_band));
        }
        return plan_tuple(p);
      },
      "height"_a, "width"_a, "band_count"_a, "dtype"_a, "buffers_per_band"_a, "scratch_bytes"_a,
      "halo"_a, "vram_budget"_a.none(), "per_band"_a);
  m.def(
      "metadata_bounds",
      [](std::int64_t height, std::int64_t width, const AffineTuple& affine) {
        vsr::RasterMetadata meta;
        meta.height = height;
        meta.width = width;
        meta.affine = affine_of(affine);
        const vsr::RasterBounds b = meta.bounds();
        return nb::make_tuple(b.left, b.bottom, b.right, b.top);
      },
      "height"_a, "width"_a, "affine"_a);
  m.def(
      "same_nodata",
      [](std::optional<double> a, std::optional<double> b) { return vsr::same_nodata(a, b); },
      "a"_a.none(), "b"_a.none());
  m.def(
      "itemsize", [](const std::string& dtype) { return vsr::itemsize(dtype_of(dtype)); },
      "dtype"_a);

  // ---- rasters ----
  nb::class_<Raster>(m, "Raster")
      .def_static("from_host", &raster_from_host, "data"_a, "dtype"_a, "bands"_a, "height"_a,
                  "width"_a, "nodata"_a.none(), "affine"_a, "crs"_a)
      .def_static(
          "allocate",
          [](const std::string& residency, const std::string& dtype, int bands, std::int64_t height,
             std::int64_t width, std::optional<double> nodata, const AffineTuple& affine,
             std::string crs) {
            const vsr::Residency where = residency_of(residency);
            const vsr::DType d = dtype_of(dtype);
            nb::gil_scoped_release release;
            return Raster::allocate(where, d, bands, height, width, nodata, affine_of(affine),
                                    std::move(crs));
          },
          "residency"_a, "dtype"_a, "bands"_a, "height"_a, "width"_a, "nodata"_a.none(), "affine"_a,
          "crs"_a)
      .def_static(
          "from_device_memory",
          [](std::uintptr_t ptr, const std::string& dtype, int bands, std::int64_t height,
             std::int64_t width, std::optional<double> nodata, const AffineTuple& affine,
             std::string crs, std::uintptr_t stream) {
            const vsr::DType d = dtype_of(dtype);
            if (ptr == 0) throw std::invalid_argument("from_device: null device pointer");
            nb::gil_scoped_release release;
            Raster out = Raster::allocate(vsr::Residency::device, d, bands, height, width, nodata,
                                          affine_of(affine), std::move(crs));
            check(vsr_memcpy(out.device_data(), reinterpret_cast<const void*>(ptr), out.byte_size(),
                             VSR_COPY_DEVICE_TO_DEVICE, reinterpret_cast<void*>(stream)));
            return out;
          },
          "ptr"_a, "dtype"_a, "bands"_a, "height"_a, "width"_a, "nodata"_a.none(), "affine"_a,
          "crs"_a, "stream"_a)
      .def_static(
          "from_band_stack",
          [](const std::vector<Raster>& bands, const Raster& source) {
            nb::gil_scoped_release release;
            return Raster::from_band_stack(bands, source);
          },
          "bands"_a, "source"_a)
      .def_static(
          "with_georeferencing",
          [](const Raster& r, std::optional<double> nodata, const AffineTuple& affine,
             std::string crs) {
            // A 1x1 source carrying the georeferencing: from_band_stack gives a single result
            // the source's metadata while sharing the result's pixels.
            const unsigned char zero[8] = {};
            Raster source = Raster::from_host(zero, r.dtype(), 1, 1, 1, nodata, affine_of(affine),
                                              std::move(crs));
            return Raster::from_band_stack({r}, source);
          },
          "raster"_a, "nodata"_a.none(), "affine"_a, "crs"_a)
      .def_prop_ro("band_count", &Raster::band_count)
      .def_prop_ro("height", &Raster::height)
      .def_prop_ro("width", &Raster::width)
      .def_prop_ro("dtype", [](const Raster& r) { return dtype_name(r.dtype()); })
      .def_prop_ro("nodata", &Raster::nodata)
      .def_prop_ro("affine", [](const Raster& r) { return tuple_of(r.affine()); })
      .def_prop_ro("crs", &Raster::crs)
      .def_prop_ro("residency", [](const Raster& r) { return residency_name(r.residency()); })
      .def_prop_ro("byte_size", &Raster::byte_size)
      .def_prop_ro("host_pointer",
                   [](const Raster& r) { return reinterpret_cast<std::uintptr_t>(r.host_data()); })
      .def_prop_ro(
          "device_pointer",
          [](const Raster& r) { return reinterpret_cast<std::uintptr_t>(r.device_pointer()); })
      .def("metadata", [](const Raster& r) { return metadata_tuple(r.metadata()); })
      .def("band", &Raster::band, "index"_a)
      .def(
          "copy_to",
          [](const Raster& r, const std::string& residency) {
            const vsr::Residency target = residency_of(residency);
            nb::gil_scoped_release release;
            return copy_to(r, target);
          },
          "residency"_a)
      .def(
          "copy_to_host_buffer",
          [](const Raster& r, const nb::ndarray<nb::c_contig, nb::device::cpu>& out) {
            if (out.nbytes() != r.byte_size()) {
              throw std::invalid_argument("copy_to_host_buffer: the buffer has " +
                                          std::to_string(out.nbytes()) + " bytes, the raster " +
                                          std::to_string(r.byte_size()));
            }
            void* dst = out.data();
            nb::gil_scoped_release release;
            r.copy_to_host(dst);
          },
          "out"_a);

  // ---- dispatch ----
  m.def(
      "dispatch_per_band_cpu",
      [](const Raster& r, const nb::callable& fn) {
        const vsr::BandOp op = band_op(fn);
        nb::gil_scoped_release release;
        return vsr::dispatch_per_band_cpu(r, op);
      },
      "raster"_a, "op"_a);
  m.def(
      "dispatch_per_band_gpu",
      [](const Raster& r, const nb::callable& fn, int buffers_per_band,
         std::uint64_t scratch_bytes) {
        const vsr::BandOp op = band_op(fn);
        nb::gil_scoped_release release;
        return vsr::dispatch_per_band_gpu(r, op, buffers_per_band, scratch_bytes);
      },
      "raster"_a, "op"_a, "buffers_per_band"_a, "scratch_bytes"_a);
  m.def(
      "dispatch_tiled",
      [](const Raster& r, const nb::callable& fn, const std::string& strategy,
         std::optional<std::pair<std::int64_t, std::int64_t>> tile_shape, int halo,
         std::int64_t n_tiles, std::uint64_t estimate, int bands_per_pass, bool fits,
         bool with_halo) {
        const vsr::BandOp op = band_op(fn);
        const vsr::RasterPlan plan =
            plan_of(strategy, tile_shape, halo, n_tiles, estimate, bands_per_pass, fits);
        nb::gil_scoped_release release;
        return with_halo ? vsr::dispatch_tiled_halo(r, op, plan) : vsr::dispatch_tiled(r, op, plan);
      },
      "raster"_a, "op"_a, "strategy"_a, "tile_shape"_a.none(), "halo"_a, "n_tiles"_a, "estimate"_a,
      "bands_per_pass"_a, "fits_budget"_a, "with_halo"_a);

  // ---- ops ----
  m.def("ops_built_with_cuda", &vsr::ops_built_with_cuda);
  m.def(
      "compute_dtype",
      [](const std::string& dtype) { return dtype_name(vsr::compute_dtype(dtype_of(dtype))); },
      "dtype"_a);
  m.def(
      "band_statistics",
      [](const Raster& r) {
        std::vector<vsr::BandStatistics> stats;
        {
          nb::gil_scoped_release release;
          stats = vsr::band_statistics(r);
        }
        nb::list out;
        for (const vsr::BandStatistics& s : stats) {
          out.append(nb::make_tuple(s.count, s.min, s.max, s.mean, s.std));
        }
        return out;
      },
      "raster"_a);
  m.def(
      "rescale",
      [](const Raster& r, double in_min, double in_max, double out_min, double out_max,
         const std::string& dtype) {
        const vsr::DType d = dtype_of(dtype);
        nb::gil_scoped_release release;
        return vsr::rescale(r, in_min, in_max, out_min, out_max, d);
      },
      "raster"_a, "in_min"_a, "in_max"_a, "out_min"_a, "out_max"_a, "dtype"_a);
  m.def("rescale_into",
        nb::overload_cast<const vsr::OwnedRasterArray&, double, double, double, double,
                          vsr::OwnedRasterArray&>(&vsr::rescale_into),
        "raster"_a, "in_min"_a, "in_max"_a, "out_min"_a, "out_max"_a, "out"_a,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("clip", nb::overload_cast<const vsr::OwnedRasterArray&, double, double>(&vsr::clip),
        "raster"_a, "lower"_a, "upper"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("clip_into",
        nb::overload_cast<const vsr::OwnedRasterArray&, double, double, vsr::OwnedRasterArray&>(
            &vsr::clip_into),
        "raster"_a, "lower"_a, "upper"_a, "out"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("fill_nodata", nb::overload_cast<const vsr::OwnedRasterArray&, double>(&vsr::fill_nodata),
        "raster"_a, "value"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("fill_nodata_into",
        nb::overload_cast<const vsr::OwnedRasterArray&, double, vsr::OwnedRasterArray&>(
            &vsr::fill_nodata_into),
        "raster"_a, "value"_a, "out"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("normalized_difference",
        nb::overload_cast<const vsr::OwnedRasterArray&, const vsr::OwnedRasterArray&>(
            &vsr::normalized_difference),
        "a"_a, "b"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("normalized_difference_into",
        nb::overload_cast<const vsr::OwnedRasterArray&, const vsr::OwnedRasterArray&,
                          vsr::OwnedRasterArray&>(&vsr::normalized_difference_into),
        "a"_a, "b"_a, "out"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "histogram",
      [](const Raster& r, int bins, double lower, double upper) {
        std::vector<std::vector<std::int64_t>> counts;
        {
          nb::gil_scoped_release release;
          counts = vsr::histogram(r, bins, lower, upper);
        }
        return histogram_array(counts, bins);
      },
      "raster"_a, "bins"_a, "lower"_a, "upper"_a);
  m.def(
      "focal_mean_3x3",
      [](const Raster& r, const std::string& edge) {
        const vsr::EdgeMode e = edge_of(edge);
        nb::gil_scoped_release release;
        return vsr::focal_mean_3x3(r, e);
      },
      "raster"_a, "edge"_a);
  m.def(
      "focal_mean_3x3_into",
      [](const Raster& r, const std::string& edge, Raster& out) {
        const vsr::EdgeMode e = edge_of(edge);
        nb::gil_scoped_release release;
        vsr::focal_mean_3x3_into(r, e, out);
      },
      "raster"_a, "edge"_a, "out"_a);

  // ---- I/O ----
  m.def("io_available", &vsr::io_available);
  m.def(
      "read_raster_metadata",
      [](const std::string& path, bool allow_virtual) {
        vsr::RasterMetadata meta;
        {
          nb::gil_scoped_release release;
          meta = vsr::read_raster_metadata(path, vsr::OpenOptions{{}, allow_virtual});
        }
        return metadata_tuple(meta);
      },
      "path"_a, "allow_virtual"_a);
  m.def(
      "read_raster",
      [](const std::string& path, std::optional<std::array<std::int64_t, 4>> window,
         std::vector<int> bands, bool allow_virtual) {
        std::optional<vsr::RasterWindow> w;
        if (window) w = vsr::RasterWindow{(*window)[0], (*window)[1], (*window)[2], (*window)[3]};
        nb::gil_scoped_release release;
        return vsr::read_raster(path, w, std::move(bands), vsr::OpenOptions{{}, allow_virtual});
      },
      "path"_a, "window"_a.none(), "bands"_a, "allow_virtual"_a);
  m.def(
      "write_raster",
      [](const std::string& path, const Raster& r, const std::string& driver,
         const std::string& compress, bool tiled, int block) {
        const vsr::WriteOptions o = write_options(driver, compress, tiled, block);
        nb::gil_scoped_release release;
        vsr::write_raster(path, r, o);
      },
      "path"_a, "raster"_a, "driver"_a, "compress"_a, "tiled"_a, "block"_a);
  m.def(
      "process_raster_streamed",
      [](const std::string& in, const std::string& out, const nb::callable& fn,
         const std::string& strategy, std::optional<std::pair<std::int64_t, std::int64_t>> tile,
         int halo, std::int64_t n_tiles, std::uint64_t estimate, int bands_per_pass, bool fits,
         const std::string& driver, const std::string& compress, bool tiled, int block,
         std::optional<nb::callable> progress, bool allow_virtual) {
        const vsr::BandOp op = band_op(fn);
        const vsr::RasterPlan plan =
            plan_of(strategy, tile, halo, n_tiles, estimate, bands_per_pass, fits);
        vsr::StreamOptions options;
        options.open.allow_virtual = allow_virtual;
        options.write = write_options(driver, compress, tiled, block);
        if (progress) {
          auto ref = std::make_shared<PyRef>(nb::borrow<nb::object>(*progress));
          options.progress = [ref](std::int64_t done, std::int64_t total) {
            nb::gil_scoped_acquire gil;
            ref->get()(done, total);
          };
        }
        nb::gil_scoped_release release;
        vsr::process_raster_file(in, out, op, plan, options);
      },
      "in_path"_a, "out_path"_a, "op"_a, "strategy"_a, "tile_shape"_a.none(), "halo"_a, "n_tiles"_a,
      "estimate"_a, "bands_per_pass"_a, "fits_budget"_a, "driver"_a, "compress"_a, "tiled"_a,
      "block"_a, "progress"_a.none(), "allow_virtual"_a);
}
