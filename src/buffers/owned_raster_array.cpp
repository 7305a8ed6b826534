// SPDX-License-Identifier: Apache-2.0
// OwnedRasterArray: band-major pixels in shared storage, resident on the host or on the device.
#include "common/checked_math.hpp"
#include "common/expects.hpp"
#include "driver/cuda_driver.hpp"
#include "memory/library_tag.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/diagnostics.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/memory.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vibespatial::raster {

using detail::checked_mul;

namespace detail {

/// The pixels behind one or more handles. Exactly one of host / device holds them.
struct RasterStorage {
  DType dtype = DType::float32;
  int bands = 0;
  std::int64_t height = 0, width = 0;
  std::size_t band_bytes = 0;  ///< height * width * itemsize
  std::size_t total_bytes = 0;

  mutable std::mutex mutex;
  Residency residency = Residency::host;
  std::unique_ptr<unsigned char[]> host;
  void* device = nullptr;
  int device_id = 0;
  /// The stream `device` is pool memory for, and is given back on (nullptr: the legacy stream).
  CUstream stream = nullptr;
  /// The diagnostic log (never null); replaced only under `mutex`.
  std::shared_ptr<RasterDiagnostics> log = std::make_shared<RasterDiagnostics>();

  RasterStorage() = default;
  RasterStorage(const RasterStorage&) = delete;
  RasterStorage& operator=(const RasterStorage&) = delete;
  ~RasterStorage() { release_device(); }

  /// Returns the device buffer to the pool (in its device's context), in the order of the stream
  /// it was allocated for: work queued there on it runs before anything reuses it. Never throws:
  /// a failure here leaks the block rather than aborting a destructor.
  void release_device() noexcept {
    if (device == nullptr) return;
    try {
      ScopedDeviceContext ctx(device_id);
      device_deallocate(device, total_bytes, stream);
    } catch (...) {
    }
    device = nullptr;
    stream = nullptr;
  }
};

}  // namespace detail

