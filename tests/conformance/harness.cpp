// SPDX-License-Identifier: Apache-2.0
#include "harness.hpp"

#include <cstdlib>
#include <set>

namespace vsr_conf {

Env& env() {
  static Env e;
  return e;
}

std::string error_name(CUresult r) {
  const char* s = nullptr;
  if (cu().cuGetErrorName(r, &s) != CUDA_SUCCESS || s == nullptr) {
    return "CUresult(" + std::to_string(static_cast<int>(r)) + ")";
  }
  return s;
}

std::size_t free_bytes() {
  std::size_t free = 0;
  std::size_t total = 0;
  REQUIRE_EQ(error_name(cu().cuMemGetInfo(&free, &total)), std::string("CUDA_SUCCESS"));
  return free;
}

CUmemAccessDesc access_desc(CUmemAccess_flags flags) {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = env().dev;
  d.flags = flags;
  return d;
}

void check_free_delta(std::size_t before, std::size_t after, long long expected, const char* step) {
  const long long delta = static_cast<long long>(after) - static_cast<long long>(before);
  const long long slack = 2 * static_cast<long long>(env().gran);
  INFO("step: " << step << ", free delta " << delta << " expected " << expected << " +- " << slack);
  CHECK(std::llabs(delta - expected) <= slack);
}

namespace {

std::mutex g_cases_mutex;
std::string g_current;
std::set<std::string> g_not_applicable;

}  // namespace

void set_current_case(const std::string& name) {
  std::lock_guard lock(g_cases_mutex);
  g_current = name;
}

void mark_not_applicable() {
  std::lock_guard lock(g_cases_mutex);
  g_not_applicable.insert(g_current);
}

bool was_not_applicable(const std::string& name) {
  std::lock_guard lock(g_cases_mutex);
  return g_not_applicable.count(name) != 0;
}

}  // namespace vsr_conf
