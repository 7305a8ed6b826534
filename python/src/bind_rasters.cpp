// SPDX-License-Identifier: Apache-2.0
// vibespatial_raster._core: the Raster class (vsr::OwnedRasterArray), its conversions to and from
// Python (dtypes, residencies, affines, metadata and plans), zero-copy array views and DLPack
// imports.
#include "bindings.hpp"

#include <vibespatial/raster/diagnostics.hpp>
#include <vibespatial/raster/memory.hpp>

#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace nb::literals;

namespace vsr_python {

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

vsr::Affine affine_of(const AffineTuple& t) {
  return vsr::Affine{t[0], t[1], t[2], t[3], t[4], t[5]};
}

AffineTuple tuple_of(const vsr::Affine& a) {
  return {a.a, a.b, a.c, a.d, a.e, a.f};
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

namespace {

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

vsr::RasterDiagnosticKind diagnostic_kind_of(const std::string& name) {
  for (auto k : {vsr::RasterDiagnosticKind::created, vsr::RasterDiagnosticKind::transfer,
                 vsr::RasterDiagnosticKind::materialization, vsr::RasterDiagnosticKind::runtime}) {
    if (vsr::to_string(k) == name) return k;
  }
  throw std::invalid_argument(
      "diagnostic kind must be 'created', 'transfer', 'materialization' or 'runtime', not '" +
      name + "'");
}

nb::list event_list(const vsr::RasterDiagnostics& log) {
  nb::list out;
  for (const vsr::RasterDiagnosticEvent& e : log.events()) {
    out.append(nb::make_tuple(std::string(vsr::to_string(e.kind)), e.detail,
                              residency_name(e.residency), e.visible_to_user, e.elapsed_seconds,
                              e.bytes_transferred));
  }
  return out;
}

/// A copy of `r` with residency `target`, in new storage (the old storage stays as it is). The
/// copy takes over r's diagnostic log, with a transfer event when the residency changes.
Raster copy_to(const Raster& r, vsr::Residency target) {
  const auto start = std::chrono::steady_clock::now();
  const vsr::Residency from = r.residency();
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
  out.adopt_diagnostics(r.diagnostics());
  if (from != target) {
    vsr::RasterDiagnosticEvent e;
    e.kind = vsr::RasterDiagnosticKind::transfer;
    e.residency = target;
    e.visible_to_user = true;
    e.elapsed_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    e.bytes_transferred = r.byte_size();
    e.detail = std::string(target == vsr::Residency::device ? "host->device " : "device->host ") +
               std::to_string(r.byte_size()) + " bytes (" + std::to_string(r.band_count()) + "x" +
               std::to_string(r.height()) + "x" + std::to_string(r.width()) + " " +
               dtype_name(r.dtype()) + ")";
    out.diagnostics()->record(std::move(e));
  }
  return out;
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

}  // namespace

void bind_rasters(nb::module_& m) {
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
      "affine_shifted",
      [](const AffineTuple& affine, std::int64_t col, std::int64_t row) {
        const vsr::Affine a = affine_of(affine).shifted(col, row);
        return nb::make_tuple(a.a, a.b, a.c, a.d, a.e, a.f);
      },
      "affine"_a, "col"_a, "row"_a);
  m.def(
      "itemsize", [](const std::string& dtype) { return vsr::itemsize(dtype_of(dtype)); },
      "dtype"_a);

  // ---- diagnostics ----
  nb::class_<vsr::RasterDiagnostics>(m, "DiagnosticLog")
      .def(nb::init<>())
      .def_ro_static("capacity", &vsr::RasterDiagnostics::capacity)
      .def(
          "record",
          [](vsr::RasterDiagnostics& log, const std::string& kind, std::string detail,
             const std::string& residency, bool visible, double elapsed, std::uint64_t bytes) {
            vsr::RasterDiagnosticEvent e;
            e.kind = diagnostic_kind_of(kind);
            e.detail = std::move(detail);
            e.residency = residency_of(residency);
            e.visible_to_user = visible;
            e.elapsed_seconds = elapsed;
            e.bytes_transferred = bytes;
            log.record(std::move(e));
          },
          "kind"_a, "detail"_a, "residency"_a, "visible_to_user"_a = false,
          "elapsed_seconds"_a = 0.0, "bytes_transferred"_a = 0)
      .def(
          "record_runtime_selection",
          [](vsr::RasterDiagnostics& log, std::string requested, std::string selected,
             std::string reason, const std::string& residency) {
            log.record_runtime_selection(
                {std::move(requested), std::move(selected), std::move(reason)},
                residency_of(residency));
          },
          "requested"_a, "selected"_a, "reason"_a, "residency"_a)
      .def("append_from", &vsr::RasterDiagnostics::append_from, "other"_a)
      .def("events", &event_list)
      .def("runtime_history",
           [](const vsr::RasterDiagnostics& log) {
             nb::list out;
             for (const vsr::RuntimeSelection& s : log.runtime_history()) {
               out.append(nb::make_tuple(s.requested, s.selected, s.reason));
             }
             return out;
           })
      .def_prop_ro("dropped_events", &vsr::RasterDiagnostics::dropped_events);

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
            vsr::check_device_range(reinterpret_cast<const void*>(ptr), out.byte_size(),
                                    "from_device");
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
      .def_prop_ro("diagnostics_log", &Raster::diagnostics)
      .def("adopt_diagnostics", &Raster::adopt_diagnostics, "log"_a)
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

  m.def("array_view", &array_view, "ptr"_a, "shape"_a, "dtype"_a, "device_type"_a, "device_id"_a,
        "owner"_a, "writable"_a);
  m.def("import_dlpack", &import_dlpack, "capsule"_a);
}

}  // namespace vsr_python
