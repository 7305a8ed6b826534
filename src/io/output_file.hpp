// SPDX-License-Identifier: Apache-2.0
// All-or-nothing output files (io.hpp, "Outputs"): a temporary file beside the target, renamed
// into place only when complete, removed on every error path and, when the program asked for it
// (remove_partial_outputs_on_signals), by a signal handler.
//
// Glossary
// - target: the path the caller asked for (a symbolic link is followed: the file it names is
//   replaced, the link stays).
// - temporary: "<dir>/.<stem>.vsr-XXXXXX<ext>" in the target's directory, so the rename stays on
//   one file system; created with O_CREAT | O_EXCL (mkstemp semantics) and mode 0666 less the
//   umask, or the existing target's permissions.
// - sidecars: files a GDAL driver writes beside the temporary (e.g. ".aux.xml"): every file of
//   the directory whose name starts with the temporary's stem; committed and removed with it.
#pragma once

#include <string>

namespace vibespatial::raster::detail {

/// One output being written. Not copyable or movable; not thread-safe (one writer).
class PendingOutput {
 public:
  /// Creates the temporary file for @p target.
  /// @throws std::runtime_error (naming the directory and errno) when it cannot be created, or
  /// when @p target exists and @p overwrite is false.
  explicit PendingOutput(const std::string& target, bool overwrite = true);
  /// Removes the temporary file and its sidecars unless commit() succeeded. Never throws.
  ~PendingOutput();
  PendingOutput(const PendingOutput&) = delete;
  PendingOutput& operator=(const PendingOutput&) = delete;

  /// Where the writer writes (the temporary file).
  const std::string& path() const noexcept { return temp_; }

  /// Makes the written file the target: fsync of the file, sidecars renamed (a stale
  /// "<target>.aux.xml" removed when none was written), the file renamed over the target (with
  /// @p overwrite false: linked, so an existing target is never replaced), fsync of the
  /// directory. @throws std::runtime_error when a rename fails or (overwrite false) the target
  /// exists; the temporary files are removed then and the target is as it was.
  void commit(bool overwrite = true);

 private:
  void remove_files() noexcept;

  std::string target_, dir_, stem_, temp_, temp_stem_;
  int slot_ = -1;  ///< the signal registry slot, -1 if none
  bool committed_ = false;
};

}  // namespace vibespatial::raster::detail
