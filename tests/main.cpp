// SPDX-License-Identifier: Apache-2.0
// The doctest main of every CPU test executable.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

// A check run after the tests, defined by executables that link misuse_check.cpp: its nonzero
// result fails a run whose tests passed.
int vsr_test_after_run() __attribute__((weak));

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  int result = context.run();
  if (context.shouldExit()) return result;
  if (vsr_test_after_run != nullptr) {
    const int after = vsr_test_after_run();
    if (result == 0) result = after;
  }
  return result;
}
