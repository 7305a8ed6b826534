// SPDX-License-Identifier: Apache-2.0
// vsr-gpu-smoke: device smoke checks for tools/gpu-check (suite 'gpu'), one case per process
// because the pool's tier is chosen once per process:
//
//   vsr-gpu-smoke dispatch    dispatch_per_band_gpu results (stream and legacy-stream forms,
//                             batched and double-buffered, output on host and device, device
//                             input) against the host path
//   vsr-gpu-smoke tier-a      VIBESPATIAL_GPU_POOL_ONLY=1: tier A, patterns, an immediate
//                             OutOfMemoryError on a full device (no recovery)
//   vsr-gpu-smoke tier-b-oom  tier B: a full device recovered by an OOM handler
//   vsr-gpu-smoke tier-c      VIBESPATIAL_GPU_MANAGED_MEMORY=1: tier C with 64 MiB of managed
//                             memory, only if at least 8 times that is free
//   vsr-gpu-smoke fallback    the fallback pool (cuMemAlloc caching) on the device
//   vsr-gpu-smoke threads     8 threads, each with its own non-blocking stream, allocating and
//                             freeing with work still pending, every block's pattern verified
//   vsr-gpu-smoke free-pool   cuMemGetInfo back to its starting value (within two granules)
//                             after free_pool_memory()
//
// Without --emulator the checks need the real driver and exit 77 (skip) without a device; with
// --emulator they need the host emulator, where the band ops run on the emulated device backend
// (how the program and everything above the CUDA kernels is tested on a CPU). A real GPU with a
// build that has no CUDA ops replaces the ops by a device copy.
// A "full device" is made by taking the card's free memory with one plain cuMemAlloc, leaving a
// few hundred MiB; managed memory is never asked for beyond 64 MiB. Prints one PASS/FAIL line per
// check; exit status 0, 1 (a check failed), 2 (bad arguments) or 77.
#include "dispatch/gpu_resources.hpp"
#include "driver/cuda_driver.hpp"
#include "memory/device_pool.hpp"
#include "memory/pool_registry.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/ops.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace vsr = vibespatial::raster;
namespace detail = vibespatial::raster::detail;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

bool g_emulator = false;
int g_failed = 0;
std::mutex g_print;

void report(bool ok, const std::string& name, const std::string& detail = "") {
  std::lock_guard lock(g_print);
  std::printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name.c_str(), detail.empty() ? "" : ": ",
              detail.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failed;
}

#define SMOKE_CHECK(cond, name, detail) report((cond), (name), (cond) ? "" : (detail))

const detail::DriverApi& api() {
  return detail::driver();
}

std::size_t free_device_bytes() {
  detail::bind_current_device();
  std::size_t f = 0, t = 0;
  VSR_CU_TRY(api().cuMemGetInfo(&f, &t));
  return f;
}

/// Whether two cuMemGetInfo readings are the same up to the slack of two granules the rules
/// allow (docs/cuda-driver-rules.md §9.1: the real driver may charge page tables and its own
/// lazy allocations), the granule being the device's minimum VMM granularity (2 MiB when the
/// driver does not say).
bool free_bytes_match(std::size_t before, std::size_t after) {
  std::size_t granule = std::size_t{2} << 20;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  std::size_t g = 0;
  if (api().cuMemGetAllocationGranularity != nullptr &&
      api().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
          CUDA_SUCCESS &&
      g > 0) {
    granule = g;
  }
  const std::size_t delta = before > after ? before - after : after - before;
  return delta <= 2 * granule;
}

std::string free_bytes_detail(std::size_t before, std::size_t after) {
  return std::to_string(before) + " -> " + std::to_string(after) +
         " bytes free (allowed: two granules)";
}

/// Sizes: a unit of 256 MiB on a GPU, 16 MiB on the emulator (whose test gives it 512 MiB).
std::size_t unit() {
  return g_emulator ? 16 * kMiB : 256 * kMiB;
}

/// Takes all but about @p leave bytes of the device's free memory with plain cuMemAlloc (never
/// managed memory), so the pool meets a full device. Freed on destruction.
class Hog {
 public:
  explicit Hog(std::size_t leave) {
    std::size_t f = free_device_bytes();
    if (f <= leave + 64 * kMiB) return;  // already that full
    std::size_t take = f - leave;
    for (int tries = 0; tries < 16 && ptr_ == 0; ++tries) {
      if (api().cuMemAlloc(&ptr_, take) != CUDA_SUCCESS) {
        ptr_ = 0;
        take -= std::min(take, 64 * kMiB);  // the free figure moved: ask for a little less
      }
    }
    bytes_ = ptr_ != 0 ? take : 0;
  }
  ~Hog() {
    if (ptr_ != 0) (void)api().cuMemFree(ptr_);
  }
  Hog(const Hog&) = delete;
  Hog& operator=(const Hog&) = delete;
  std::size_t bytes() const { return bytes_; }

