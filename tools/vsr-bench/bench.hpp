// SPDX-License-Identifier: Apache-2.0
// vsr-bench's private header: what both benchmarks share (their options, the results and the
// report as a table or JSON, the sections runner) and their entry points. Nothing here is part of
// the library.
#pragma once

#include "cli.hpp"
#include "format.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace vsr_bench {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;

// ---- options ------------------------------------------------------------------------------------

struct AllocOptions {
  bool json = false;
  bool quick = false;
  std::uint64_t seed = 20240611;
  std::string sections;  // comma-separated subset of malloc,driver,threads,frag,scale; empty: all
  std::size_t large_live = 0;  // --large-live: the large trace's live blocks; 0: the default (256)
};

struct DispatchOptions {
  bool json = false;
  bool quick = false;
  std::string sections;  // comma-separated subset of cpu,gpu,pipeline,focal; empty: all
};

/// The benchmarks (alloc.cpp, dispatch.cpp). Exit status: 0 when every section ran, 1 when one
/// failed, 77 (alloc only) when there is no usable driver or device.
int run_alloc(const AllocOptions& o);
int run_dispatch(const DispatchOptions& o);

/// The hidden command `vsr-bench alloc-scale-worker` that alloc's scale section starts, one per
/// emulated device size (alloc_scale.cpp): the large trace of these sizes, replayed on request.
struct ScaleWorkerOptions {
  std::size_t live = 0, trace_steps = 0;  // the trace: live blocks, steps drawn
  std::size_t steps = 0;                  // steps replayed per round
  std::uint64_t seed = 0;                 // the trace's seed
};
int run_scale_worker(const ScaleWorkerOptions& o);

// ---- output helpers -----------------------------------------------------------------------------

extern bool g_progress;  // progress lines on stderr

template <class... Args>
void progress(const char* fmt, Args... args) {
  if (!g_progress) return;
  std::fprintf(stderr, "[vsr-bench] ");
  std::fprintf(stderr, fmt, args...);
  std::fputc('\n', stderr);
}

/// @p v formatted by the printf format @p f.
std::string fmt(const char* f, double v);

using vsr_cli::format_bytes;
using vsr_cli::json_string;

/// A JSON number, null when @p v is not finite.
std::string json_num(double v);

/// A text table: the header row, a rule, the rows; columns as wide as their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(const std::string& title) const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// ---- results ------------------------------------------------------------------------------------

double median(std::vector<double> v);

/// The median of the per-round ratios num[r] / den[r].
double paired_ratio(const std::vector<double>& num, const std::vector<double>& den);

struct SummaryRow {
  std::string metric;
  double value = NAN;
  std::string goal;  // "<= 2.0", ">= 1.7", or "" (information only)
  std::string met;   // "yes", "no", "n/a"
  std::string note;
};

/// "yes" or "no" as @p v meets @p goal ("<= 2.0", ">= 1.7"); "n/a" without a goal or a value.
std::string met_str(double v, const std::string& goal);

struct Machine {
  unsigned cpus = 0;
  std::string cpu_model;
  std::string library;
  bool emulated = false;
  int driver_version = 0;
  std::string device;
  int cc_major = 0, cc_minor = 0;
  std::size_t free_bytes = 0, total_bytes = 0;
  std::string tier;
  std::size_t granularity = 0, small_limit = 0;
};

/// The CPU's model name from /proc/cpuinfo, or "unknown".
std::string cpu_model();

struct Report {
  Machine machine;
  std::vector<std::string> notes;
  std::string sections_json;  // comma-separated JSON objects
  std::vector<SummaryRow> summary;

  void section_json(const std::string& obj) {
    if (!sections_json.empty()) sections_json += ",\n    ";
    sections_json += obj;
  }
};

extern int g_errors;  // cases that failed so far: the exit status is 1 when any did

/// Reports a failed case: on stderr, as a summary row and as a JSON section; counts it.
void case_error(Report& rep, const std::string& name, const std::exception& e);

/// Runs one case of a section: when @p body throws, the table gets the row `first_cell | ERROR
/// (see summary)` and the report a case error named @p name. Returns whether the case ran.
bool run_case(Report& rep, Table& tab, const std::string& first_cell, const std::string& name,
              const std::function<void()>& body);

// Runs one section unless --sections leaves it out; a failing section is reported and the others
// still run.
void run_section(Report& rep, const std::string& selected, const char* name,
                 const std::function<void()>& section);

/// A summary row for a metric not measured here: @p why in its "met" column.
void skipped_row(Report& rep, const std::string& metric, const std::string& goal,
                 const std::string& why);

// Notes, sections and summary of a --json report, and its closing brace.
void print_json_tail(const Report& rep);

void print_summary(const Report& rep, const std::string& title);

}  // namespace vsr_bench