namespace {

bool is_integer(DType dtype) {
  return dtype != DType::float32 && dtype != DType::float64;
}

std::shared_ptr<detail::RasterStorage> make_storage(const char* who, DType dtype, int bands,
                                                    std::int64_t height, std::int64_t width,
                                                    const std::optional<double>& nodata) {
  const std::size_t item = itemsize(dtype);  // throws invalid_argument for a bad dtype
  VSR_EXPECTS(bands >= 1,
              std::string(who) + ": bands must be >= 1 (got " + std::to_string(bands) + ")");
  VSR_EXPECTS(height > 0 && width > 0, std::string(who) + ": height and width must be > 0 (got " +
                                           std::to_string(height) + " x " + std::to_string(width) +
                                           ")");
  VSR_EXPECTS(!(nodata && std::isnan(*nodata) && is_integer(dtype)),
              std::string(who) + ": NaN nodata is not valid for integer dtype " +
                  std::string(to_string(dtype)));
  auto s = std::make_shared<detail::RasterStorage>();
  s->dtype = dtype;
  s->bands = bands;
  s->height = height;
  s->width = width;
  const std::string what = std::string(who) + ": the raster's byte size";
  s->band_bytes = checked_mul(
      checked_mul(static_cast<std::size_t>(height), static_cast<std::size_t>(width), what.c_str()),
      item, what.c_str());
  s->total_bytes = checked_mul(s->band_bytes, static_cast<std::size_t>(bands), what.c_str());
  return s;
}

std::string nodata_text(const std::optional<NodataValue>& v) {
  return v ? v->to_string() : std::string("none");
}

std::optional<double> as_double(const std::optional<NodataValue>& v) {
  return v ? std::optional<double>(v->to_double()) : std::nullopt;
}

// Moves the storage's pixels to `target`; the caller holds s.mutex.
/// "(bands x height x width dtype)" of a storage, for event details.
std::string shape_text(const detail::RasterStorage& s) {
  // Appended piece by piece: GCC 12's -Wrestrict misfires on "(" + std::to_string(...) at -O3.
  std::string t("(");
  t += std::to_string(s.bands);
  t += 'x';
  t += std::to_string(s.height);
  t += 'x';
  t += std::to_string(s.width);
  t += ' ';
  t += to_string(s.dtype);
  t += ')';
  return t;
}

/// Records a transfer of the whole storage that began at @p start. Never throws: a log that
/// cannot grow (no memory) loses the event, not the transfer.
void record_transfer(detail::RasterStorage& s, Residency target,
                     std::chrono::steady_clock::time_point start) noexcept {
  try {
    RasterDiagnosticEvent e;
    e.kind = RasterDiagnosticKind::transfer;
    e.residency = target;
    e.visible_to_user = true;
    e.elapsed_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    e.bytes_transferred = s.total_bytes;
    e.detail = std::string(target == Residency::device ? "host->device " : "device->host ") +
               std::to_string(s.total_bytes) + " bytes " + shape_text(s);
    s.log->record(std::move(e));
  } catch (...) {
  }
}

void move_locked(detail::RasterStorage& s, Residency target) {
  if (s.residency == target) return;
  const auto start = std::chrono::steady_clock::now();
  const auto& api = detail::driver();
  if (target == Residency::device) {
    const int device = detail::bind_current_device();
    void* d = nullptr;
    {
      detail::history::LibraryTag tag;
      d = device_allocate(s.total_bytes, nullptr);
    }
    // A copy from pageable memory may still be in flight when cuMemcpyHtoD returns (§3.6): the
    // raster promises pixels on the device when the call returns, usable from any stream, so the
    // legacy stream (which the copy ran on) is waited for.
    CUresult r = api.cuMemcpyHtoD(detail::to_device_ptr(d), s.host.get(), s.total_bytes);
    const char* what = "cuMemcpyHtoD";
    if (r == CUDA_SUCCESS) {
      r = api.cuStreamSynchronize(CU_STREAM_LEGACY);
      what = "cuStreamSynchronize";
    }
    if (r != CUDA_SUCCESS) {
      device_deallocate(d, s.total_bytes, nullptr);
      detail::throw_cuda_error(r, what, __FILE__, __LINE__);
    }
    s.device = d;
    s.device_id = device;
    s.host.reset();
    s.residency = Residency::device;
    record_transfer(s, target, start);
  } else {
    auto host = std::make_unique_for_overwrite<unsigned char[]>(s.total_bytes);
    {
      detail::ScopedDeviceContext ctx(s.device_id);
      VSR_CU_TRY(api.cuMemcpyDtoH(host.get(), detail::to_device_ptr(s.device), s.total_bytes));
    }
    s.release_device();
    s.host = std::move(host);
    s.residency = Residency::host;
    record_transfer(s, target, start);
  }
}

}  // namespace

OwnedRasterArray::OwnedRasterArray(std::shared_ptr<detail::RasterStorage> storage, int first_band,
                                   int band_count)
    : storage_(std::move(storage)), first_band_(first_band), band_count_(band_count) {}

OwnedRasterArray OwnedRasterArray::from_host(const void* data, DType dtype, int bands,
                                             std::int64_t height, std::int64_t width,
                                             std::optional<double> nodata, Affine affine,
                                             std::string crs) {
  auto s = make_storage("from_host", dtype, bands, height, width, nodata);
  VSR_EXPECTS(data != nullptr, "from_host: data is null");
  s->host = std::make_unique_for_overwrite<unsigned char[]>(s->total_bytes);
  std::memcpy(s->host.get(), data, s->total_bytes);
  {
    RasterDiagnosticEvent e;
    e.kind = RasterDiagnosticKind::created;
    e.detail = "from_host " + shape_text(*s);
    s->log->record(std::move(e));
  }
  OwnedRasterArray r(std::move(s), 0, bands);
  r.nodata_ = nodata;
  r.affine_ = affine;
  r.crs_ = std::move(crs);
  return r;
}