 private:
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
};

/// Writes byte @p value over @p bytes at @p p and reads back a sample of it; true if all match.
bool pattern_roundtrip(void* p, std::size_t bytes, unsigned char value, CUstream stream = nullptr) {
  VSR_CU_TRY(api().cuMemsetD8Async(detail::to_device_ptr(p), value, bytes, stream));
  std::vector<unsigned char> head(std::min<std::size_t>(bytes, 4096)), tail(head.size());
  VSR_CU_TRY(api().cuMemcpyDtoHAsync(head.data(), detail::to_device_ptr(p), head.size(), stream));
  VSR_CU_TRY(api().cuMemcpyDtoHAsync(
      tail.data(), detail::to_device_ptr(static_cast<unsigned char*>(p) + bytes - tail.size()),
      tail.size(), stream));
  VSR_CU_TRY(stream == nullptr ? api().cuCtxSynchronize() : api().cuStreamSynchronize(stream));
  for (std::size_t i = 0; i < head.size(); ++i) {
    if (head[i] != value || tail[i] != value) return false;
  }
  return true;
}

// ---- dispatch ---------------------------------------------------------------------------------

vsr::OwnedRasterArray sample(int bands, std::int64_t h, std::int64_t w) {
  auto r =
      vsr::OwnedRasterArray::allocate(vsr::Residency::host, vsr::DType::float32, bands, h, w, -1.0,
                                      vsr::Affine{30, 0, 500, 0, -30, 900}, "EPSG:32633");
  auto* p = static_cast<float*>(r.mutable_host_data());
  for (std::size_t i = 0; i < static_cast<std::size_t>(bands * h * w); ++i)
    p[i] = static_cast<float>((i * 2654435761u) % 1000u);
  return r;
}

vsr::OwnedRasterArray device_copy(const vsr::OwnedRasterArray& band, CUstream stream) {
  // Pool memory for the stream that writes it (the pool orders it after earlier users).
  vsr::OwnedRasterArray out =
      vsr::OwnedRasterArray::allocate(vsr::Residency::device, band.dtype(), 1, band.height(),
                                      band.width(), band.nodata(), {}, {}, stream);
  VSR_CU_TRY(api().cuMemcpyDtoDAsync(detail::to_device_ptr(out.device_data()),
                                     detail::to_device_ptr(band.device_pointer()), band.byte_size(),
                                     stream));
  return out;
}

bool same_bytes(const vsr::OwnedRasterArray& a, const vsr::OwnedRasterArray& b) {
  if (a.byte_size() != b.byte_size() || a.dtype() != b.dtype()) return false;
  std::vector<unsigned char> x(a.byte_size()), y(b.byte_size());
  a.copy_to_host(x.data());
  b.copy_to_host(y.data());
  return x == y;
}

