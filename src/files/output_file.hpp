// SPDX-License-Identifier: Apache-2.0
// All-or-nothing output files (outputs.hpp): the one writer of every file the library writes
// (rasters through io, the memory snapshot, text outputs). It writes into a private temporary
// directory beside the target, whose files are renamed into place only when complete and
// verified; they are removed on every error path, by a signal handler when the program asked for
// it (remove_partial_outputs_on_signals), and after a crash by the next write to the same target.
//
// Glossary
// - target: the path the caller asked for (a symbolic link is followed, also one whose file does
//   not exist yet: the file it names is replaced or made, the link stays). It must be a regular
//   file or not exist. A caller that keeps files (KeptFile: a run's inputs, its other outputs)
//   has them refused as targets, by any spelling, before the PendingOutput is made
//   (refuse_kept, same_file).
// - temporary directory: "<dir>/.<name>.vsr-XXXXXX" in the target's directory (so the renames
//   stay on one file system), made by mkdtemp(3): unique, mode 0700. It holds
//   - "data/": where the writer writes. The output file is "data/<name>", under the target's
//     own file name, so drivers that name their sidecars after the file (ENVI's .hdr, PDS4's
//     label) write the names they will keep. Nothing is there until the writer creates it, so a
//     driver that refuses to create over an existing file (GPKG) can.
//   - "owner": the owner record ("pid N", "start T", "boot B", "host H"), locked with flock(2)
//     for as long as the writing process holds the PendingOutput. It appears already locked
//     (written under another name, then renamed).
// - sidecars: the other files the writer put in "data/" (".aux.xml", ".hdr", ...); renamed into
//   the target's directory with the output file.
// - stale temporary: one whose writer is gone (SIGKILL, a power cut). A new PendingOutput for
//   the same target removes it when its owner lock can be taken (the process holding it has
//   ended) and its record says it is no live process of this machine: same boot and its pid is
//   no longer the process that started at the recorded time, or another boot of this host.
//   A temporary with no owner record (a file system without flock, or one written by an older
//   version: "<dir>/.<stem>.vsr-XXXXXX<ext>" files) is never removed automatically.
#pragma once

#include <vibespatial/raster/outputs.hpp>

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

namespace vibespatial::raster::detail {

/// One output being written. Not copyable or movable; not thread-safe (one writer). Distinct
/// PendingOutputs (also for the same target, in any threads or processes) are independent.
class PendingOutput {
 public:
  /// Removes the stale temporaries of @p target, then creates the temporary directory. Messages
  /// start with @p who (the public call) when it is given.
  /// @throws std::invalid_argument when @p target holds a NUL byte, names no file or is not a
  /// regular file (a directory, FIFO, socket or device); std::system_error with the errno when
  /// the temporary directory cannot be created (naming the directory), or, with
  /// std::errc::file_exists, when @p target exists and @p overwrite is false.
  explicit PendingOutput(const std::string& target, bool overwrite = true,
                         const char* who = nullptr);
  /// Removes the temporary directory and everything in it unless commit() succeeded. Never
  /// throws.
  ~PendingOutput();
  PendingOutput(const PendingOutput&) = delete;
  PendingOutput& operator=(const PendingOutput&) = delete;

  /// Where the writer writes its output file ("<temporary directory>/data/<name>"). Nothing
  /// exists there yet.
  const std::string& path() const noexcept { return file_; }
  /// The temporary directory.
  const std::string& directory() const noexcept { return temp_; }
  /// The target (a symbolic link resolved).
  const std::string& target() const noexcept { return target_; }

  /// Makes the written file the target, only when it is verified: path() must be a regular file
  /// (non-empty unless @p may_be_empty) and every sidecar a regular file. Then: fsync of the
  /// files, the file's permissions set to the old target's (if any), sidecars renamed (a stale
  /// "<target>.aux.xml" or "<target>.ovr" removed when not written), the file renamed over the
  /// target (with @p overwrite false: the file and sidecars linked, so no existing file is ever
  /// replaced),
  /// the temporary directory removed, fsync of the directory.
  /// @throws std::runtime_error when the output is not verified, std::system_error with the
  /// errno when a rename fails or (overwrite false, std::errc::file_exists) the target or a
  /// sidecar exists; the temporary files are removed then and the target is as it was.
  void commit(bool overwrite = true, bool may_be_empty = false);

  /// @p text with every private path of this process's outputs in progress replaced by what it
  /// stands for: the output file by its target (as the caller spelt it), a sidecar by its name
  /// beside the target, anything else of a temporary directory (a staged file) by the target.
  /// For messages that quote a path given to a writer (GDAL's): they name the user's file,
  /// never a temporary. Thread-safe; throws only std::bad_alloc.
  static std::string without_temporaries(std::string text);

 private:
  void remove_files() noexcept;
  /// "[who: ]cannot write '<target as given>'".
  std::string cannot_write() const;

  std::string given_;  ///< the target as the caller spelt it, for messages
  const char* who_ = nullptr;
  std::string target_, dir_, name_, temp_, data_, file_;
  bool target_existed_ = false;
  mode_t target_mode_ = 0;
  int lock_fd_ = -1;     ///< the owner record, flock()ed; -1 if none
  int slot_ = -1;        ///< the signal registry slot, -1 if none
  bool listed_ = false;  ///< in the list without_temporaries reads
  bool committed_ = false;
};

/// @p path with its symbolic links followed, also a last link whose file does not exist yet
/// (the path that a write through it makes), made absolute and normal (weakly_canonical). Never
/// throws but std::bad_alloc.
std::string resolved_path(const std::string& path);

/// Whether @p a and @p b name one file: by device and inode when both exist, else by their
/// resolved paths (resolved_path). Never throws but std::bad_alloc.
bool same_file(const std::string& a, const std::string& b);

/// Refuses (std::invalid_argument, starting with @p who when given) a @p target that is one of
/// @p kept (same_file), naming the kept file's role.
void refuse_kept(const char* who, const std::string& target, const std::vector<KeptFile>& kept);

/// Writes @p bytes to @p path all or nothing (PendingOutput, then commit), refusing a @p path
/// that is one of @p kept before anything is made; messages start with @p who when given.
/// @throws what PendingOutput and refuse_kept throw; std::system_error with the errno when the
/// file cannot be written.
void write_output_file(const char* who, const std::string& path, std::string_view bytes,
                       bool overwrite, const std::vector<KeptFile>& kept = {});

}  // namespace vibespatial::raster::detail
