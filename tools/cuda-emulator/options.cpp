// SPDX-License-Identifier: Apache-2.0
// The emulator's configuration (VSR_EMU_* variables and vsr_emu_set_option), the call accounting
// every entry point goes through (counts, the fault plan, the latency model) and the misuse
// report. See vsr_emulator.h for what each option means.
#include "emulator_state.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string_view>
#include <thread>

namespace vsr::emu {
namespace {

// The entry point the calling thread is in (for misuse messages).
thread_local const char* tl_entry = "?";

bool parse_double(std::string_view text, double* out) {
  if (text.empty()) return false;
  std::string copy(text);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(copy.c_str(), &end);
  if (errno != 0 || *end != '\0' || !(v >= 0) || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// "<bytes>" or "<number><suffix>": *bytes = bytes and *scaled = 0, or *bytes = 0 and *scaled =
// number / divisor where `valid(number)`.
bool parse_bytes_or_scaled(const char* text, char suffix, bool (*valid)(double), double divisor,
                           size_t* bytes, double* scaled) {
  if (text == nullptr) return false;
  std::string_view v(text);
  if (!v.empty() && v.back() == suffix) {
    double number = 0;
    if (!parse_double(v.substr(0, v.size() - 1), &number) || !valid(number)) return false;
    *bytes = 0;
    *scaled = number / divisor;
    return true;
  }
  size_t b = 0;
  if (!parse_size(text, &b)) return false;
  *bytes = b;
  *scaled = 0;
  return true;
}

// "<bytes>" or "<f>x" (a multiple of all devices' memory).
bool parse_address_space(const char* text, size_t* bytes, double* factor) {
  return parse_bytes_or_scaled(
      text, 'x', [](double f) { return f > 0; }, 1, bytes, factor);
}

// "<bytes>" or "<p>%" (a percentage of the device memory, below 100).
bool parse_overhead(const char* text, size_t* bytes, double* fraction) {
  return parse_bytes_or_scaled(
      text, '%', [](double p) { return p < 100; }, 100, bytes, fraction);
}

// Calls `item` with each item of a comma list, blanks around it trimmed and empty ones skipped;
// false as soon as it returns false.
template <typename F>
bool for_each_item(std::string_view list, F&& item) {
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view one = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    while (!one.empty() && one.front() == ' ') one.remove_prefix(1);
    while (!one.empty() && one.back() == ' ') one.remove_suffix(1);
    if (!one.empty() && !item(one)) return false;
  }
  return true;
}

// `<number><ns|us|ms|s>`, at most 60 s.
bool parse_duration(std::string_view amount, std::chrono::nanoseconds* out) {
  double scale = 0;
  for (auto [suffix, ns] :
       {std::pair<std::string_view, double>{"ns", 1.0}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}}) {
    if (amount.size() > suffix.size() && amount.substr(amount.size() - suffix.size()) == suffix) {
      amount.remove_suffix(suffix.size());
      scale = ns;
      break;
    }
  }
  double value = 0;
  if (scale == 0 || !parse_double(amount, &value) || value * scale > 60e9) return false;
  *out = std::chrono::nanoseconds(static_cast<long long>(std::llround(value * scale)));
  return true;
}

// LATE_WORK: "0" (off) or a duration.
bool parse_late_work(std::string_view text, std::chrono::nanoseconds* out) {
  if (text == "0") {
    *out = std::chrono::nanoseconds{0};
    return true;
  }
  return parse_duration(text, out);
}

// The LATE_WORK value in its own syntax.
std::string late_work_text(std::chrono::nanoseconds d) {
  return d.count() == 0 ? "0" : std::to_string(d.count()) + "ns";
}

// What VSR_EMU_ADVERSARIAL gives LATE_WORK: up to 50 us per task (about ten kernel launches'
// latency), enough to reorder work on streams that do not wait for each other while the
// adversarial suites stay within a few percent of their time (a test wanting more sets it).
constexpr std::chrono::nanoseconds kAdversarialLateWork = std::chrono::microseconds(50);

// The calling thread's `@run` fault for its current call (take_run_fault).
thread_local CUresult tl_run_fault = CUDA_SUCCESS;

// Measured on an A100 with 2 MiB pages (docs/cuda-driver-rules.md §7 #1; allocator anchors [N4]).
constexpr const char* kA100Latency =
    "cuMemAddressReserve:19us,cuMemCreate:193us,cuMemMap:1450ns,cuMemSetAccess:36us,"
    "cuMemUnmap:25600ns";

// A comma list of `entry:<number><ns|us|ms|s>` items and presets ("a100"); "" clears.
bool parse_latency(std::string_view spec, std::map<std::string, std::chrono::nanoseconds>* out) {
  std::map<std::string, std::chrono::nanoseconds> plan;
  const bool ok = for_each_item(spec, [&](std::string_view item) {
    if (item == "a100") {
      std::map<std::string, std::chrono::nanoseconds> preset;
      if (!parse_latency(kA100Latency, &preset)) return false;
      plan.insert(preset.begin(), preset.end());
      return true;
    }
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos || colon == 0) return false;
    std::chrono::nanoseconds d{0};
    if (!parse_duration(item.substr(colon + 1), &d)) return false;
    plan[base_name(item.substr(0, colon))] = d;
    return true;
  });
  if (!ok) return false;
  *out = std::move(plan);
  return true;
}

// The options that are plain flags: VSR_EMU_<name> in the environment, vsr_emu_set_option(name)
// at any time. (VMM, MANAGED and MEMORY_POOLS are flags too, but switching one off is checked
// against live objects; REPORT is read from the environment only.)
struct Flag {
  std::string_view name;
  bool Config::*field;
};
constexpr Flag kPlainFlags[] = {{"SYNC", &Config::sync},
                                {"STICKY", &Config::sticky},
                                {"ASYNC_DEFAULT_STREAMS", &Config::async_default_streams},
                                {"RECYCLE_HANDLES", &Config::recycle_handles},
                                {"FREE_NO_SYNC", &Config::free_no_sync},
                                {"REQUIRE_CONTEXT", &Config::require_context},
                                {"STICKY_VMM", &Config::sticky_vmm},
                                {"ABORT_ON_MISUSE", &Config::abort_on_misuse}};

// What VSR_EMU_ADVERSARIAL switches (on: the harshest legal driver; off: the defaults).
void apply_adversarial(Config& c, bool on) {
  const Config defaults;
  c.async_default_streams = on;
  c.recycle_handles = on;
  c.free_no_sync = on;
  c.late_work = on ? kAdversarialLateWork : std::chrono::nanoseconds{0};
  c.require_context = on || defaults.require_context;
  c.sticky_vmm = on || defaults.sticky_vmm;
  c.meminfo_quantum = std::max(on ? 2 * kMiB : 0, defaults.meminfo_quantum);
  c.address_space = 0;
  c.address_space_factor = on ? 1.5 : 0;
  // Real contexts take hundreds of MiB of an 80 GiB device; a fraction keeps small test devices
  // usable.
  c.context_overhead_fraction = on ? 0.02 : 0;
  if (on) c.context_overhead = 0;
}

bool parse_plan(const char* spec, std::vector<FailRule>* out) {
  std::vector<FailRule> plan;
  const bool ok = for_each_item(spec != nullptr ? spec : "", [&](std::string_view item) {
    size_t c1 = item.find(':');
    if (c1 == std::string_view::npos || c1 == 0) return false;
    FailRule rule;
    constexpr std::string_view kAtRun = "@run";
    if (item.size() > kAtRun.size() && item.substr(item.size() - kAtRun.size()) == kAtRun) {
      rule.at_run = true;
      item.remove_suffix(kAtRun.size());
    }
    rule.entry = base_name(item.substr(0, c1));
    std::string_view count = item.substr(c1 + 1);
    size_t c2 = count.find(':');
    std::string_view err = c2 == std::string_view::npos ? std::string_view{} : count.substr(c2 + 1);
    count = count.substr(0, c2);
    if (!count.empty() && count.back() == '+') {
      rule.plus = true;
      count.remove_suffix(1);
    }
    if (count.empty() || count.find_first_not_of("0123456789") != std::string_view::npos) {
      return false;
    }
    rule.n = std::strtoull(std::string(count).c_str(), nullptr, 10);
    if (rule.n == 0) return false;
    if (c2 != std::string_view::npos) {
      if (!error_by_name(err, &rule.error) || rule.error == CUDA_SUCCESS) return false;
      rule.has_error = true;
    }
    plan.push_back(std::move(rule));
    return true;
  });
  if (!ok) return false;
  *out = std::move(plan);
  return true;
}

bool is_allocating(std::string_view entry) {
  for (std::string_view e : {"cuMemCreate", "cuMemAlloc", "cuMemAllocManaged", "cuMemAllocAsync",
                             "cuMemHostAlloc", "cuMemAllocHost", "cuMemAddressReserve"}) {
    if (entry == e) return true;
  }
  return false;
}

// Spends `d` of the caller's time: sleeps the bulk of long waits, spins the rest (a sleep alone
// overshoots microsecond latencies by tens of microseconds).
void spend(std::chrono::nanoseconds d) {
  const Clock::time_point end = Clock::now() + d;
  constexpr auto kSpinTail = std::chrono::microseconds(80);
  if (d > kSpinTail) std::this_thread::sleep_for(d - kSpinTail);
  while (Clock::now() < end) {
  }
}

std::string format_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The value option `name` had in the environment, in set_option's syntax ("" if unknown).
std::string env_value(const Config& e, std::string_view name) {
  auto flag = [](bool v) { return std::string(v ? "1" : "0"); };
  if (name == "DEVICE_MEMORY") return std::to_string(e.device_memory);
  if (name == "GRANULARITY") return std::to_string(e.granularity);
  if (name == "RECOMMENDED_GRANULARITY") return std::to_string(e.recommended_granularity);
  if (name == "CONTEXT_OVERHEAD") {
    return e.context_overhead_fraction > 0 ? format_double(e.context_overhead_fraction * 100) + "%"
                                           : std::to_string(e.context_overhead);
  }
  if (name == "VMM") return flag(e.vmm);
  if (name == "MANAGED") return flag(e.managed);
  if (name == "MEMORY_POOLS") return flag(e.memory_pools);
  for (const Flag& f : kPlainFlags) {
    if (name == f.name) return flag(e.*f.field);
  }
  if (name == "MEMINFO_QUANTUM") return std::to_string(e.meminfo_quantum);
  if (name == "ADDRESS_SPACE") {
    return e.address_space_factor > 0 ? format_double(e.address_space_factor) + "x"
                                      : std::to_string(e.address_space);
  }
  if (name == "LATENCY") return e.latency_spec;
  if (name == "LATE_WORK") return late_work_text(e.late_work);
  return "";
}

}  // namespace

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

