// SPDX-License-Identifier: Apache-2.0
// The seam between the ops facade (ops.cpp: argument checks, residency, output rasters) and its
// backends: host (ops_host.cpp, Thrust OpenMP backend) and two device backends, chosen at run time
// by the driver that is loaded: the CUDA one (ops_cuda.cu, Thrust + CUB) on a real driver, the
// emulated one (ops_emulated.cpp) on the host driver emulator, which runs the host backend's
// functors as stream-ordered work on the emulator's device memory. All implement the same
// raw-pointer entry points, declared once here. Plain C++: no Thrust.
#pragma once

#include "ops/calc_program.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/ops.hpp>

#include <cstddef>
#include <cstdint>

namespace vibespatial::raster::detail::ops {

/// Which pixels are invalid: NaN always (floats); equal to `value` when `has` (for integer
/// dtypes only if `value` is exactly representable; the facade clears `has` otherwise).
struct NodataSpec {
  bool has = false;
  double value = 0;
  /// The exact sentinel of an int64 / uint64 raster (two's complement for int64), which value
  /// (a double) cannot always hold: INT64_MAX, UINT64_MAX.
  std::uint64_t bits = 0;
};

/// Shape of a band-major block of pixels.
struct Layout {
  int bands = 0;
  std::int64_t height = 0, width = 0;
  std::int64_t band_pixels() const { return height * width; }
  std::int64_t pixels() const { return band_pixels() * bands; }
};

/// Parameters of rescale (see ops.hpp); `fill` is the value written for invalid pixels.
struct RescaleParams {
  double in_min, in_max, out_min, out_max, fill;
};

// clang-format off
/// The backend entry points. `in`/`out` are host pointers for the host backend and device
/// pointers (primary context) for the device backends. Device calls are queued on `stream` (nullptr:
/// the legacy default stream; the host backend ignores it); statistics and histograms return
/// after the results reached the host. calc's launch holds host tables (program, slots,
/// outputs) whose pixel pointers are of the backend's memory.
#define VSR_OPS_BACKEND_DECLARATIONS                                                            \
  void statistics(const void* in, DType dtype, Layout layout, NodataSpec nodata,               \
                  BandStatistics* out, CUstream stream);                                       \
  void rescale(const void* in, DType dtype, void* out, DType out_dtype, std::int64_t n,        \
               NodataSpec nodata, RescaleParams params, CUstream stream);                      \
  void clip(const void* in, DType dtype, void* out, std::int64_t n, NodataSpec nodata,         \
            double lower, double upper, CUstream stream);                                      \
  void fill_nodata(const void* in, DType dtype, void* out, std::int64_t n, NodataSpec nodata,  \
                   double value, CUstream stream);                                             \
  void normalized_difference(const void* a, const void* b, DType dtype, void* out,             \
                             std::int64_t n, NodataSpec nodata_a, NodataSpec nodata_b,         \
                             CUstream stream);                                                 \
  void histogram(const void* in, DType dtype, Layout layout, NodataSpec nodata, int bins,      \
                 double lower, double upper, std::int64_t* counts, CUstream stream);           \
  void focal_mean_3x3(const void* in, DType dtype, void* out, Layout layout, NodataSpec nodata,\
                      EdgeMode edge, CUstream stream);                                         \
  void calc(const CalcLaunch& launch, CUstream stream);
// clang-format on

namespace host {
VSR_OPS_BACKEND_DECLARATIONS
}  // namespace host

/// The emulated device backend (host code, in every build): each entry point queues the host
/// backend's work with cuLaunchHostFunc on `stream`, where the emulator's worker runs it in
/// stream order on the emulator's device memory (real host pointers); temporaries come from the
/// pool on `stream` and results are read back with the driver's copies, as the CUDA backend
/// does. Only for a driver that is the emulator (DriverState::emulated).
namespace emulated {
VSR_OPS_BACKEND_DECLARATIONS

/// Rethrows (and forgets) the first exception that work queued without a waiting caller raised
/// (a host function cannot return one); the facade calls it before each device operation.
void take_failed_work();
}  // namespace emulated

/// The CUDA backend (ops_cuda.cu; only in builds with nvcc, VSR_OPS_HAVE_CUDA).
namespace device {
VSR_OPS_BACKEND_DECLARATIONS

/// GPU self-test hook (tests/ops/gpu): runs thrust::sequence on pool memory (device_allocate)
/// and a thrust::sort whose temporaries come from the pool allocator, on the legacy default
/// stream. Returns the number of temporary allocations the allocator served (>= 1) and writes
/// whether the sorted pool buffer read back as expected to `ok`.
std::size_t pool_thrust_probe(std::int64_t n, bool& ok);
}  // namespace device

}  // namespace vibespatial::raster::detail::ops
