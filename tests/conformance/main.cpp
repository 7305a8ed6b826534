// SPDX-License-Identifier: Apache-2.0
// vsr-conformance: asserts the CUDA driver rules of docs/cuda-driver-rules.md against the
// library named by VIBESPATIAL_CUDA_DRIVER (empty or unset: the real libcuda.so.1).
//
//   vsr-conformance [--strict] [doctest options]   cases in this process
//   vsr-conformance --sticky [--strict]            each sticky case in its own child process
//   vsr-conformance --probe [--sticky]             print the driver's answers to §10; no asserts
//
// Exit 77 (meson SKIP) when no driver library, no device, or only the toolkit stub is present.
#define DOCTEST_CONFIG_IMPLEMENT
#include "case_table.hpp"
#include "harness.hpp"
#include "probe.hpp"

#include <cuda.h>

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace vsr_conf {
namespace {

constexpr int kSkip = 77;

struct Options {
  bool strict = false;
  bool sticky = false;
  bool probe = false;
  bool user_filter = false;  // doctest options were given: do not flag unselected cases
  std::vector<char*> doctest_args;
};

Options parse(int argc, char** argv) {
  Options o;
  o.doctest_args.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--strict") == 0) {
      o.strict = true;
    } else if (std::strcmp(argv[i], "--sticky") == 0) {
      o.sticky = true;
    } else if (std::strcmp(argv[i], "--probe") == 0) {
      o.probe = true;
    } else {
      o.user_filter = true;
      o.doctest_args.push_back(argv[i]);
    }
  }
  return o;
}

// Loads the driver, records the §1.1 pre-init answers, then initializes and makes the primary
// context of device 0 current on this thread. Returns 0, kSkip or 1.
int start_driver() {
  Env& e = env();
  std::string why;
  if (!load_driver(e.cu, &why)) {
    std::fprintf(stderr, "vsr-conformance: SKIP: %s\n", why.c_str());
    return kSkip;
  }
  const std::string base = e.cu.path.substr(e.cu.path.find_last_of('/') + 1);
  e.real_driver = base.rfind("libcuda.so", 0) == 0;
  if (!e.cu.resolutions.empty() && e.cu.resolutions.front().result == CUDA_ERROR_STUB_LIBRARY) {
    std::fprintf(stderr, "vsr-conformance: SKIP: %s is the toolkit stub library\n",
                 e.cu.path.c_str());
    return kSkip;
  }

  // Nothing may call cuInit before these (semantics §1.1).
  PreInit& p = e.pre;
  int count = -5;
  p.device_get_count = e.cu.cuDeviceGetCount(&count);
  CUdevice d = -5;
  p.device_get = e.cu.cuDeviceGet(&d, 0);
  CUcontext sentinel = reinterpret_cast<CUcontext>(0x5a5a);
  CUcontext c = sentinel;
  p.ctx_get_current = e.cu.cuCtxGetCurrent(&c);
  p.ctx_get_current_wrote = c != sentinel;
  p.ctx_set_current_null = e.cu.cuCtxSetCurrent(nullptr);
  p.ctx_get_device = e.cu.cuCtxGetDevice(&d);
  const char* s = nullptr;
  p.error_name = e.cu.cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &s);
  p.error_name_text = s != nullptr ? s : "";
  s = nullptr;
  p.error_string = e.cu.cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s);
  p.error_string_present = s != nullptr && s[0] != '\0';
  p.driver_get_version = e.cu.cuDriverGetVersion(&p.driver_version);

  const CUresult init = e.cu.cuInit(0);
  if (init == CUDA_ERROR_NO_DEVICE || init == CUDA_ERROR_STUB_LIBRARY) {
    std::fprintf(stderr, "vsr-conformance: SKIP: cuInit(0) returned %s (%s)\n",
                 error_name(init).c_str(), e.cu.path.c_str());
    return kSkip;
  }
  if (init != CUDA_SUCCESS) {
    std::fprintf(stderr, "vsr-conformance: cuInit(0) failed: %s\n", error_name(init).c_str());
    return 1;
  }
  if (e.cu.cuDriverGetVersion(&e.driver_version) != CUDA_SUCCESS ||
      e.cu.cuDeviceGetCount(&e.device_count) != CUDA_SUCCESS) {
    std::fprintf(stderr, "vsr-conformance: cuDriverGetVersion/cuDeviceGetCount failed\n");
    return 1;
  }
  if (e.device_count == 0) {
    std::fprintf(stderr, "vsr-conformance: SKIP: no CUDA device\n");
    return kSkip;
  }
  if (e.cu.cuDeviceGet(&e.dev, 0) != CUDA_SUCCESS) {
    std::fprintf(stderr, "vsr-conformance: cuDeviceGet(0) failed\n");
    return 1;
  }
  int vmm = 0;
  e.cu.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, e.dev);
  if (vmm != 1) {
    std::fprintf(stderr, "vsr-conformance: SKIP: device 0 reports no VMM support\n");
    return kSkip;
  }
  // Recorded before the retain below: release of a never-retained primary context (§3.2).
  e.release_before_retain = e.cu.cuDevicePrimaryCtxRelease(e.dev);
  CUresult r = e.cu.cuDevicePrimaryCtxRetain(&e.ctx, e.dev);
  if (r == CUDA_SUCCESS) r = e.cu.cuCtxSetCurrent(e.ctx);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "vsr-conformance: primary context: %s\n", error_name(r).c_str());
    return 1;
  }
  e.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  e.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  e.prop.location.id = e.dev;
  r = e.cu.cuMemGetAllocationGranularity(&e.gran, &e.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS || e.gran == 0) {
    std::fprintf(stderr, "vsr-conformance: granularity: %s\n", error_name(r).c_str());
    return 1;
  }
  std::printf("vsr-conformance: driver %s (version %d, %s), %d device(s), granularity %zu\n",
              e.cu.path.c_str(), e.driver_version, e.real_driver ? "real" : "emulator",
              e.device_count, e.gran);
  return 0;
}