bool parse_size(const char* text, size_t* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || text[0] == '-') return false;
  *out = static_cast<size_t>(v);
  return true;
}

bool parse_bool(const char* text, bool* out) {
  if (text == nullptr) return false;
  std::string_view v(text);
  if (v == "1" || v == "true" || v == "on") {
    *out = true;
  } else if (v == "0" || v == "false" || v == "off") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

size_t context_overhead(const Config& c) {
  if (c.context_overhead_fraction > 0) {
    return static_cast<size_t>(static_cast<double>(c.device_memory) * c.context_overhead_fraction);
  }
  return c.context_overhead;
}

size_t address_space_limit(const Config& c) {
  if (c.address_space_factor > 0) {
    const double total = static_cast<double>(c.device_memory) * static_cast<double>(c.device_count);
    return static_cast<size_t>(total * c.address_space_factor);
  }
  return c.address_space;
}

std::string base_name(std::string_view name) {
  for (std::string_view suffix : {"_ptsz", "_ptds"}) {
    if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix) {
      name.remove_suffix(suffix.size());
    }
  }
  size_t pos = name.rfind("_v");
  if (pos != std::string_view::npos && pos + 2 < name.size() &&
      name.find_first_not_of("0123456789", pos + 2) == std::string_view::npos) {
    name = name.substr(0, pos);
  }
  return std::string(name);
}