OwnedRasterArray OwnedRasterArray::allocate(Residency where, DType dtype, int bands,
                                            std::int64_t height, std::int64_t width,
                                            std::optional<double> nodata, Affine affine,
                                            std::string crs) {
  return allocate(where, dtype, bands, height, width, nodata, affine, std::move(crs), nullptr);
}

OwnedRasterArray OwnedRasterArray::allocate(Residency where, DType dtype, int bands,
                                            std::int64_t height, std::int64_t width,
                                            std::optional<double> nodata, Affine affine,
                                            std::string crs, CUstream stream) {
  auto s = make_storage("allocate", dtype, bands, height, width, nodata);
  if (where == Residency::device) {
    detail::driver();
    s->device_id = detail::bind_current_device();
    {
      detail::history::LibraryTag tag;
      s->device = device_allocate(s->total_bytes, stream);
    }
    s->stream = stream;
    s->residency = Residency::device;
  } else {
    s->host = std::make_unique_for_overwrite<unsigned char[]>(s->total_bytes);
  }
  OwnedRasterArray r(std::move(s), 0, bands);
  r.nodata_ = nodata;
  r.affine_ = affine;
  r.crs_ = std::move(crs);
  return r;
}

OwnedRasterArray OwnedRasterArray::from_band_stack(const std::vector<OwnedRasterArray>& bands,
                                                   const OwnedRasterArray& source) {
  VSR_EXPECTS(!bands.empty(), "from_band_stack: no band results to stack");
  const OwnedRasterArray& first = bands.front();
  const std::optional<NodataValue> nodata = source.nodata_;
  VSR_EXPECTS(
      !(nodata && nodata->is_nan() && is_integer(first.dtype())),
      "from_band_stack: the source's NaN nodata is not valid for the results' integer dtype " +
          std::string(to_string(first.dtype())));
  if (bands.size() == 1) {
    OwnedRasterArray r(first.storage_, first.first_band_, first.band_count_);
    r.nodata_ = nodata;
    r.affine_ = source.affine_;
    r.crs_ = source.crs_;
    return r;
  }

  bool any_device = false;
  std::int64_t total_bands = 0;
  for (std::size_t i = 0; i < bands.size(); ++i) {
    const OwnedRasterArray& b = bands[i];
    const std::string name = "from_band_stack: band " + std::to_string(i);
    VSR_EXPECTS(b.dtype() == first.dtype(),
                name + " has dtype " + std::string(to_string(b.dtype())) + ", band 0 has " +
                    std::string(to_string(first.dtype())));
    VSR_EXPECTS(b.nodata_ == first.nodata_, name + " has nodata " + nodata_text(b.nodata_) +
                                                ", band 0 has " + nodata_text(first.nodata_));
    VSR_EXPECTS(b.height() == first.height() && b.width() == first.width() &&
                    b.band_count() == first.band_count(),
                name + " has shape (" + std::to_string(b.band_count()) + ", " +
                    std::to_string(b.height()) + ", " + std::to_string(b.width()) +
                    "), band 0 has (" + std::to_string(first.band_count()) + ", " +
                    std::to_string(first.height()) + ", " + std::to_string(first.width()) + ")");
    any_device = any_device || b.residency() == Residency::device;
    total_bands += b.band_count();
  }
  if (total_bands > std::numeric_limits<int>::max()) {
    throw std::overflow_error("from_band_stack: too many bands");
  }

  OwnedRasterArray out = allocate(any_device ? Residency::device : Residency::host, first.dtype(),
                                  static_cast<int>(total_bands), first.height(), first.width(),
                                  as_double(nodata), source.affine_, source.crs_);
  out.nodata_ = nodata;
  // The stack's history starts with its results' (each log once: views of one storage share it).
  {
    std::vector<const RasterDiagnostics*> seen;
    for (const OwnedRasterArray& b : bands) {
      const std::shared_ptr<RasterDiagnostics> log = b.diagnostics();
      if (std::find(seen.begin(), seen.end(), log.get()) != seen.end()) continue;
      seen.push_back(log.get());
      out.storage_->log->append_from(*log);
    }
  }
  const std::size_t step = first.byte_size();
  if (any_device) {
    const auto& api = detail::driver();
    auto* dst = static_cast<unsigned char*>(out.storage_->device);
    detail::ScopedDeviceContext ctx(out.storage_->device_id);
    for (const OwnedRasterArray& b : bands) {
      std::lock_guard lock(b.storage_->mutex);
      const std::size_t offset = b.storage_->band_bytes * static_cast<std::size_t>(b.first_band_);
      if (b.storage_->residency == Residency::device) {
        VSR_CU_TRY(api.cuMemcpyDtoD(
            detail::to_device_ptr(dst),
            detail::to_device_ptr(static_cast<unsigned char*>(b.storage_->device) + offset), step));
      } else {
        VSR_CU_TRY(
            api.cuMemcpyHtoD(detail::to_device_ptr(dst), b.storage_->host.get() + offset, step));
      }
      dst += step;
    }
    // cuMemcpyDtoD may return before the copy is done; the stack must be complete on return.
    VSR_CU_TRY(api.cuCtxSynchronize());
  } else {
    auto* dst = out.storage_->host.get();
    for (const OwnedRasterArray& b : bands) {
      b.copy_to_host(dst);
      dst += step;
    }
  }
  return out;
}

