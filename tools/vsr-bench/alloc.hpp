// SPDX-License-Identifier: Apache-2.0
// vsr-bench alloc: the device memory pool against malloc and the driver's allocators, its thread
// scaling, its fragmentation, and its cost as the device grows. This header holds the benchmark's
// sizes and its sections, one file each: alloc_traces.cpp (1, 2), alloc_threads.cpp (3),
// alloc_frag.cpp (4), alloc_scale.cpp (5), alloc_default.cpp (6: slack), alloc_growth.cpp (7);
// alloc.cpp runs them.
#pragma once

#include "bench.hpp"
#include "trace.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vsr_bench {

struct AllocSizes {
  std::size_t small_live = 10000, small_steps = 200000;
  std::size_t large_live = 256, large_steps = 5000;
  std::size_t drv_small_steps = 5000, drv_large_steps = 500;
  std::size_t thread_steps = 500000;
  std::size_t frag_allocs = 20000;
  std::size_t frag_cap = 4 * kGiB;
  int rounds = 7, drv_rounds = 5, thread_rounds = 9;  // threads: short rounds, noisy on few CPUs
  std::vector<std::size_t> default_lives = {256, 1024, 2048};  // section 6's live-set sizes
  std::size_t default_steps = 5000;
  std::size_t growth_bytes = 16 * kGiB;  // section 7's growth
};

/// VMM calls (create, release, map, unmap, set access) per alloc+free pair of a steady run of
/// @p t on the pool: one more round, counted over its replacement steps only. -1 on a real
/// driver, whose calls nobody counts.
double vmm_calls_per_op(const Trace& t, std::size_t steps);

/// The large trace (1 to 64 MiB, log-uniform): one definition for the sections and the scale
/// section's workers, which rebuild it from these numbers.
Trace make_large_trace(std::size_t live, std::size_t steps, std::uint64_t seed);

/// 1. The pool against malloc on the small and the large trace, and the VMM calls of a steady
/// large trace.
void section_malloc(Report& rep, const Trace& small, const Trace& large, const AllocSizes& z,
                    bool quiet);
/// Section 1b (with section 1): the small trace with the memory history off and on.
void section_recording(Report& rep, const Trace& small, const AllocSizes& z, bool quiet);
/// 2. The pool against cuMemAlloc and cuMemAllocAsync on one stream.
void section_driver(Report& rep, const Trace& small, const Trace& large, const AllocSizes& z,
                    bool quiet);
/// 3. Aggregate calls per second of 2 threads over 1 on the pool's fast path.
void section_threads(Report& rep, const AllocSizes& z, std::uint64_t seed, bool quiet);
/// 4. Peak physical over peak live bytes under churn.
void section_fragmentation(Report& rep, const AllocSizes& z, std::uint64_t seed, bool quiet);
/// 6. The slack policy as configured: the large trace at several live-set sizes with and
/// without the emulator's A100 latency model, its VMM calls, and a near-full device.
void section_default(Report& rep, const AllocSizes& z, std::uint64_t seed, bool quiet);
/// 5. The large trace's cost on an 8 GiB and a 141 GiB emulated device, side by side (emulator
/// only): @p large was made by make_large_trace with @p large_seed.
void section_scale(Report& rep, const Trace& large, std::uint64_t large_seed, const AllocSizes& z,
                   bool quiet);

/// 7. Growing the pool by AllocSizes::growth_bytes under the emulator's A100 latency model, with
/// multi-page handles and with one handle per page, each in a worker process (emulator only).
void section_growth(Report& rep, const AllocSizes& z, bool quiet);
/// The growth section's worker (the hidden command alloc-growth-worker): grows the pool by
/// @p bytes in one request, then in 256 MiB requests, and prints the figures on one line.
int run_growth_worker(std::size_t bytes);

}  // namespace vsr_bench