bool selected(const CaseInfo& c, const Options& o, bool real_driver) {
  if ((c.kind == Kind::sticky) != o.sticky) return false;
  if (!o.strict && !asserted_by_default(c)) return false;
  // Undefined behaviour on the real driver (semantics §9.3): never, even with --strict.
  if (c.kind == Kind::ub && real_driver) return false;
  return true;
}

std::map<std::string, std::string>& results() {
  static std::map<std::string, std::string> r;
  return r;
}

std::vector<std::string>& unlisted() {
  static std::vector<std::string> u;
  return u;
}

struct TableListener : doctest::IReporter {
  explicit TableListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& tc) override {
    current_ = tc.m_name;
    set_current_case(current_);
    if (find_case(current_) == nullptr) unlisted().push_back(current_);
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& st) override {
    const bool pass = st.testCaseSuccess && st.numAssertsFailedCurrentTest == 0;
    // A case that returned early as not applicable is a SKIP, never a PASS.
    results()[current_] = !pass ? "FAIL" : was_not_applicable(current_) ? "SKIP" : "PASS";
  }
  void test_case_exception(const doctest::TestCaseException&) override {
    results()[current_] = "FAIL";
  }
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData& tc) override {
    if (find_case(tc.m_name) == nullptr) unlisted().push_back(tc.m_name);
  }

 private:
  std::string current_;
};

