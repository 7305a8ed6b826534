// SPDX-License-Identifier: Apache-2.0
// Undefined behaviour on purpose, built only in sanitizer builds: the 'ubsan-is-fatal' test runs
// it to prove that a UBSan report fails the test run instead of scrolling past.
#include <climits>
#include <cstdio>

int main(int argc, char**) {
  volatile int x = INT_MAX;
  const int y = x + argc;  // signed overflow: argc >= 1
  std::printf("%d\n", y);
  return 0;
}