int OwnedRasterArray::band_count() const {
  return band_count_;
}
std::int64_t OwnedRasterArray::height() const {
  return storage_->height;
}
std::int64_t OwnedRasterArray::width() const {
  return storage_->width;
}
DType OwnedRasterArray::dtype() const {
  return storage_->dtype;
}
std::optional<double> OwnedRasterArray::nodata() const {
  return as_double(nodata_);
}

std::optional<NodataValue> OwnedRasterArray::exact_nodata() const {
  return nodata_;
}

OwnedRasterArray OwnedRasterArray::with_nodata(std::optional<NodataValue> nodata) const {
  VSR_EXPECTS(
      !(nodata && nodata->is_nan() && is_integer(dtype())),
      "with_nodata: NaN nodata is not valid for integer dtype " + std::string(to_string(dtype())));
  OwnedRasterArray r = *this;
  r.nodata_ = nodata;
  return r;
}
const Affine& OwnedRasterArray::affine() const {
  return affine_;
}
const std::string& OwnedRasterArray::crs() const {
  return crs_;
}

Residency OwnedRasterArray::residency() const {
  std::lock_guard lock(storage_->mutex);
  return storage_->residency;
}

RasterMetadata OwnedRasterArray::metadata() const {
  RasterMetadata m;
  m.height = height();
  m.width = width();
  m.band_count = band_count_;
  m.dtype = dtype();
  m.nodata = as_double(nodata_);
  m.exact_nodata = nodata_;
  m.affine = affine_;
  m.crs = crs_;
  return m;
}

std::shared_ptr<RasterDiagnostics> OwnedRasterArray::diagnostics() const {
  std::lock_guard lock(storage_->mutex);
  return storage_->log;
}

void OwnedRasterArray::adopt_diagnostics(std::shared_ptr<RasterDiagnostics> log) {
  VSR_EXPECTS(log != nullptr, "adopt_diagnostics: the log is null");
  std::lock_guard lock(storage_->mutex);
  storage_->log = std::move(log);
}

std::size_t OwnedRasterArray::byte_size() const {
  return storage_->band_bytes * static_cast<std::size_t>(band_count_);
}

OwnedRasterArray OwnedRasterArray::band(int i) const {
  if (i < 0 || i >= band_count_) {
    throw std::out_of_range("band: index " + std::to_string(i) + " is not in [0, " +
                            std::to_string(band_count_) + ")");
  }
  OwnedRasterArray r(storage_, first_band_ + i, 1);
  r.nodata_ = nodata_;
  r.affine_ = affine_;
  r.crs_ = crs_;
  return r;
}