bool valid_granularity(size_t g) {
  return is_pow2(g) && g % page_size() == 0;
}

void read_env(Config& c) {
  auto warn = [](const char* name) {
    std::fprintf(stderr, "vsr-cuda-emulator: ignoring bad %s\n", name);
  };
  auto size_env = [&](const char* name, size_t* out) {
    const char* v = std::getenv(name);
    if (v != nullptr && !parse_size(v, out)) warn(name);
  };
  auto bool_env = [&](const char* name, bool* out) {
    const char* v = std::getenv(name);
    if (v != nullptr && !parse_bool(v, out)) warn(name);
  };
  // The adversarial switch first: each mode's own variable overrides it.
  bool adversarial = false;
  bool_env("VSR_EMU_ADVERSARIAL", &adversarial);
  if (adversarial) apply_adversarial(c, true);
  size_t count = static_cast<size_t>(c.device_count);
  size_env("VSR_EMU_DEVICE_COUNT", &count);
  c.device_count = static_cast<int>(std::min<size_t>(count, 64));
  size_env("VSR_EMU_DEVICE_MEMORY", &c.device_memory);
  size_t g = c.granularity;
  size_env("VSR_EMU_GRANULARITY", &g);
  if (valid_granularity(g)) {
    c.granularity = g;
  } else {
    warn("VSR_EMU_GRANULARITY");
  }
  size_t rec = 0;
  size_env("VSR_EMU_RECOMMENDED_GRANULARITY", &rec);
  if (rec != 0 && rec % c.granularity == 0) {
    c.recommended_granularity = rec;
  } else if (rec != 0) {
    warn("VSR_EMU_RECOMMENDED_GRANULARITY");
  }
  if (const char* v = std::getenv("VSR_EMU_CONTEXT_OVERHEAD"); v != nullptr) {
    size_t bytes = 0;
    double fraction = 0;
    if (parse_overhead(v, &bytes, &fraction)) {
      c.context_overhead = bytes;
      c.context_overhead_fraction = fraction;
    } else {
      warn("VSR_EMU_CONTEXT_OVERHEAD");
    }
  }
  bool_env("VSR_EMU_VMM", &c.vmm);
  bool_env("VSR_EMU_MANAGED", &c.managed);
  bool_env("VSR_EMU_MEMORY_POOLS", &c.memory_pools);
  for (const Flag& f : kPlainFlags) {
    bool_env(("VSR_EMU_" + std::string(f.name)).c_str(), &(c.*f.field));
  }
  bool_env("VSR_EMU_REPORT", &c.report);
  size_t version = static_cast<size_t>(c.driver_version);
  size_env("VSR_EMU_DRIVER_VERSION", &version);
  c.driver_version = static_cast<int>(version);
  size_env("VSR_EMU_MEMINFO_QUANTUM", &c.meminfo_quantum);
  if (const char* v = std::getenv("VSR_EMU_ADDRESS_SPACE"); v != nullptr) {
    if (!parse_address_space(v, &c.address_space, &c.address_space_factor)) {
      warn("VSR_EMU_ADDRESS_SPACE");
    }
  }
  if (const char* v = std::getenv("VSR_EMU_LATE_WORK"); v != nullptr) {
    if (!parse_late_work(v, &c.late_work)) warn("VSR_EMU_LATE_WORK");
  }
  if (const char* v = std::getenv("VSR_EMU_LATENCY"); v != nullptr) {
    if (parse_latency(v, &c.latency)) {
      c.latency_spec = v;
    } else {
      warn("VSR_EMU_LATENCY");
    }
  }
}

