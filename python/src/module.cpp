// SPDX-License-Identifier: Apache-2.0
// vibespatial_raster._core: the nanobind bindings of the C++ library, used by the package's
// Python modules (memory, dispatch, buffers, ops, io, allocators). Private: names and
// signatures here may change with the Python modules; users import those.
//
// Conventions
// - The GIL is released around every call that can take long (copies, ops, dispatch, I/O, pool
//   configuration and trimming, device allocation) and taken again only to call back into
//   Python (band ops, OOM handlers, progress callbacks), always through interpreter.hpp's guards
//   (never nb::gil_scoped_release / acquire): a daemon thread still in here when the interpreter
//   exits is parked instead of being ended under C++ frames, which would abort the process.
// - The module loads in the main interpreter only (PyInit__core at the end).
// - Errors: the library's CudaError / DriverUnavailableError / OutOfMemoryError become the
//   package's classes of the same names (vibespatial_raster._errors); std::invalid_argument ->
//   ValueError, std::out_of_range -> IndexError, std::overflow_error -> OverflowError (nanobind's
//   defaults); a wrong argument type -> TypeError.
// - dtypes cross as numpy names ("float32"), residencies as "host" / "device", streams and
//   pointers as integers (a CUstream value; 0 is the legacy default stream).
// - Rasters (vsr::OwnedRasterArray, Python name Raster) are handles: copies share storage. No
//   binding changes the residency of a storage in place: moving makes a new storage, so a NumPy
//   view or a device view of the old one stays valid for as long as it holds its handle.
#include "interpreter.hpp"

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
#include <initializer_list>
#include <limits>
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

// ---- nodata ----------------------------------------------------------------------------------

// vsr::NodataValue crosses as a Python int or float, exactly: an int in int64's or uint64's range
// is held as that integer (2**64 - 1 stays 2**64 - 1), a larger int as its nearest double (the
// Python modules refuse those that have none), a float as itself. Back in Python, a value that is
// exactly a double comes out as a float (the modules make integral ones ints for integer
// rasters), any other (a 64-bit integer a double cannot hold) as its int.
namespace nanobind::detail {
template <>
struct type_caster<vsr::NodataValue> {
  NB_TYPE_CASTER(vsr::NodataValue, const_name("int | float"))

  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    PyObject* o = src.ptr();
    if (PyBool_Check(o)) return false;
    if (PyFloat_Check(o)) {
      value = vsr::NodataValue(PyFloat_AS_DOUBLE(o));
      return true;
    }
    if (!PyLong_Check(o)) return false;
    int overflow = 0;
    const long long i = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow == 0) {
      if (i == -1 && PyErr_Occurred() != nullptr) return (PyErr_Clear(), false);
      value = vsr::NodataValue::from_int64(i);
      return true;
    }
    if (overflow > 0) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(o);
      if (!(u == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr)) {
        value = vsr::NodataValue::from_uint64(u);
        return true;
      }
      PyErr_Clear();
    }
    const double d = PyLong_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred() != nullptr) return (PyErr_Clear(), false);
    value = vsr::NodataValue(d);
    return true;
  }

  static handle from_cpp(const vsr::NodataValue& v, rv_policy, cleanup_list*) noexcept {
    if (v == vsr::NodataValue(v.to_double())) return PyFloat_FromDouble(v.to_double());
    if (const auto i = v.as_int64()) return PyLong_FromLongLong(*i);
    if (const auto u = v.as_uint64()) return PyLong_FromUnsignedLongLong(*u);
    return PyFloat_FromDouble(v.to_double());
  }
};
}  // namespace nanobind::detail

