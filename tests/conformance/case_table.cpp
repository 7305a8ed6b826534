// SPDX-License-Identifier: Apache-2.0
// The one table of conformance cases. A GPU run that sees a case pass on the real driver sets its
// seen_on_gpu to true (docs/gpu-verification.md: the emulator is trusted only that far). A sixth
// field `true` marks a case whose real answer nobody has seen: asserted only under --strict.
#include "case_table.hpp"

#include <array>

namespace vsr_conf {
namespace {

using E = Evidence;
using K = Kind;

constexpr std::array kCases = {
    // §1.1 initialization gate (checked in main before cuInit)
    CaseInfo{"preinit.calls_return_not_initialized", "§1.1", E::hdr, K::normal, false},
    CaseInfo{"preinit.context_calls_fail_without_writing", "§1.1", E::probe, K::normal, false},
    CaseInfo{"preinit.lookups_work", "§1.1", E::use, K::normal, false},
    CaseInfo{"preinit.driver_get_version", "§1.1", E::inf, K::normal, false},
    // §3.1 init, version, devices
    CaseInfo{"init.flags_must_be_zero", "§3.1", E::hdr, K::normal, false},
    CaseInfo{"init.repeat_succeeds", "§3.1", E::use, K::normal, false},
    CaseInfo{"version.driver_version", "§3.1", E::hdr, K::normal, false},
    CaseInfo{"device.count_and_get", "§3.1", E::hdr, K::normal, false},
    CaseInfo{"device.bad_ordinal", "§1.3", E::probe, K::normal, false},
    CaseInfo{"device.attribute_without_context", "§1.2", E::probe, K::normal, false},
    CaseInfo{"device.attribute_null_out", "§3.1", E::hdr, K::normal, false},
    CaseInfo{"device.attribute_max_rejected", "§3.1", E::inf, K::normal, false},
    // §2.2 cuGetProcAddress
    CaseInfo{"gpa.matches_dlsym_exports", "§2.2", E::hdr, K::normal, false},
    CaseInfo{"gpa.largest_version_not_above_request", "§2.2", E::hdr, K::normal, false},
    CaseInfo{"gpa.ctx_synchronize_split", "§2.2", E::hdr, K::normal, false},
    CaseInfo{"gpa.per_thread_default_stream", "§2.2", E::hdr, K::normal, false},
    CaseInfo{"gpa.version_not_sufficient", "§2.2", E::hdr, K::normal, false, true},
    CaseInfo{"gpa.unknown_symbol", "§2.2", E::hdr, K::normal, false, true},
    CaseInfo{"gpa.version_above_driver", "§2.2", E::hdr, K::normal, false, true},
    CaseInfo{"gpa.null_status_allowed", "§2.2", E::hdr, K::normal, false},
    CaseInfo{"gpa.legacy_four_argument_entry", "§2.1", E::hdr, K::normal, false},
    CaseInfo{"gpa.versioned_name_not_found", "§2.2", E::inf, K::normal, false},
    CaseInfo{"gpa.bad_arguments_rejected", "§2.2", E::inf, K::normal, false},
    CaseInfo{"gpa.legacy_unknown_not_found", "§2.2", E::inf, K::normal, false},
    // §3.8 error names
    CaseInfo{"error.names", "§1.5", E::hdr, K::normal, false},
    CaseInfo{"error.unknown_code", "§3.8", E::hdr, K::normal, false},
    CaseInfo{"error.strings_present", "§3.8", E::hdr, K::normal, false},
    // §3.2 contexts, §1.2 context requirement, §3.3 cuMemGetInfo
    CaseInfo{"ctx.release_without_retain", "§3.2", E::hdr, K::normal, false},
    CaseInfo{"ctx.primary_retain_same_and_not_current", "§3.2", E::hdr, K::normal, false},
    CaseInfo{"ctx.set_and_get_current", "§3.2", E::hdr, K::normal, false},
    CaseInfo{"ctx.fresh_thread_needs_context", "§1.2", E::probe, K::normal, false},
    CaseInfo{"ctx.get_current_null_out", "§3.2", E::inf, K::normal, false},
    CaseInfo{"meminfo.query", "§3.3", E::hdr, K::normal, false},
    // §3.4.1 granularity
    CaseInfo{"gran.minimum_and_recommended", "§3.4.1", E::doc, K::normal, false},
    CaseInfo{"gran.null_out", "§3.4.1", E::hip_nv, K::normal, false},
    CaseInfo{"gran.bad_option", "§3.4.1", E::hip_nv, K::normal, false},
    CaseInfo{"gran.location_not_validated", "§3.4.1", E::hip_nv, K::normal, false},
    CaseInfo{"gran.null_prop", "§1.3", E::inf, K::ub, false},
    // §3.4.2–3.4.3 reservations
    CaseInfo{"reserve.and_free", "§3.4.2", E::use, K::normal, false},
    CaseInfo{"reserve.bad_arguments", "§3.4.2", E::hip, K::normal, false},
    CaseInfo{"reserve.flags_must_be_zero", "§3.4.2", E::inf, K::normal, false},
    CaseInfo{"reserve.hint_honoured_when_free", "§3.4.2", E::inf, K::normal, false},
    CaseInfo{"reserve.hint_occupied_moves", "§3.4.2", E::inf, K::normal, false},
    CaseInfo{"reserve.pool_region_sizes", "§3.4.2", E::use, K::normal, false},
    CaseInfo{"addressfree.not_a_reservation", "§3.4.3", E::probe, K::normal, false},
    CaseInfo{"addressfree.zero_arguments", "§3.4.3", E::hip, K::normal, false},
    CaseInfo{"addressfree.with_live_mapping", "§3.4.3", E::inf, K::ub, false},
    // §3.4.4–3.4.5 physical handles
    CaseInfo{"create.size_not_granularity_multiple", "§3.4.4", E::probe, K::normal, false},
    CaseInfo{"create.size_zero", "§3.4.4", E::hip, K::normal, false},
    CaseInfo{"create.flags_must_be_zero", "§3.4.4", E::hdr, K::normal, false},
    CaseInfo{"create.bad_properties", "§3.4.4", E::hip, K::normal, false},
    CaseInfo{"props.roundtrip", "§3.4.9", E::use, K::normal, false},
    CaseInfo{"release.zero_handle", "§3.4.5", E::hip, K::normal, false},
    CaseInfo{"release.double", "§3.4.5", E::inf, K::ub, false},
    // §4 state machine
    CaseInfo{"vmm.transition_table", "§4", E::probe, K::normal, false},
    CaseInfo{"vmm.context_free", "§1.2", E::inf, K::normal, false},
    // §3.4.6 map
    CaseInfo{"map.no_access_until_set_access", "§3.4.6", E::doc, K::normal, false},
    CaseInfo{"map.flags_must_be_zero", "§3.4.6", E::hdr, K::normal, false},
    CaseInfo{"map.alias_same_handle", "§3.4.6", E::doc, K::normal, false},
    CaseInfo{"map.strict_shape_rules", "§3.4.6", E::inf, K::normal, false},
    CaseInfo{"map.released_handle_rejected", "§4", E::inf, K::ub, false},
    // §3.4.7 unmap
    CaseInfo{"unmap.one_call_over_adjacent_mappings", "§3.4.7", E::use, K::normal, false},
    CaseInfo{"unmap.subrange_rejected", "§3.4.7", E::hdr, K::normal, false},
    CaseInfo{"unmap.range_with_gap_fails", "§3.4.7", E::probe, K::normal, false},
    CaseInfo{"unmap.zero_arguments", "§3.4.7", E::hip, K::normal, false},
    CaseInfo{"unmap.tail_of_adjacent_mappings", "§3.4.7", E::use, K::normal, false},
    CaseInfo{"access.reset_after_unmap_and_remap", "§3.4.7", E::hdr, K::normal, false},
    // §3.4.8 access
    CaseInfo{"access.one_call_spans_adjacent_mappings", "§3.4.8", E::use, K::normal, false},
    CaseInfo{"access.later_mapping_not_at_base", "§3.4.8", E::use, K::normal, false},
    CaseInfo{"access.read_only", "§3.4.8", E::use, K::normal, false},
    CaseInfo{"access.cumemalloc_memory_rejected", "§3.4.8", E::probe, K::normal, false},
    CaseInfo{"access.unmapped_range_rejected", "§3.4.8", E::hdr, K::normal, false},
    CaseInfo{"access.bad_location_id", "§3.4.8", E::hdr, K::normal, false},
    CaseInfo{"access.null_desc_or_zero_count", "§3.4.8", E::inf, K::normal, false},
    CaseInfo{"getaccess.bad_arguments", "§3.4.8", E::hip, K::normal, false},
    // §3.4.9 retain
    CaseInfo{"retain.same_handle_from_interior", "§3.4.9", E::hdr, K::normal, false},
    CaseInfo{"retain.bad_arguments", "§3.4.9", E::hip_nv, K::normal, false},
    // §3.5 allocation
    CaseInfo{"alloc.roundtrip", "§3.5", E::hdr, K::normal, false},
    CaseInfo{"alloc.zero_bytes", "§3.5", E::hdr, K::normal, false},
    CaseInfo{"free.null_pointer", "§3.5", E::probe, K::normal, false},
    CaseInfo{"free.bad_pointers", "§3.5", E::inf, K::normal, false},
    CaseInfo{"range.linear_allocation", "§3.5", E::hdr, K::normal, false},
    CaseInfo{"range.vmm_reservation", "§3.4.10", E::probe, K::normal, false},
    CaseInfo{"range.unknown_address", "§3.4.10", E::probe, K::normal, false},
    CaseInfo{"managed.alloc", "§3.5", E::hdr, K::normal, false},
    CaseInfo{"async.alloc_free", "§3.5", E::hdr, K::normal, false},
    CaseInfo{"host.pinned_alloc", "§3.6", E::hdr, K::normal, false},
    // §3.6 copies
    CaseInfo{"memcpy.null_host_pointer", "§3.6", E::probe, K::normal, false},
    CaseInfo{"memcpy.async_roundtrip", "§3.6", E::hdr, K::normal, false},
    CaseInfo{"memcpy.past_end_of_allocation", "§3.6", E::inf, K::sticky, false},
    // §3.7 streams and events
    CaseInfo{"stream.create_flags", "§3.7", E::hdr, K::normal, false},
    CaseInfo{"stream.null_out", "§3.7", E::inf, K::normal, false},
    CaseInfo{"stream.special_handles", "§3.7", E::hdr, K::normal, false},
    CaseInfo{"stream.query_not_ready_is_not_a_failure", "§3.7", E::hdr, K::normal, false},
    CaseInfo{"event.never_recorded", "§3.7", E::hdr, K::normal, false},
    CaseInfo{"event.record_and_synchronize", "§3.7", E::hdr, K::normal, false},
    CaseInfo{"event.create_flags", "§3.7", E::hdr, K::normal, false},
    CaseInfo{"stream.host_func_holds_stream", "§3.7", E::hdr, K::normal, false},
    CaseInfo{"stream.legacy_stream_ordering", "§3.7", E::hdr, K::normal, false},
    // §3.6 sticky faults (each in its own process)
    CaseInfo{"sticky.memset_into_reserved_unmapped", "§3.6", E::probe, K::sticky, false, true},
    CaseInfo{"sticky.memcpy_into_reserved_unmapped", "§3.6", E::inf, K::sticky, false},
    CaseInfo{"sticky.memcpy_into_mapped_without_access", "§3.6", E::inf, K::sticky, false},
    CaseInfo{"sticky.memset_into_mapped_without_access", "§3.6", E::inf, K::sticky, false},
    // Must fail on every driver; the code (700) only under --strict.
    CaseInfo{"sticky.access_without_set_access_fails", "§3.4.6", E::doc, K::sticky, false},
};

}  // namespace

std::span<const CaseInfo> all_cases() {
  return kCases;
}

const CaseInfo* find_case(std::string_view name) {
  for (const CaseInfo& c : kCases) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string_view evidence_name(Evidence e) {
  switch (e) {
    case Evidence::hdr:
      return "HDR";
    case Evidence::doc:
      return "DOC";
    case Evidence::probe:
      return "PROBE";
    case Evidence::use:
      return "USE";
    case Evidence::hip_nv:
      return "HIP-NV";
    case Evidence::hip:
      return "HIP";
    case Evidence::inf:
      return "INF";
  }
  return "?";
}

}  // namespace vsr_conf