void misuse(State& s, uint64_t* counter, const std::string& what) {
  ++*counter;
  if (!s.config.abort_on_misuse) return;
  std::fprintf(stderr, "vsr-cuda-emulator: %s: %s (VSR_EMU_ABORT_ON_MISUSE=1: aborting)\n",
               tl_entry, what.c_str());
  std::fflush(stderr);
  std::abort();
}

CUresult begin_call(const char* entry, bool allocating) {
  tl_entry = entry;
  tl_run_fault = CUDA_SUCCESS;
  State& s = st();
  std::chrono::nanoseconds delay{0};
  CUresult injected = CUDA_SUCCESS;
  {
    std::lock_guard lock(s.mutex);
    std::string name(entry);
    uint64_t n = ++s.call_counts[name];
    for (const FailRule& rule : s.fail_plan) {
      if (rule.entry != name) continue;
      if (n == rule.n || (rule.plus && n > rule.n)) {
        CUresult error = rule.error;
        if (!rule.has_error) {
          error = rule.at_run                         ? CUDA_ERROR_ILLEGAL_ADDRESS
                  : allocating || is_allocating(name) ? CUDA_ERROR_OUT_OF_MEMORY
                                                      : CUDA_ERROR_UNKNOWN;
        }
        (rule.at_run ? tl_run_fault : injected) = error;
        ++s.fault_counts[name];
        break;
      }
    }
    if (!s.config.latency.empty()) {
      auto it = s.config.latency.find(name);
      if (it != s.config.latency.end()) delay = it->second;
    }
  }
  if (delay.count() > 0) spend(delay);
  return injected;
}