OwnedRasterArray OwnedRasterArray::bands(int first, int count) const {
  if (first < 0 || count < 1 || first > band_count_ - count) {
    throw std::out_of_range("bands: " + std::to_string(count) + " band(s) from index " +
                            std::to_string(first) + " are not in [0, " +
                            std::to_string(band_count_) + ")");
  }
  OwnedRasterArray r(storage_, first_band_ + first, count);
  r.nodata_ = nodata_;
  r.affine_ = affine_;
  r.crs_ = crs_;
  return r;
}

void OwnedRasterArray::move_to(Residency target) {
  VSR_EXPECTS(target == Residency::host || target == Residency::device,
              "move_to: not a Residency value");
  std::lock_guard lock(storage_->mutex);
  move_locked(*storage_, target);
}

void OwnedRasterArray::copy_to_host(void* dst) const {
  VSR_EXPECTS(dst != nullptr, "copy_to_host: dst is null");
  const detail::RasterStorage& s = *storage_;
  std::lock_guard lock(s.mutex);
  const std::size_t offset = s.band_bytes * static_cast<std::size_t>(first_band_);
  if (s.residency == Residency::host) {
    std::memcpy(dst, s.host.get() + offset, byte_size());
    return;
  }
  const auto& api = detail::driver();
  detail::ScopedDeviceContext ctx(s.device_id);
  VSR_CU_TRY(api.cuMemcpyDtoH(
      dst, detail::to_device_ptr(static_cast<unsigned char*>(s.device) + offset), byte_size()));
}

OwnedRasterArray OwnedRasterArray::clone_to(Residency where) const {
  if (where != Residency::host && where != Residency::device) {
    throw std::invalid_argument("clone_to: not a Residency value");
  }
  OwnedRasterArray out =
      allocate(where, dtype(), band_count_, height(), width(), as_double(nodata_), affine_, crs_);
  out.nodata_ = nodata_;
  if (where == Residency::host) {
    copy_to_host(out.storage_->host.get());
    return out;
  }
  const detail::RasterStorage& s = *storage_;
  const auto& api = detail::driver();
  std::lock_guard lock(s.mutex);
  const std::size_t offset = s.band_bytes * static_cast<std::size_t>(first_band_);
  detail::ScopedDeviceContext ctx(out.storage_->device_id);
  const CUdeviceptr dst = detail::to_device_ptr(out.storage_->device);
  if (s.residency == Residency::host) {
    VSR_CU_TRY(api.cuMemcpyHtoD(dst, s.host.get() + offset, byte_size()));
  } else {
    VSR_CU_TRY(api.cuMemcpyDtoD(
        dst, detail::to_device_ptr(static_cast<unsigned char*>(s.device) + offset), byte_size()));
  }
  // Either copy may return before it is done (a pageable source, or device to device, §3.6): the
  // clone is complete on return, usable from any stream.
  VSR_CU_TRY(api.cuStreamSynchronize(CU_STREAM_LEGACY));
  return out;
}

void* OwnedRasterArray::device_data() {
  std::lock_guard lock(storage_->mutex);
  move_locked(*storage_, Residency::device);
  return static_cast<unsigned char*>(storage_->device) +
         storage_->band_bytes * static_cast<std::size_t>(first_band_);
}

const void* OwnedRasterArray::device_pointer() const {
  std::lock_guard lock(storage_->mutex);
  if (storage_->residency != Residency::device) return nullptr;
  return static_cast<const unsigned char*>(storage_->device) +
         storage_->band_bytes * static_cast<std::size_t>(first_band_);
}

const void* OwnedRasterArray::host_data() const {
  std::lock_guard lock(storage_->mutex);
  if (storage_->residency != Residency::host) return nullptr;
  return storage_->host.get() + storage_->band_bytes * static_cast<std::size_t>(first_band_);
}

void* OwnedRasterArray::mutable_host_data() {
  std::lock_guard lock(storage_->mutex);
  move_locked(*storage_, Residency::host);
  return storage_->host.get() + storage_->band_bytes * static_cast<std::size_t>(first_band_);
}

}  // namespace vibespatial::raster
