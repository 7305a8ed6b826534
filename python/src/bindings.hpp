// SPDX-License-Identifier: Apache-2.0
// What the binding files of vibespatial_raster._core share: the conversions between the library's
// types and Python's, the error check of C ABI calls, the band-op adapter, and the functions that
// bind each part of the module (bind_memory.cpp, bind_rasters.cpp, bind_ops.cpp, bind_io.cpp;
// module.cpp calls them from the module's init). Private: names and signatures here may change
// with the Python modules; users import those.
//
// Conventions
// - The GIL is released around every call that can take long (copies, ops, dispatch, I/O, pool
//   configuration and trimming, device allocation) and taken again only to call back into
//   Python (band ops, OOM handlers, progress callbacks), always through interpreter.hpp's guards
//   (never nb::gil_scoped_release / acquire): a daemon thread still in here when the interpreter
//   exits is parked instead of being ended under C++ frames, which would abort the process.
// - The module loads in the main interpreter only (PyInit__core, module.cpp).
// - Errors: the library's CudaError / DriverUnavailableError / OutOfMemoryError become the
//   package's classes of the same names (vibespatial_raster._errors); std::invalid_argument ->
//   ValueError, std::out_of_range -> IndexError, std::overflow_error -> OverflowError (nanobind's
//   defaults); a wrong argument type -> TypeError (errors.cpp).
// - dtypes cross as numpy names ("float32"), residencies as "host" / "device", streams and
//   pointers as integers (a CUstream value; 0 is the legacy default stream).
// - Rasters (vsr::OwnedRasterArray, Python name Raster) are handles: copies share storage. No
//   binding changes the residency of a storage in place: moving makes a new storage, so a NumPy
//   view or a device view of the old one stays valid for as long as it holds its handle.
#pragma once

#include "interpreter.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/c_api.h>
#include <vibespatial/raster/dispatch.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>

namespace nb = nanobind;
namespace vsr = vibespatial::raster;

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

namespace vsr_python {

using Raster = vsr::OwnedRasterArray;
using AffineTuple = std::array<double, 6>;
using Nodata = std::optional<vsr::NodataValue>;

// ---- the parts of the module -------------------------------------------------------------------

/// The driver, the pool, device buffers, copies and PyTorch's entry points.
void bind_memory(nb::module_& m);
/// Rasters (the Raster class), array views and DLPack imports, and raster-type helpers.
void bind_rasters(nb::module_& m);
/// The VRAM budget and plans, the dispatchers and the band operations.
void bind_ops(nb::module_& m);
/// Raster files through GDAL.
void bind_io(nb::module_& m);
/// Zonal statistics (bind_zonal.cpp).
void bind_zonal(nb::module_& m);

// ---- errors (errors.cpp)
// -------------------------------------------------------------------------

/// nanobind's exception translator for the library's and the callbacks' exceptions.
void translate_exception(const std::exception_ptr& p, void*);

/// Turns a failed C ABI status into the library's C++ exception, so it maps like any other.
void check(vsr_status status);

// ---- conversions (bind_rasters.cpp)
// --------------------------------------------------------------

/// The dtype named @p name; TypeError for a name that is not one of the ten.
vsr::DType dtype_of(const std::string& name);
std::string dtype_name(vsr::DType d);
vsr::Residency residency_of(const std::string& name);
const char* residency_name(vsr::Residency r);
vsr::TilingStrategy strategy_of(const std::string& name);
vsr::Affine affine_of(const AffineTuple& t);
AffineTuple tuple_of(const vsr::Affine& a);

inline CUstream stream_of(std::uintptr_t s) {
  return reinterpret_cast<CUstream>(s);
}

/// (height, width, band_count, dtype, nodata, affine, crs, driver), as RasterMetadata._from_core
/// reads it.
nb::tuple metadata_tuple(const vsr::RasterMetadata& m);
vsr::RasterMetadata metadata_of(std::int64_t height, std::int64_t width, int band_count,
                                const std::string& dtype, std::optional<double> nodata,
                                const AffineTuple& affine, std::string crs, std::string driver);
/// (strategy, tile_shape, halo, n_tiles, estimate, bands_per_pass, fits_budget), as
/// RasterPlan._from_core reads it; plan_of is its inverse.
nb::tuple plan_tuple(const vsr::RasterPlan& p);
vsr::RasterPlan plan_of(const std::string& strategy,
                        std::optional<std::pair<std::int64_t, std::int64_t>> tile_shape, int halo,
                        std::int64_t n_tiles, std::uint64_t estimate, int bands_per_pass,
                        bool fits_budget);

// ---- callbacks into Python (bind_ops.cpp)
// --------------------------------------------------------

/// A BandOp that calls `fn(Raster) -> Raster` under the GIL. The dispatchers may call it from
/// worker threads (dispatch_per_band_cpu) and copy it freely; the Python reference goes with the
/// last copy. A Python exception leaves it as a PyException (re-raised by the binding).
vsr::BandOp band_op(const nb::callable& fn);

}  // namespace vsr_python