namespace {

using Raster = vsr::OwnedRasterArray;
using AffineTuple = std::array<double, 6>;
using Nodata = std::optional<vsr::NodataValue>;

using vsr_python::GilRelease;
using vsr_python::PyRef;
using vsr_python::with_gil;

// ---- errors ----------------------------------------------------------------------------------

/// Raises vibespatial_raster._errors.<name>(message) with the attributes @p attrs as the pending
/// Python error. The instance is made as the class's __init__ makes it, but without running
/// Python code: this runs inside nanobind's exception handler, where a thread that CPython ends
/// at exit (it would be, at any bytecode) aborts the process.
void set_package_error(const char* name, const std::string& message,
                       std::initializer_list<std::pair<const char*, nb::object>> attrs) {
  try {
    nb::object cls = nb::module_::import_("vibespatial_raster._errors").attr(name);
    auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
    nb::tuple args = nb::make_tuple(message);
    nb::object instance = nb::steal(type->tp_new(type, args.ptr(), nullptr));
    if (!instance.is_valid()) throw nb::python_error();
    for (const auto& [attr, value] : attrs) {
      if (PyObject_GenericSetAttr(instance.ptr(), nb::str(attr).ptr(), value.ptr()) != 0) {
        throw nb::python_error();
      }
    }
    PyErr_SetObject(cls.ptr(), instance.ptr());
  } catch (nb::python_error& e) {
    e.restore();
  }
}

void translate_exception(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const vsr_python::PyException& e) {
    e.restore();  // a callback's exception (a band op's, an OOM handler's), as it was raised
  } catch (const vsr::DriverUnavailableError& e) {
    set_package_error("DriverUnavailableError", e.what(),
                      {{"code", nb::int_(e.code())}, {"name", nb::str(e.name().c_str())}});
  } catch (const vsr::CudaError& e) {
    set_package_error("CudaError", e.what(),
                      {{"code", nb::int_(e.code())}, {"name", nb::str(e.name().c_str())}});
  } catch (const vsr::OutOfMemoryError& e) {
    set_package_error("OutOfMemoryError", e.what(),
                      {{"requested_bytes", nb::int_(e.requested_bytes())}});
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
/// last copy. A Python exception leaves it as a PyException (re-raised by the binding).
vsr::BandOp band_op(const nb::callable& fn) {
  auto ref = std::make_shared<PyRef>(nb::borrow<nb::object>(fn));
  return [ref](const Raster& band) -> Raster {
    return with_gil([&] {
      nb::object arg = nb::cast(band, nb::rv_policy::copy);
      nb::object result = ref->get()(arg);
      if (!nb::isinstance<Raster>(result)) {
        throw nb::type_error("the band operation must return a Raster (internal adapter error)");
      }
      return nb::cast<Raster>(result);
    });
  };
}

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

/// The library's rule for a raster's nodata, checked before any allocation (with_nodata applies
/// it again): a NaN cannot mark integer pixels.
void check_nodata(const char* who, const Nodata& nodata, vsr::DType d) {
  if (nodata && nodata->is_nan() && !vsr::is_floating_point(d)) {
    throw std::invalid_argument(std::string(who) + ": NaN nodata is not valid for integer dtype " +
                                dtype_name(d));
  }
}

Raster raster_from_host(const nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>& data,
                        const std::string& dtype, int bands, std::int64_t height,
                        std::int64_t width, Nodata nodata, const AffineTuple& affine,
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
  GilRelease release;
  check_nodata("from_host", nodata, d);
  return Raster::from_host(p, d, bands, height, width, {}, affine_of(affine), std::move(crs))
      .with_nodata(nodata);
}

/// A copy of `r` with residency `target`, in new storage (the old storage stays as it is).
Raster copy_to(const Raster& r, vsr::Residency target) {
  Raster out = Raster::allocate(target, r.dtype(), r.band_count(), r.height(), r.width(), {},
                                r.affine(), r.crs())
                   .with_nodata(r.exact_nodata());
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
  const Nodata nodata = m.exact_nodata ? m.exact_nodata
                        : m.nodata     ? Nodata(*m.nodata)
                                       : std::nullopt;
  return nb::make_tuple(m.height, m.width, m.band_count, dtype_name(m.dtype), nodata,
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

/// DLPack's DLManagedTensorVersioned (DLPack 1.0) up to its flags, the part read here.
struct DlpackVersionedHead {
  std::uint32_t major = 0, minor = 0;
  void* manager_ctx = nullptr;
  void (*deleter)(void*) = nullptr;
  std::uint64_t flags = 0;
};
constexpr std::uint64_t kDlpackReadOnly = 1;

/// Reads a DLPack capsule: (owner, ptr, shape, strides in elements, dtype name, device type,
/// device id, read-only). The owner (nanobind's array object) keeps the producer's tensor alive
/// and calls its deleter when it goes. Refuses, naming the field, what the capsule's DLTensor
/// must not have: negative extents, a null pointer with pixels, a size beyond 64 bits, a
/// multi-lane or unsupported dtype.
nb::tuple import_dlpack(nb::handle capsule) {
  PyObject* c = capsule.ptr();
  bool readonly = false;
  if (PyCapsule_IsValid(c, "dltensor_versioned") != 0) {
    const auto* head =
        static_cast<const DlpackVersionedHead*>(PyCapsule_GetPointer(c, "dltensor_versioned"));
    if (head->major != 1) {
      throw nb::type_error(("from_device: DLPack version " + std::to_string(head->major) + "." +
                            std::to_string(head->minor) + " is not supported (1.x is)")
                               .c_str());
    }
    readonly = (head->flags & kDlpackReadOnly) != 0;
  } else if (PyCapsule_IsValid(c, "dltensor") == 0) {
    throw nb::type_error(
        "from_device: __dlpack__ did not return an unused DLPack capsule ('dltensor' or "
        "'dltensor_versioned')");
  }
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(capsule, a, false)) {
    throw nb::type_error("from_device: the DLPack capsule could not be imported");
  }
  const std::string dtype = dtype_from_dlpack(a.dtype());
  std::vector<std::int64_t> shape(a.ndim());
  std::vector<std::int64_t> strides(a.ndim());
  unsigned __int128 bytes = vsr::itemsize(dtype_of(dtype));
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = a.shape_ptr()[i];
    if (shape[i] < 0) {
      throw nb::value_error(("from_device: DLPack shape[" + std::to_string(i) + "] is negative (" +
                             std::to_string(shape[i]) + ")")
                                .c_str());
    }
    bytes *= static_cast<std::uint64_t>(shape[i]);
    if (bytes > std::numeric_limits<std::uint64_t>::max()) {
      throw nb::value_error("from_device: the DLPack shape's size does not fit in 64 bits");
    }
    strides[i] = a.stride_ptr() != nullptr ? a.stride_ptr()[i] : 0;
  }
  if (a.stride_ptr() == nullptr) {  // DLPack: NULL strides mean compact row-major
    std::int64_t step = 1;
    for (std::size_t i = a.ndim(); i-- > 0;) {
      strides[i] = step;
      step *= shape[i];
    }
  }
  if (a.data() == nullptr && bytes != 0) {
    throw nb::value_error("from_device: the DLPack tensor's data pointer is null");
  }
  nb::object owner = nb::cast(nb::ndarray<nb::array_api, nb::ro>(a), nb::rv_policy::reference);
  return nb::make_tuple(owner, reinterpret_cast<std::uintptr_t>(a.data()), shape, strides, dtype,
                        a.device_type(), a.device_id(), readonly);
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

// nanobind's module init is renamed (it is not exported: exports.map) so that PyInit__core below
// can refuse a subinterpreter before it runs.
#define PyInit__core nanobind_generated_init__core

namespace {
/// Set once the module has been initialized (in the main interpreter, once per process).
std::atomic<bool> g_module_initialized{false};
}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "Bindings of the vibespatial-raster C++ library (private: use the package's modules).";
  nb::register_exception_translator(translate_exception, nullptr);

  // Which thread may still take the GIL while the interpreter finalizes: the one running the
  // atexit functions (our hook says which), else the main thread.
  vsr_python::note_main_thread(nb::cast<unsigned long>(
      nb::module_::import_("threading").attr("main_thread")().attr("ident")));
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] {
    vsr_python::note_finalizing_thread();
    vsr_python::release_deferred();
  }));

  m.attr("__version__") = vsr_version();

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
  m.def("add_oom_handler", &add_oom_handler, "handler"_a);
  m.def("remove_oom_handler", &vsr::remove_oom_handler, "handler_id"_a);

  nb::class_<DeviceBuffer>(m, "DeviceBuffer")
      .def(
          "__init__",
          [](DeviceBuffer* self, std::size_t size, std::uintptr_t stream) {
            GilRelease release;
            new (self) DeviceBuffer(size, stream);
          },
          "size"_a, "stream"_a = 0)
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
      "stream_synchronize",
      [](std::uintptr_t stream) { check(vsr_stream_synchronize(reinterpret_cast<void*>(stream))); },
      "stream"_a = 0, nb::call_guard<GilRelease>());
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

  // ---- budget and planning ----
  m.def("available_vram_bytes", &vsr::available_vram_bytes, nb::call_guard<GilRelease>());
  m.def("usable_vram_budget", &vsr::usable_vram_budget, "vram_budget"_a);
  m.def(
      "max_bands_for_budget",
      [](std::int64_t height, std::int64_t width, const std::string& dtype, int buffers_per_band,
         std::uint64_t scratch_bytes, std::optional<std::uint64_t> vram_budget) {
        const vsr::DType d = dtype_of(dtype);
        GilRelease release;
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
          GilRelease release;
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
          GilRelease release;
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
      "same_nodata", [](const Nodata& a, const Nodata& b) { return a == b; }, "a"_a.none(),
      "b"_a.none());
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
             std::int64_t width, Nodata nodata, const AffineTuple& affine, std::string crs) {
            const vsr::Residency where = residency_of(residency);
            const vsr::DType d = dtype_of(dtype);
            check_nodata("allocate", nodata, d);
            GilRelease release;
            return Raster::allocate(where, d, bands, height, width, {}, affine_of(affine),
                                    std::move(crs))
                .with_nodata(nodata);
          },
          "residency"_a, "dtype"_a, "bands"_a, "height"_a, "width"_a, "nodata"_a.none(), "affine"_a,
          "crs"_a)
      .def_static(
          "from_device_memory",
          [](std::uintptr_t ptr, const std::string& dtype, int bands, std::int64_t height,
             std::int64_t width, Nodata nodata, const AffineTuple& affine, std::string crs,
             std::uintptr_t stream) {
            const vsr::DType d = dtype_of(dtype);
            if (ptr == 0) throw std::invalid_argument("from_device: null device pointer");
            check_nodata("from_device", nodata, d);
            GilRelease release;
            Raster out = Raster::allocate(vsr::Residency::device, d, bands, height, width, {},
                                          affine_of(affine), std::move(crs))
                             .with_nodata(nodata);
            check(vsr_memcpy(out.device_data(), reinterpret_cast<const void*>(ptr), out.byte_size(),
                             VSR_COPY_DEVICE_TO_DEVICE, reinterpret_cast<void*>(stream)));
            return out;
          },
          "ptr"_a, "dtype"_a, "bands"_a, "height"_a, "width"_a, "nodata"_a.none(), "affine"_a,
          "crs"_a, "stream"_a)
      .def_static(
          "from_band_stack",
          [](const std::vector<Raster>& bands, const Raster& source) {
            GilRelease release;
            return Raster::from_band_stack(bands, source);
          },
          "bands"_a, "source"_a)
      .def_static(
          "with_georeferencing",
          [](const Raster& r, Nodata nodata, const AffineTuple& affine, std::string crs) {
            check_nodata("with_georeferencing", nodata, r.dtype());
            return r.with_nodata(nodata).with_georeferencing(affine_of(affine), std::move(crs));
          },
          "raster"_a, "nodata"_a.none(), "affine"_a, "crs"_a)
      .def_prop_ro("band_count", &Raster::band_count)
      .def_prop_ro("height", &Raster::height)
      .def_prop_ro("width", &Raster::width)
      .def_prop_ro("dtype", [](const Raster& r) { return dtype_name(r.dtype()); })
      .def_prop_ro("nodata", &Raster::exact_nodata)
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
            GilRelease release;
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
            GilRelease release;
            r.copy_to_host(dst);
          },
          "out"_a);

  // ---- dispatch ----
  m.def(
      "dispatch_per_band_cpu",
      [](const Raster& r, const nb::callable& fn) {
        const vsr::BandOp op = band_op(fn);
        GilRelease release;
        return vsr::dispatch_per_band_cpu(r, op);
      },
      "raster"_a, "op"_a);
  m.def(
      "dispatch_per_band_gpu",
      [](const Raster& r, const nb::callable& fn, int buffers_per_band,
         std::uint64_t scratch_bytes) {
        const vsr::BandOp op = band_op(fn);
        GilRelease release;
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
        GilRelease release;
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
          GilRelease release;
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
        GilRelease release;
        return vsr::rescale(r, in_min, in_max, out_min, out_max, d);
      },
      "raster"_a, "in_min"_a, "in_max"_a, "out_min"_a, "out_max"_a, "dtype"_a);
  m.def("rescale_into",
        nb::overload_cast<const vsr::OwnedRasterArray&, double, double, double, double,
                          vsr::OwnedRasterArray&>(&vsr::rescale_into),
        "raster"_a, "in_min"_a, "in_max"_a, "out_min"_a, "out_max"_a, "out"_a,
        nb::call_guard<GilRelease>());
  m.def("clip", nb::overload_cast<const vsr::OwnedRasterArray&, double, double>(&vsr::clip),
        "raster"_a, "lower"_a, "upper"_a, nb::call_guard<GilRelease>());
  m.def("clip_into",
        nb::overload_cast<const vsr::OwnedRasterArray&, double, double, vsr::OwnedRasterArray&>(
            &vsr::clip_into),
        "raster"_a, "lower"_a, "upper"_a, "out"_a, nb::call_guard<GilRelease>());
  m.def("fill_nodata", nb::overload_cast<const vsr::OwnedRasterArray&, double>(&vsr::fill_nodata),
        "raster"_a, "value"_a, nb::call_guard<GilRelease>());
  m.def("fill_nodata_into",
        nb::overload_cast<const vsr::OwnedRasterArray&, double, vsr::OwnedRasterArray&>(
            &vsr::fill_nodata_into),
        "raster"_a, "value"_a, "out"_a, nb::call_guard<GilRelease>());
  m.def("normalized_difference",
        nb::overload_cast<const vsr::OwnedRasterArray&, const vsr::OwnedRasterArray&>(
            &vsr::normalized_difference),
        "a"_a, "b"_a, nb::call_guard<GilRelease>());
  m.def("normalized_difference_into",
        nb::overload_cast<const vsr::OwnedRasterArray&, const vsr::OwnedRasterArray&,
                          vsr::OwnedRasterArray&>(&vsr::normalized_difference_into),
        "a"_a, "b"_a, "out"_a, nb::call_guard<GilRelease>());
  m.def(
      "histogram",
      [](const Raster& r, int bins, double lower, double upper) {
        std::vector<std::vector<std::int64_t>> counts;
        {
          GilRelease release;
          counts = vsr::histogram(r, bins, lower, upper);
        }
        return histogram_array(counts, bins);
      },
      "raster"_a, "bins"_a, "lower"_a, "upper"_a);
  m.def(
      "focal_mean_3x3",
      [](const Raster& r, const std::string& edge) {
        const vsr::EdgeMode e = edge_of(edge);
        GilRelease release;
        return vsr::focal_mean_3x3(r, e);
      },
      "raster"_a, "edge"_a);
  m.def(
      "focal_mean_3x3_into",
      [](const Raster& r, const std::string& edge, Raster& out) {
        const vsr::EdgeMode e = edge_of(edge);
        GilRelease release;
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
          GilRelease release;
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
        GilRelease release;
        return vsr::read_raster(path, w, std::move(bands), vsr::OpenOptions{{}, allow_virtual});
      },
      "path"_a, "window"_a.none(), "bands"_a, "allow_virtual"_a);
  m.def(
      "write_raster",
      [](const std::string& path, const Raster& r, const std::string& driver,
         const std::string& compress, bool tiled, int block) {
        const vsr::WriteOptions o = write_options(driver, compress, tiled, block);
        GilRelease release;
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
            with_gil([&] { ref->get()(done, total); });
          };
        }
        GilRelease release;
        vsr::process_raster_file(in, out, op, plan, options);
      },
      "in_path"_a, "out_path"_a, "op"_a, "strategy"_a, "tile_shape"_a.none(), "halo"_a, "n_tiles"_a,
      "estimate"_a, "bands_per_pass"_a, "fits_budget"_a, "driver"_a, "compress"_a, "tiled"_a,
      "block"_a, "progress"_a.none(), "allow_virtual"_a);

  g_module_initialized.store(true);
}

#undef PyInit__core

/// The module's init: refuses every interpreter but the main one, and a second initialization
/// in it, before anything is touched. The extension's state (nanobind's per-extension internals,
/// its registered types, the pool's Python handlers) is one per process: initialized again in a
/// subinterpreter it would be overwritten and the main interpreter broken (objects refused by
/// their own methods, crashes); initialized again in the main interpreter (the module dropped
/// from sys.modules and imported anew) the new module would lack its types.
extern "C" NB_EXPORT PyObject* PyInit__core(void) {
  if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
    PyErr_SetString(PyExc_ImportError,
                    "vibespatial_raster cannot be imported in a subinterpreter: its native state "
                    "is one per process (import it in the main interpreter only)");
    return nullptr;
  }
  if (g_module_initialized.load()) {
    PyErr_SetString(PyExc_ImportError,
                    "vibespatial_raster._core is already initialized in this process and cannot "
                    "be initialized again (keep the module object first imported; do not remove "
                    "it from sys.modules)");
    return nullptr;
  }
  return nanobind_generated_init__core();
}