// The closing table; returns false when a selected case did not run or a test is unlisted.
bool print_table(const Options& o, bool real_driver) {
  bool complete = true;
  std::printf("\n%-46s %-8s %-11s %-11s %s\n", "case", "section", "evidence", "seen_on_gpu",
              "result");
  int pass = 0;
  int fail = 0;
  int skip = 0;
  int not_selected = 0;
  for (const CaseInfo& c : all_cases()) {
    if (!selected(c, o, real_driver)) {
      ++not_selected;
      continue;
    }
    auto it = results().find(std::string(c.name));
    std::string result = it != results().end() ? it->second : "NOT RUN";
    if (result == "PASS") ++pass;
    if (result == "FAIL") ++fail;
    if (result == "SKIP") ++skip;
    if (result == "NOT RUN" && !o.user_filter) complete = false;
    const std::string evidence =
        std::string(evidence_name(c.evidence)) + (c.strict_only ? " (s)" : "");
    std::printf("%-46.*s %-8.*s %-11s %-11s %s\n", static_cast<int>(c.name.size()), c.name.data(),
                static_cast<int>(c.section.size()), c.section.data(), evidence.c_str(),
                c.seen_on_gpu ? "yes" : "no", result.c_str());
  }
  for (const std::string& u : unlisted()) {
    std::printf("%-46s %-8s %-11s %-11s %s\n", u.c_str(), "?", "?", "?", "NOT IN case_table.cpp");
    complete = false;
  }
  std::printf(
      "%d passed, %d failed, %d skipped (not applicable), %d not selected in this mode "
      "(%s%s); (s) = strict-only\n",
      pass, fail, skip, not_selected, o.sticky ? "sticky" : "default", o.strict ? ", strict" : "");
  return complete;
}

int run_cases(const Options& o, const std::string& only, bool table) {
  const int started = start_driver();
  if (started != 0) return started;
  env().strict = o.strict;
  doctest::Context ctx(static_cast<int>(o.doctest_args.size()), o.doctest_args.data());
  if (!only.empty()) {
    ctx.addFilter("test-case", only.c_str());
  } else {
    std::string excluded;
    for (const CaseInfo& c : all_cases()) {
      if (selected(c, o, env().real_driver)) continue;
      if (!excluded.empty()) excluded += ',';
      excluded += c.name;
    }
    if (!excluded.empty()) ctx.addFilter("test-case-exclude", excluded.c_str());
  }
  int rc = ctx.run();
  if (ctx.shouldExit()) return rc;
  if (table && !print_table(o, env().real_driver)) rc = rc == 0 ? 1 : rc;
  // A sticky child whose one case was not applicable reports SKIP to the parent.
  if (!only.empty() && rc == 0 && was_not_applicable(only)) return kSkip;
  return rc;
}

// Sticky errors poison the context until exit, so each case gets a process of its own, forked
// before this process touches the driver (fork after cuInit is unsupported, semantics §9.4).
int run_sticky(const Options& o) {
  bool any_ran = false;
  bool all_skipped = true;
  for (const CaseInfo& c : all_cases()) {
    if (c.kind != Kind::sticky) continue;
    if (!o.strict && !asserted_by_default(c)) continue;
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("vsr-conformance: fork");
      return 1;
    }
    if (pid == 0) std::_Exit(run_cases(o, std::string(c.name), false));
    int status = 0;
    waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    results()[std::string(c.name)] = code == 0 ? "PASS" : code == kSkip ? "SKIP" : "FAIL";
    any_ran = true;
    if (code != kSkip) all_skipped = false;
  }
  if (any_ran && all_skipped) return kSkip;
  // The children decided; the real/emulator distinction only matters for ub cases.
  const bool complete = print_table(o, false);
  for (const auto& [name, result] : results()) {
    if (result == "FAIL") return 1;
  }
  return complete ? 0 : 1;
}

}  // namespace
}  // namespace vsr_conf

int main(int argc, char** argv) {
  using namespace vsr_conf;
  const Options o = parse(argc, argv);
  if (o.probe) {
    if (o.sticky) return run_probe_sticky(&start_driver);
    const int started = start_driver();
    return started != 0 ? started : run_probe();
  }
  if (o.sticky) return run_sticky(o);
  return run_cases(o, "", true);
}

DOCTEST_REGISTER_LISTENER("vsr_conformance_table", 1, vsr_conf::TableListener);