CUresult take_run_fault() {
  const CUresult r = tl_run_fault;
  tl_run_fault = CUDA_SUCCESS;
  return r;
}

void fault_queued_work(CUctx_st* ctx, CUresult error) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (error >= 700 && error <= 799 && s.config.sticky) {
    ctx->poisoned = true;
  } else if (ctx->pending_error == CUDA_SUCCESS) {
    ctx->pending_error = error;
  }
}

std::chrono::nanoseconds late_work_delay() {
  std::chrono::nanoseconds most{0};
  {
    State& s = st();
    std::lock_guard lock(s.mutex);
    most = s.config.late_work;
  }
  if (most.count() <= 0) return most;
  // Each worker draws its own delays: the order of work on streams that do not wait for each
  // other changes from run to run.
  thread_local std::minstd_rand rng(
      static_cast<unsigned>(std::hash<std::thread::id>{}(std::this_thread::get_id()) ^
                            static_cast<size_t>(Clock::now().time_since_epoch().count())));
  return std::chrono::nanoseconds(std::uniform_int_distribution<long long>(0, most.count())(rng));
}

int driver_version() {
  State& s = st();
  std::lock_guard lock(s.mutex);
  return s.config.driver_version;
}

void read_fail_env_once(State& s) {
  if (s.fail_env_read) return;
  s.fail_env_read = true;
  const char* spec = std::getenv("VSR_EMU_FAIL");
  if (spec != nullptr && !parse_plan(spec, &s.fail_plan)) {
    std::fprintf(stderr, "vsr-cuda-emulator: ignoring bad VSR_EMU_FAIL\n");
  }
  s.call_counts.clear();
  s.fault_counts.clear();
}

}  // namespace vsr::emu

using namespace vsr::emu;

/// See vsr_emulator.h.
VSR_EMU_EXPORT int vsr_emu_set_fail(const char* spec) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  std::vector<FailRule> plan;
  if (!parse_plan(spec, &plan)) return CUDA_ERROR_INVALID_VALUE;
  s.fail_plan = std::move(plan);
  s.call_counts.clear();
  s.fault_counts.clear();
  s.fail_env_read = true;
  return CUDA_SUCCESS;
}

