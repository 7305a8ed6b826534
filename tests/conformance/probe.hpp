// SPDX-License-Identifier: Apache-2.0
// --probe: prints the driver's answers to the open questions of semantics §10 without asserting.
#pragma once

namespace vsr_conf {

// Safe probes (§10 a–g, i–k; (m) spans across reservations, (n) stream and event calls with no
// context) in this process; the driver is already started.
int run_probe();

// §10 h, and (o) VMM calls after a sticky error: one child process per sticky probe;
// start_driver runs in each child.
int run_probe_sticky(int (*start_driver)());

}  // namespace vsr_conf