void case_dispatch() {
  const bool real_ops = g_emulator || vsr::ops_built_with_cuda();
  const int bands = 8;
  const std::int64_t h = 1024, w = 1024;  // 4 MiB per band
  const vsr::OwnedRasterArray in = sample(bands, h, w);
  const vsr::StreamBandOp op =
      real_ops ? vsr::StreamBandOp([](const vsr::OwnedRasterArray& b, CUstream s) {
        return vsr::rescale(b, 0, 1000, 0, 1, vsr::DType::float32, s);
      })
               : vsr::StreamBandOp(device_copy);
  const vsr::OwnedRasterArray expected =
      real_ops ? vsr::rescale(in, 0, 1000, 0, 1, vsr::DType::float32) : in;
  const std::string what = real_ops ? "rescale" : "device copy";

  vsr::GpuDispatchOptions batched;  // 1 band per pass, double-buffered: 8 passes
  batched.vram_budget = static_cast<std::uint64_t>(4.0 * kMiB * 2 * 1.5 / 0.35);
  vsr::GpuDispatchReport rep;
  vsr::OwnedRasterArray out = vsr::dispatch_per_band_gpu(in, op, batched, &rep);
  SMOKE_CHECK(rep.passes == 8 && rep.pipeline_depth == 2 && rep.output == vsr::Residency::host,
              "dispatch: stream form, 8 double-buffered passes, host output",
              std::to_string(rep.passes) + " passes, depth " + std::to_string(rep.pipeline_depth));
  SMOKE_CHECK(same_bytes(out, expected), "dispatch: stream form results == host " + what,
              "the output differs");
  SMOKE_CHECK(out.affine() == in.affine() && out.crs() == in.crs(),
              "dispatch: source georeferencing kept", "affine or CRS differ");

  vsr::GpuDispatchOptions roomy;  // everything fits: output stays on the device
  roomy.vram_budget = 512 * kMiB;
  out = vsr::dispatch_per_band_gpu(in, op, roomy, &rep);
  SMOKE_CHECK(rep.output == vsr::Residency::device && same_bytes(out, expected),
              "dispatch: device output == host " + what, "wrong residency or pixels");

  vsr::OwnedRasterArray dev_in = sample(bands, h, w);
  dev_in.move_to(vsr::Residency::device);
  out = vsr::dispatch_per_band_gpu(dev_in, op, batched, &rep);
  SMOKE_CHECK(!rep.input_copied && same_bytes(out, expected),
              "dispatch: device-resident input == host " + what, "the output differs");

  // The legacy-stream form, as before: ops on the legacy default stream.
  const vsr::BandOp legacy =
      real_ops
          ? vsr::BandOp([](const vsr::OwnedRasterArray& b) {
              return vsr::rescale(b, 0, 1000, 0, 1, vsr::DType::float32);
            })
          : vsr::BandOp([](const vsr::OwnedRasterArray& b) { return device_copy(b, nullptr); });
  out = vsr::dispatch_per_band_gpu(in, legacy);
  SMOKE_CHECK(same_bytes(out, expected), "dispatch: legacy-stream form == host " + what,
              "the output differs");
  out = vsr::OwnedRasterArray::allocate(vsr::Residency::host, vsr::DType::uint8, 1, 1, 1);
  vsr::free_dispatch_resources();
  SMOKE_CHECK(vsr::memory_pool_stats().current_bytes.value_or(0) == dev_in.byte_size(),
              "dispatch: nothing left in the pool but the input",
              std::to_string(vsr::memory_pool_stats().current_bytes.value_or(0)) + " bytes live");
}

// ---- pool tiers -------------------------------------------------------------------------------

void case_tier_a() {
  const std::string tier = vsr::configure_memory_pool();
  SMOKE_CHECK(tier == "A", "tier-a: VIBESPATIAL_GPU_POOL_ONLY=1 configures tier A", tier);
  bool ok = true;
  for (std::size_t bytes : {std::size_t{256}, std::size_t{100000}, 3 * kMiB, unit()}) {
    void* p = vsr::device_allocate(bytes);
    ok = ok && pattern_roundtrip(p, bytes, static_cast<unsigned char>(bytes % 251));
    vsr::device_deallocate(p, bytes);
  }
  SMOKE_CHECK(ok, "tier-a: blocks hold their patterns", "a pattern did not read back");
  vsr::free_pool_memory();  // no cached page: the hog leaves exactly what the pool may use
  {
    Hog hog(3 * unit());
    // Tier B would call this handler (which frees a block, enough for the request) and succeed.
    void* held = vsr::device_allocate(2 * unit());
    std::atomic<int> calls{0};
    const std::uint64_t id = vsr::add_oom_handler([&](std::size_t) {
      ++calls;
      if (held != nullptr) vsr::device_deallocate(held, 2 * unit());
      held = nullptr;
      return true;
    });
    bool oom = false;
    try {
      void* p = vsr::device_allocate(2 * unit());
      vsr::device_deallocate(p, 2 * unit());
    } catch (const vsr::OutOfMemoryError&) {
      oom = true;
    }
    vsr::remove_oom_handler(id);
    if (held != nullptr) vsr::device_deallocate(held, 2 * unit());
    SMOKE_CHECK(hog.bytes() > 0 && oom && calls == 0,
                "tier-a: a full device fails at once (OutOfMemoryError, no handler called)",
                hog.bytes() == 0
                    ? "could not fill the device"
                    : (oom ? "" : "the request succeeded; ") + std::string("handler calls ") +
                          std::to_string(calls.load()));
    SMOKE_CHECK(vsr::memory_pool_stats().oom_recoveries == 0, "tier-a: no recovery attempted",
                std::to_string(vsr::memory_pool_stats().oom_recoveries));
  }
  void* p = vsr::device_allocate(3 * unit());
  SMOKE_CHECK(pattern_roundtrip(p, 3 * unit(), 0x5a),
              "tier-a: the same request once memory is back", "pattern");
  vsr::device_deallocate(p, 3 * unit());
}

