// SPDX-License-Identifier: Apache-2.0
// vsr-bench's results and their report: statistics over rounds, the text table, JSON, the summary,
// and the runner that turns a failing section into a reported error.
#include "bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace vsr_bench {

bool g_progress = true;
int g_errors = 0;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt("%.6g", v);
}

void Table::print(const std::string& title) const {
  std::vector<std::size_t> w(rows_[0].size(), 0);
  for (const auto& r : rows_) {
    for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  }
  std::printf("\n%s\n", title.c_str());
  for (std::size_t k = 0; k < rows_.size(); ++k) {
    std::string line;
    for (std::size_t i = 0; i < w.size(); ++i) {
      const std::string cell = i < rows_[k].size() ? rows_[k][i] : "";
      if (i > 0) line += " | ";
      line += cell + std::string(w[i] - cell.size(), ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
    if (k == 0) {
      std::string rule;
      for (std::size_t i = 0; i < w.size(); ++i)
        rule += (i > 0 ? "-+-" : "") + std::string(w[i], '-');
      std::printf("%s\n", rule.c_str());
    }
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double paired_ratio(const std::vector<double>& num, const std::vector<double>& den) {
  std::vector<double> r;
  for (std::size_t i = 0; i < num.size() && i < den.size(); ++i) r.push_back(num[i] / den[i]);
  return median(r);
}

std::string met_str(double v, const std::string& goal) {
  if (goal.empty() || !std::isfinite(v)) return "n/a";
  const double bound = std::atof(goal.c_str() + 3);
  const bool ok = goal.rfind("<=", 0) == 0 ? v <= bound : v >= bound;
  return ok ? "yes" : "no";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

void case_error(Report& rep, const std::string& name, const std::exception& e) {
  std::fprintf(stderr, "vsr-bench: %s failed: %s\n", name.c_str(), e.what());
  rep.summary.push_back({name + ": ERROR", NAN, "", "error", e.what()});
  rep.section_json("{\"section\": " + json_string(name) + ", \"error\": " + json_string(e.what()) +
                   "}");
  ++g_errors;
}

// Runs one section unless --sections leaves it out; a failing section is reported and the others
// still run.
bool run_case(Report& rep, Table& tab, const std::string& first_cell, const std::string& name,
              const std::function<void()>& body) {
  try {
    body();
    return true;
  } catch (const std::exception& e) {
    tab.add({first_cell, "ERROR (see summary)"});
    case_error(rep, name, e);
    return false;
  }
}

void run_section(Report& rep, const std::string& selected, const char* name,
                 const std::function<void()>& section) {
  // Appends, not "," + ...: GCC 12 at -O3 warns (-Wrestrict, a false positive) on the latter.
  const std::string list = std::string(",").append(selected).append(",");
  const std::string item = std::string(",").append(name).append(",");
  if (!selected.empty() && list.find(item) == std::string::npos) return;
  try {
    section();
  } catch (const std::exception& e) {
    case_error(rep, name, e);
  }
}

void skipped_row(Report& rep, const std::string& metric, const std::string& goal,
                 const std::string& why) {
  rep.summary.push_back({metric, NAN, goal, why, ""});
}

// Notes, sections and summary of a --json report, and its closing brace.
void print_json_tail(const Report& rep) {
  std::string notes;
  for (const auto& n : rep.notes) notes += (notes.empty() ? "" : ", ") + json_string(n);
  std::printf("  \"notes\": [%s],\n", notes.c_str());
  std::printf("  \"sections\": [\n    %s\n  ],\n", rep.sections_json.c_str());
  std::printf("  \"summary\": [\n");
  for (std::size_t i = 0; i < rep.summary.size(); ++i) {
    const auto& r = rep.summary[i];
    std::printf("    {\"metric\": %s, \"value\": %s, \"goal\": %s, \"met\": %s, \"note\": %s}%s\n",
                json_string(r.metric).c_str(), json_num(r.value).c_str(),
                json_string(r.goal).c_str(), json_string(r.met).c_str(),
                json_string(r.note).c_str(), i + 1 < rep.summary.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
}

void print_summary(const Report& rep, const std::string& title) {
  Table sum({"metric", "value", "goal", "met?"});
  for (const auto& r : rep.summary) {
    sum.add({r.metric + (r.note.empty() ? "" : " (" + r.note + ")"),
             std::isfinite(r.value) ? fmt("%.3f", r.value) : "-", r.goal.empty() ? "-" : r.goal,
             r.met});
  }
  sum.print(title);
}

}  // namespace vsr_bench