/// See vsr_emulator.h.
VSR_EMU_EXPORT unsigned long long vsr_emu_call_count(const char* entry) {
  if (entry == nullptr) return 0;
  State& s = st();
  std::lock_guard lock(s.mutex);
  auto it = s.call_counts.find(base_name(entry));
  return it == s.call_counts.end() ? 0 : it->second;
}

/// See vsr_emulator.h.
VSR_EMU_EXPORT unsigned long long vsr_emu_fault_count(const char* entry) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (entry == nullptr) {
    unsigned long long all = 0;
    for (const auto& [name, n] : s.fault_counts) all += n;
    return all;
  }
  auto it = s.fault_counts.find(base_name(entry));
  return it == s.fault_counts.end() ? 0 : it->second;
}

/// See vsr_emulator.h.
VSR_EMU_EXPORT int vsr_emu_set_option(const char* name, const char* value) {
  if (name == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = st();
  std::lock_guard lock(s.mutex);
  Config& c = s.config;
  std::string_view n(name);
  // "default": the value the environment gave (for ADVERSARIAL: every mode it switches).
  std::string from_env;
  if (std::string_view(value) == "default") {
    if (n == "ADVERSARIAL") {
      const Config& e = s.env_config;
      c.async_default_streams = e.async_default_streams;
      c.recycle_handles = e.recycle_handles;
      c.free_no_sync = e.free_no_sync;
      c.late_work = e.late_work;
      c.require_context = e.require_context;
      c.sticky_vmm = e.sticky_vmm;
      c.meminfo_quantum = e.meminfo_quantum;
      c.address_space = e.address_space;
      c.address_space_factor = e.address_space_factor;
      // The context overhead goes through the capacity check below.
      from_env = env_value(e, "CONTEXT_OVERHEAD");
      n = "CONTEXT_OVERHEAD";
    } else {
      from_env = env_value(s.env_config, n);
      if (from_env.empty() && n != "LATENCY") return CUDA_ERROR_INVALID_VALUE;
    }
    value = from_env.c_str();
  }
  size_t max_charged = 0;
  for (auto& d : s.devices) max_charged = std::max(max_charged, d->charged);
  bool has_linear_kind[3] = {false, false, false};
  for (auto& [p, l] : s.linear) has_linear_kind[static_cast<int>(l.kind)] = true;
  const bool vmm_live = !s.reservations.empty() || s.live_physical != 0 || !s.mappings.empty();

  // Options that take a mode or a size.
  for (const Flag& f : kPlainFlags) {
    if (n != f.name) continue;
    bool v = false;
    if (!parse_bool(value, &v)) return CUDA_ERROR_INVALID_VALUE;
    c.*f.field = v;
    return CUDA_SUCCESS;
  }
  if (n == "ADVERSARIAL") {
    bool on = false;
    if (!parse_bool(value, &on)) return CUDA_ERROR_INVALID_VALUE;
    Config next = c;
    apply_adversarial(next, on);
    if (!on) {
      next.context_overhead = c.context_overhead_fraction > 0 ? 0 : c.context_overhead;
    }
    if (max_charged + context_overhead(next) > next.device_memory) return CUDA_ERROR_NOT_PERMITTED;
    c = next;
    return CUDA_SUCCESS;
  }
  if (n == "LATE_WORK") {
    std::chrono::nanoseconds d{0};
    if (!parse_late_work(value, &d)) return CUDA_ERROR_INVALID_VALUE;
    c.late_work = d;
    return CUDA_SUCCESS;
  }
  if (n == "LATENCY") {
    std::map<std::string, std::chrono::nanoseconds> plan;
    if (!parse_latency(value, &plan)) return CUDA_ERROR_INVALID_VALUE;
    c.latency = std::move(plan);
    c.latency_spec = value;
    return CUDA_SUCCESS;
  }
  if (n == "ADDRESS_SPACE") {
    size_t bytes = 0;
    double factor = 0;
    if (!parse_address_space(value, &bytes, &factor)) return CUDA_ERROR_INVALID_VALUE;
    c.address_space = bytes;
    c.address_space_factor = factor;
    return CUDA_SUCCESS;
  }
  if (n == "CONTEXT_OVERHEAD") {
    Config next = c;
    if (!parse_overhead(value, &next.context_overhead, &next.context_overhead_fraction)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (max_charged + context_overhead(next) > c.device_memory) return CUDA_ERROR_NOT_PERMITTED;
    c = next;
    return CUDA_SUCCESS;
  }
  size_t number = 0;
  bool flag = false;
  if (n == "DEVICE_MEMORY" || n == "GRANULARITY" || n == "RECOMMENDED_GRANULARITY" ||
      n == "MEMINFO_QUANTUM") {
    if (!parse_size(value, &number)) return CUDA_ERROR_INVALID_VALUE;
  } else if (n == "VMM" || n == "MANAGED" || n == "MEMORY_POOLS") {
    if (!parse_bool(value, &flag)) return CUDA_ERROR_INVALID_VALUE;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (n == "DEVICE_MEMORY") {
    Config next = c;
    next.device_memory = number;
    if (number < max_charged + context_overhead(next)) return CUDA_ERROR_NOT_PERMITTED;
    c.device_memory = number;
  } else if (n == "MEMINFO_QUANTUM") {
    c.meminfo_quantum = number;
  } else if (n == "GRANULARITY") {
    if (!valid_granularity(number)) return CUDA_ERROR_INVALID_VALUE;
    if (c.recommended_granularity != 0 && c.recommended_granularity % number != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (s.live_physical != 0 || !s.mappings.empty()) return CUDA_ERROR_NOT_PERMITTED;
    c.granularity = number;
  } else if (n == "RECOMMENDED_GRANULARITY") {
    if (number != 0 && number % c.granularity != 0) return CUDA_ERROR_INVALID_VALUE;
    c.recommended_granularity = number;
  } else if (n == "VMM") {
    if (!flag && vmm_live) return CUDA_ERROR_NOT_PERMITTED;
    c.vmm = flag;
  } else if (n == "MANAGED") {
    if (!flag && has_linear_kind[static_cast<int>(LinearKind::managed)]) {
      return CUDA_ERROR_NOT_PERMITTED;
    }
    c.managed = flag;
  } else {
    if (!flag && has_linear_kind[static_cast<int>(LinearKind::async)]) {
      return CUDA_ERROR_NOT_PERMITTED;
    }
    c.memory_pools = flag;
  }
  return CUDA_SUCCESS;
}

/// See vsr_emulator.h.
VSR_EMU_EXPORT const char* vsr_emu_describe(void) {
  thread_local std::string line;
  State& s = st();
  std::lock_guard lock(s.mutex);
  const Config& c = s.config;
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "vsr-cuda-emulator driver=%d devices=%d memory=%zu granularity=%zu "
                "recommended=%zu overhead=%zu vmm=%d managed=%d pools=%d sync=%d sticky=%d "
                "async_default_streams=%d recycle_handles=%d free_no_sync=%d "
                "require_context=%d sticky_vmm=%d meminfo_quantum=%zu address_space=%zu "
                "abort_on_misuse=%d latency_entries=%zu late_work_ns=%lld",
                c.driver_version, c.device_count, c.device_memory, c.granularity,
                c.recommended_granularity != 0 ? c.recommended_granularity : c.granularity,
                context_overhead(c), c.vmm, c.managed, c.memory_pools, c.sync, c.sticky,
                c.async_default_streams, c.recycle_handles, c.free_no_sync, c.require_context,
                c.sticky_vmm, c.meminfo_quantum, address_space_limit(c), c.abort_on_misuse,
                c.latency.size(), static_cast<long long>(c.late_work.count()));
  line = buf;
  return line.c_str();
}