void case_tier_b_oom() {
  const std::string tier = vsr::configure_memory_pool();
  SMOKE_CHECK(tier == "B", "tier-b-oom: the default tier is B", tier);
  Hog hog(6 * unit());
  SMOKE_CHECK(
      hog.bytes() > 0,
      "tier-b-oom: device filled to " + std::to_string(free_device_bytes() / kMiB) + " MiB free",
      "could not fill the device");
  void* held = vsr::device_allocate(3 * unit());
  std::atomic<int> calls{0};
  const std::uint64_t id = vsr::add_oom_handler([&](std::size_t) {
    ++calls;
    if (held == nullptr) return false;
    vsr::device_deallocate(held, 3 * unit());
    held = nullptr;
    return true;
  });
  void* big = nullptr;
  std::string error;
  try {
    big = vsr::device_allocate(4 * unit());
  } catch (const std::exception& e) {
    error = e.what();
  }
  SMOKE_CHECK(big != nullptr && calls >= 1 && held == nullptr,
              "tier-b-oom: the handler freed memory and the request succeeded",
              error.empty() ? "handler calls " + std::to_string(calls.load()) : error);
  SMOKE_CHECK(vsr::memory_pool_stats().oom_recoveries >= 1, "tier-b-oom: oom_recoveries counted",
              std::to_string(vsr::memory_pool_stats().oom_recoveries));
  if (big != nullptr) {
    SMOKE_CHECK(pattern_roundtrip(big, 4 * unit(), 0xa5), "tier-b-oom: the recovered block works",
                "pattern");
    vsr::device_deallocate(big, 4 * unit());
  }
  if (held != nullptr) vsr::device_deallocate(held, 3 * unit());
  vsr::remove_oom_handler(id);
}

void case_tier_c() {
  const std::size_t bytes = 64 * kMiB;
  const std::size_t f = free_device_bytes();
  if (f < 8 * bytes) {
    std::printf("SKIP tier-c: only %zu MiB free; managed memory is asked for only with 8x free\n",
                f / kMiB);
    return;
  }
  const std::string tier = vsr::configure_memory_pool();
  SMOKE_CHECK(tier == "C", "tier-c: VIBESPATIAL_GPU_MANAGED_MEMORY=1 configures tier C", tier);
  void* p = vsr::device_allocate(bytes);
  SMOKE_CHECK(pattern_roundtrip(p, bytes, 0x3c), "tier-c: 64 MiB of managed memory holds a pattern",
              "pattern");
  vsr::device_deallocate(p, bytes);
  const vsr::MemoryPoolStats s = vsr::memory_pool_stats();
  SMOKE_CHECK(s.current_bytes.value_or(1) == 0 && s.total_count.value_or(0) >= 1,
              "tier-c: statistics count it and its release", "current bytes not 0");
}

void case_fallback() {
  const int device = detail::bind_current_device();
  const std::size_t before = free_device_bytes();
  auto pool = detail::make_fallback_pool(device);
  std::vector<std::pair<void*, std::size_t>> blocks;
  bool ok = true;
  for (std::size_t bytes : {std::size_t{512}, std::size_t{70000}, 2 * kMiB + 3, unit()}) {
    void* p = pool->allocate(bytes, nullptr);
    ok = ok && pattern_roundtrip(p, bytes, static_cast<unsigned char>(bytes % 253));
    blocks.emplace_back(p, bytes);
  }
  SMOKE_CHECK(ok, "fallback: blocks hold their patterns", "pattern");
  for (auto [p, bytes] : blocks) pool->deallocate(p, bytes, nullptr);
  void* again = pool->allocate(unit(), nullptr);  // from the cache
  SMOKE_CHECK(again == blocks.back().first, "fallback: a freed block is reused",
              "another block was returned");
  pool->deallocate(again, unit(), nullptr);
  vsr::MemoryPoolStats s;
  pool->fill_stats(s);
  SMOKE_CHECK(s.used_bytes.value_or(1) == 0 && s.free_bytes.value_or(0) > 0,
              "fallback: statistics: nothing used, the cache held", "used bytes not 0");
  pool->trim();
  pool->teardown();
  pool.reset();
  const std::size_t after = free_device_bytes();
  SMOKE_CHECK(free_bytes_match(before, after), "fallback: cuMemGetInfo back after trim",
              free_bytes_detail(before, after));
}

// ---- threads and streams ----------------------------------------------------------------------

