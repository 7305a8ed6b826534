// SPDX-License-Identifier: Apache-2.0
// vsr-bench alloc, section 4: fragmentation, the pool's peak physical memory over the peak live
// requested bytes under churn.
#include "alloc.hpp"

#include <vibespatial/raster/memory.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace vsr_bench {
namespace {

struct FragResult {
  std::size_t allocs = 0, frees = 0, base = 0;
  std::size_t peak_live = 0, peak_live_pages = 0, peak_pool = 0;
  double ratio = NAN, page_floor = NAN;
};

// Churn under a live-bytes cap: allocate while the next request fits, else free random live
// blocks until it does. pool_size is sampled after every call; the pool is never trimmed.
FragResult fragmentation(Dist dist, std::size_t cap, std::size_t allocs, std::uint64_t seed,
                         std::size_t page) {
  FragResult f;
  vsr::free_pool_memory();  // earlier sections' pages would count as this trace's
  f.base = vsr::memory_pool_stats().pool_size.value_or(0);
  std::mt19937_64 rng(seed);
  struct Live {
    void* p;
    std::size_t size;
  };
  std::vector<Live> live;
  std::map<std::uintptr_t, std::uintptr_t> ranges;  // live [begin, end)
  std::size_t live_bytes = 0, live_pages = 0;
  const auto pages = [page](std::size_t b) { return (b + page - 1) / page * page; };
  const auto sample = [&] {
    f.peak_live = std::max(f.peak_live, live_bytes);
    f.peak_live_pages = std::max(f.peak_live_pages, live_pages);
    f.peak_pool = std::max(f.peak_pool, vsr::memory_pool_stats().pool_size.value_or(0));
  };
  for (std::size_t k = 0; k < allocs; ++k) {
    const std::size_t size = draw(rng, 1 * kMiB, 64 * kMiB, dist);
    while (!live.empty() && live_bytes + size > cap) {
      const std::size_t i = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      vsr::device_deallocate(live[i].p, live[i].size);
      ranges.erase(reinterpret_cast<std::uintptr_t>(live[i].p));
      live_bytes -= live[i].size;
      live_pages -= pages(live[i].size);
      live[i] = live.back();
      live.pop_back();
      ++f.frees;
      sample();
    }
    void* p = vsr::device_allocate(size);
    // Not timed, so the trace also checks that no two live blocks overlap.
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto next = ranges.lower_bound(a);
    const bool overlaps = (next != ranges.end() && next->first < a + size) ||
                          (next != ranges.begin() && std::prev(next)->second > a);
    if (overlaps) {
      throw std::runtime_error("the pool handed out a block overlapping a live one (" +
                               std::to_string(size) + " bytes at " + std::to_string(a) +
                               ", allocation " + std::to_string(k) + ")");
    }
    ranges.emplace(a, a + size);
    live.push_back({p, size});
    live_bytes += size;
    live_pages += pages(size);
    ++f.allocs;
    sample();
  }
  for (const Live& l : live) vsr::device_deallocate(l.p, l.size);
  f.ratio = static_cast<double>(f.peak_pool - std::min(f.base, f.peak_pool)) /
            static_cast<double>(f.peak_live);
  f.page_floor = static_cast<double>(f.peak_live_pages) / static_cast<double>(f.peak_live);
  return f;
}

}  // namespace

void section_fragmentation(Report& rep, const AllocSizes& z, std::uint64_t seed, bool quiet) {
  const std::string goal = "<= 1.15";  // the default keeps up to a tenth of slack
  Table tab({"sizes", "live cap", "allocs", "frees", "peak live requested", "peak pool_size",
             "peak/requested", "page-rounding floor", "goal", "met"});
  int idx = 0;
  for (Dist d : {Dist::uniform, Dist::log_uniform}) {
    progress("4/6 fragmentation: %s sizes, %zu allocations, cap %s", dist_name(d), z.frag_allocs,
             format_bytes(z.frag_cap).c_str());
    FragResult f;
    if (!run_case(rep, tab, std::string("1-64 MiB ") + dist_name(d),
                  std::string("fragmentation ") + dist_name(d), [&] {
                    f = fragmentation(d, z.frag_cap, z.frag_allocs, seed + 2000 + idx++,
                                      rep.machine.granularity);
                  })) {
      continue;
    }
    // The uniform trace is the goal; log-uniform is information (its many 1-2 MiB requests put
    // the page-rounding floor itself above the goal).
    const bool scored = d == Dist::uniform;
    const std::string met = scored ? met_str(f.ratio, goal) : "n/a";
    const std::string sizes = std::string("1-64 MiB ") + dist_name(d);
    tab.add({sizes, format_bytes(z.frag_cap), std::to_string(f.allocs), std::to_string(f.frees),
             format_bytes(f.peak_live), format_bytes(f.peak_pool), fmt("%.4f", f.ratio),
             fmt("%.4f", f.page_floor), scored ? goal : "(info)", met});
    rep.summary.push_back({"fragmentation peak pool_size / peak live requested, " + sizes, f.ratio,
                           scored ? goal : "", met,
                           "page-rounding floor " + fmt("%.4f", f.page_floor)});
    rep.section_json(
        "{\"section\": \"fragmentation\", \"sizes\": " + json_string(sizes) +
        ", \"live_cap_bytes\": " + std::to_string(z.frag_cap) +
        ", \"allocs\": " + std::to_string(f.allocs) + ", \"frees\": " + std::to_string(f.frees) +
        ", \"pool_size_before\": " + std::to_string(f.base) +
        ", \"peak_live_requested_bytes\": " + std::to_string(f.peak_live) +
        ", \"peak_live_page_rounded_bytes\": " + std::to_string(f.peak_live_pages) +
        ", \"peak_pool_size_bytes\": " + std::to_string(f.peak_pool) + ", \"ratio\": " +
        json_num(f.ratio) + ", \"page_rounding_floor\": " + json_num(f.page_floor) +
        ", \"goal\": " + json_string(scored ? goal : "") + ", \"met\": " + json_string(met) + "}");
  }
  if (!quiet) {
    tab.print(
        "== 4. Fragmentation: churn under a live-bytes cap; peak physical (pool_size sampled "
        "after every call, never trimmed) over peak live requested bytes ==");
  }
}

}  // namespace vsr_bench
