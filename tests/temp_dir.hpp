// SPDX-License-Identifier: Apache-2.0
// A fresh temporary directory for one test case, removed with everything in it at the end.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace vsr_test {

/// A new directory under the system's temporary directory, named after @p prefix, the process
/// and a counter; removed (with its files) when destroyed.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "vsr-test") {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           (prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// The path of @p name inside the directory.
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace vsr_test
