// SPDX-License-Identifier: Apache-2.0
// vsr-bench alloc's traces and contenders. A trace is a replacement workload (fill a live set,
// then free one random block and allocate a new size, step after step); a contender is an
// allocator (the pool, malloc, the driver's cuMemAlloc and cuMemAllocAsync) that replays it.
// Every contender replays exactly the same calls, in interleaved rounds.
#pragma once

#include "bench.hpp"
#include "bench_driver.hpp"

#include <vibespatial/raster/memory.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <vector>

namespace vsr = vibespatial::raster;

namespace vsr_bench {

// ---- traces -------------------------------------------------------------------------------------

enum class Dist { log_uniform, uniform };

const char* dist_name(Dist d);

/// A size in [lo, hi], drawn from @p d.
std::size_t draw(std::mt19937_64& rng, std::size_t lo, std::size_t hi, Dist d);

/// The mean size of @p d over [lo, hi].
double mean_size(std::size_t lo, std::size_t hi, Dist d);

// A replacement trace: fill `live` slots, then each step frees one random slot and allocates a
// new size into it. Every contender replays exactly the same calls.
struct Trace {
  std::string name;
  std::size_t lo = 0, hi = 0;
  Dist dist = Dist::log_uniform;
  std::vector<std::size_t> fill;
  struct Step {
    std::uint32_t slot;
    std::size_t size;
  };
  std::vector<Step> steps;
};

Trace make_trace(std::string name, std::size_t live, std::size_t lo, std::size_t hi,
                 std::size_t steps, std::uint64_t seed, Dist dist = Dist::log_uniform);

/// A hash of a trace's sizes and steps (FNV-1a): two processes that built the same trace agree.
std::uint64_t fingerprint(const Trace& t);

// ---- contenders ---------------------------------------------------------------------------------

struct PoolAlloc {
  CUstream stream = nullptr;
  void* alloc(std::size_t b) { return vsr::device_allocate(b, stream); }
  void release(void* p, std::size_t b) { vsr::device_deallocate(p, b, stream); }
  void settle() {}
};

struct MallocAlloc {
  // Called through volatile pointers so the compiler cannot pair and elide malloc/free.
  static inline void* (*volatile do_malloc)(std::size_t) = std::malloc;
  static inline void (*volatile do_free)(void*) = std::free;
  void* alloc(std::size_t b) {
    void* p = do_malloc(b);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void release(void* p, std::size_t) { do_free(p); }
  void settle() {}
};

struct CuMemAlloc {
  void* alloc(std::size_t b) {
    CUdeviceptr p = 0;
    BENCH_CU_TRY(vsr_bench::driver().cuMemAlloc(&p, b));
    return reinterpret_cast<void*>(p);
  }
  void release(void* p, std::size_t) {
    BENCH_CU_TRY(vsr_bench::driver().cuMemFree(reinterpret_cast<CUdeviceptr>(p)));
  }
  void settle() {}
};

struct CuMemAllocAsync {
  CUstream stream = nullptr;
  void* alloc(std::size_t b) {
    CUdeviceptr p = 0;
    BENCH_CU_TRY(vsr_bench::driver().cuMemAllocAsync(&p, b, stream));
    return reinterpret_cast<void*>(p);
  }
  void release(void* p, std::size_t) {
    BENCH_CU_TRY(vsr_bench::driver().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(p), stream));
  }
  void settle() { BENCH_CU_TRY(vsr_bench::driver().cuStreamSynchronize(stream)); }
};

// One pass of @p t on @p a: fill the live set, the first `steps` replacement steps, drain the live
// set, settle. `on_steps(true)` is called just before the steps and `on_steps(false)` just after
// them, where a caller starts and stops its clock or its counters.
template <class A, class OnSteps>
void run_trace(A& a, const Trace& t, std::size_t steps, OnSteps on_steps) {
  std::vector<void*> ptr(t.fill.size());
  std::vector<std::size_t> size = t.fill;
  for (std::size_t i = 0; i < ptr.size(); ++i) ptr[i] = a.alloc(size[i]);
  on_steps(true);
  for (std::size_t k = 0; k < steps; ++k) {
    const Trace::Step& s = t.steps[k];
    a.release(ptr[s.slot], size[s.slot]);
    ptr[s.slot] = a.alloc(s.size);
    size[s.slot] = s.size;
  }
  on_steps(false);
  for (std::size_t i = 0; i < ptr.size(); ++i) a.release(ptr[i], size[i]);
  a.settle();
}

// One round: fill (untimed), `steps` replacement steps (timed), drain (untimed).
// Returns ns per call (an allocation or a free).
template <class A>
double replay(A& a, const Trace& t, std::size_t steps) {
  Clock::time_point t0, t1;
  run_trace(a, t, steps, [&](bool start) { (start ? t0 : t1) = Clock::now(); });
  return static_cast<double>(
             std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()) /
         (2.0 * static_cast<double>(steps));
}

struct Contender {
  std::string name;
  std::function<double(const Trace&, std::size_t)> round;
};

template <class A>
Contender contender(std::string name, A a) {
  return {std::move(name),
          [a](const Trace& t, std::size_t steps) mutable { return replay(a, t, steps); }};
}

// samples[c][r]: ns/op of contender c in round r. One untimed warm-up round per contender first.
std::vector<std::vector<double>> interleave(const std::string& label, const Trace& t,
                                            std::size_t steps, int rounds,
                                            std::vector<Contender>& cs);

}  // namespace vsr_bench