void case_threads() {
  (void)vsr::configure_memory_pool();
  const int threads = 8, rounds = g_emulator ? 40 : 200;
  std::atomic<int> bad{0}, errors{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      try {
        detail::bind_current_device();
        CUstream s = nullptr;
        VSR_CU_TRY(api().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        std::vector<unsigned char> host(4096);
        for (int r = 0; r < rounds; ++r) {
          const std::size_t bytes = (r % 3 == 0) ? 8 * kMiB : std::size_t{4096} << (r % 6);
          const auto v = static_cast<unsigned char>((t * 31 + r) & 0xff);
          void* p = vsr::device_allocate(bytes, s);
          VSR_CU_TRY(api().cuMemsetD8Async(detail::to_device_ptr(p), v, bytes, s));
          VSR_CU_TRY(api().cuMemcpyDtoHAsync(
              host.data(),
              detail::to_device_ptr(static_cast<unsigned char*>(p) + bytes - host.size()),
              host.size(), s));
          VSR_CU_TRY(api().cuStreamSynchronize(s));
          for (unsigned char c : host) bad += c != v;
          // More work queued, then freed with it still pending: the block may go to another
          // stream only once that work is done, or its pattern above would be overwritten.
          VSR_CU_TRY(api().cuMemsetD8Async(detail::to_device_ptr(p), v, bytes, s));
          vsr::device_deallocate(p, bytes, s);
        }
        VSR_CU_TRY(api().cuStreamSynchronize(s));
        VSR_CU_TRY(api().cuStreamDestroy(s));
      } catch (const std::exception& e) {
        ++errors;
        report(false, "threads: thread " + std::to_string(t), e.what());
      }
    });
  }
  for (auto& t : ts) t.join();
  SMOKE_CHECK(bad == 0 && errors == 0,
              "threads: 8 threads x " + std::to_string(rounds) +
                  " rounds on their own streams, pending frees, every pattern intact",
              std::to_string(bad.load()) + " bad bytes");
  SMOKE_CHECK(vsr::memory_pool_stats().current_bytes.value_or(1) == 0,
              "threads: nothing live afterwards", "live bytes");
}

// ---- free_pool_memory -------------------------------------------------------------------------

void case_free_pool() {
  (void)vsr::configure_memory_pool();
  auto cycle = [] {
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (int i = 0; i < 24; ++i) {
      const std::size_t bytes = (i % 4 == 0) ? unit() / 4 : std::size_t{1000} << (i % 10);
      blocks.emplace_back(vsr::device_allocate(bytes), bytes);
    }
    for (auto [p, b] : blocks) vsr::device_deallocate(p, b);
    vsr::free_pool_memory();
  };
  cycle();  // warm-up: the driver's own lazy allocations happen here
  const std::size_t start = free_device_bytes();
  cycle();
  const std::size_t end = free_device_bytes();
  SMOKE_CHECK(free_bytes_match(start, end),
              "free-pool: cuMemGetInfo back to its start after free_pool_memory()",
              free_bytes_detail(start, end));
  const vsr::MemoryPoolStats s = vsr::memory_pool_stats();
  SMOKE_CHECK(s.pool_size.value_or(0) == 0 && s.pool_free_bytes == 0,
              "free-pool: the pool holds no page", std::to_string(s.pool_size.value_or(0)));
}

int usage() {
  std::fprintf(stderr,
               "usage: vsr-gpu-smoke dispatch|tier-a|tier-b-oom|tier-c|fallback|threads|free-pool "
               "[--emulator]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) return usage();
  const std::string name = argv[1];
  if (argc == 3) {
    if (std::strcmp(argv[2], "--emulator") != 0) return usage();
    g_emulator = true;
  }
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"dispatch", case_dispatch},  {"tier-a", case_tier_a},     {"tier-b-oom", case_tier_b_oom},
      {"tier-c", case_tier_c},      {"fallback", case_fallback}, {"threads", case_threads},
      {"free-pool", case_free_pool}};
  const std::function<void()>* run = nullptr;
  for (const auto& [n, f] : cases) {
    if (n == name) run = &f;
  }
  if (run == nullptr) return usage();
  const auto& st = detail::driver_state();
  if (!st.available) {
    std::fprintf(stderr, "vsr-gpu-smoke %s: skipped: no usable CUDA driver: %s\n", name.c_str(),
                 st.reason.c_str());
    return 77;
  }
  if (st.emulated != g_emulator) {
    std::fprintf(stderr, "vsr-gpu-smoke %s: skipped: the driver is %s (%s)\n", name.c_str(),
                 st.emulated ? "the host emulator" : "not the emulator", st.library.c_str());
    return 77;
  }
  try {
    (*run)();
  } catch (const std::exception& e) {
    report(false, name, std::string("exception: ") + e.what());
  }
  return g_failed == 0 ? 0 : 1;
}
