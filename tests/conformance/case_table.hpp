// SPDX-License-Identifier: Apache-2.0
// Metadata of every conformance case; the table itself is case_table.cpp.
#pragma once

#include <span>
#include <string_view>

namespace vsr_conf {

// Evidence tags of docs/cuda-driver-rules.md §0.
enum class Evidence { hdr, doc, probe, use, hip_nv, hip, inf };

enum class Kind {
  normal,
  sticky,  // may poison the context: runs alone in a child process (--sticky)
  ub,      // undefined behaviour on the real driver: emulator + --strict only
};

struct CaseInfo {
  std::string_view name;     // the doctest TEST_CASE name
  std::string_view section;  // of docs/cuda-driver-rules.md
  Evidence evidence;
  Kind kind;
  bool seen_on_gpu;  // flipped to true only after the case passed on a real GPU
  // Nobody has seen the real driver's answer yet (semantics §10): asserted only under --strict,
  // whatever the evidence tag says.
  bool strict_only = false;
};

std::span<const CaseInfo> all_cases();
const CaseInfo* find_case(std::string_view name);
std::string_view evidence_name(Evidence e);

// HDR/DOC/PROBE/USE/HIP-NV are asserted by default; HIP and INF only with --strict (§9.2), and
// so is every case marked strict_only.
constexpr bool asserted_by_default(Evidence e) {
  return e != Evidence::hip && e != Evidence::inf;
}
constexpr bool asserted_by_default(const CaseInfo& c) {
  return asserted_by_default(c.evidence) && !c.strict_only;
}

}  // namespace vsr_conf
