// SPDX-License-Identifier: Apache-2.0
// All-or-nothing output files: the one writer of every file the library writes (rasters through
// io.hpp, the memory snapshot of memory_history.hpp, text outputs), the rules its target keeps,
// and the cleanup of partial outputs. Works without GDAL (docs/outputs.md).
//
// - The writer writes into a private temporary directory beside the target (same directory, a
//   unique hidden name ".<name>.vsr-XXXXXX", mode 0700), under the target's own file name, and
//   renames the complete file over the target (rename(2): atomic on one file system). On any
//   error the temporary directory is removed and the target is untouched: an existing file
//   survives byte for byte, a new one does not appear.
// - The target: a regular file or a path that does not exist. A directory, FIFO, socket or
//   device (/dev/null) is never replaced (std::invalid_argument); a symbolic link is followed
//   (the file it names is replaced, the link stays). An existing target without overwrite is
//   std::system_error (std::errc::file_exists), also when it appears while the output is written
//   (it is linked into place, never renamed over). A directory that takes no temporary (missing,
//   read-only) is std::system_error with the errno. The output's permissions are an existing
//   target's, else 0666 less the umask.
// - Files it must not replace (KeptFile): the inputs of a run and its other outputs. The same
//   file by any spelling (a symbolic link, a hard link, "./x", "a/../x") is refused with
//   std::invalid_argument: files that exist are compared by device and inode, others by their
//   canonical paths.
// - Messages start with the public call's name and name the target as given; a private
//   temporary path never appears in a message of the library.
// - Cleanup: a process killed by a signal leaves no temporary behind when it called
//   remove_partial_outputs_on_signals(). One killed by SIGKILL (or a power cut) leaves its
//   temporary directory; the next write to the same target removes it when its writer is gone
//   (the owner record it holds locked, docs/outputs.md).
// - Thread-safety: every call is independent; concurrent writes to the same target each write
//   all or nothing (the last to finish is the file; without overwrite, the first, and the
//   others fail).
#pragma once

#include <vibespatial/raster/export.hpp>

#include <string>
#include <vector>

namespace vibespatial::raster {

/// A file an output must never replace: an input of the same run, or another of its outputs.
struct KeptFile {
  std::string role;  ///< what it is, for the message: "the input", "--output", "input B"
  std::string path;
};

/**
 * @brief Checks that @p path can take an output without writing it: it is a regular file or does
 * not exist (and with @p overwrite false does not exist), and its directory takes a temporary
 * directory (one is made and removed; stale temporaries of earlier writes to @p path are removed
 * as a write would). For a tool to refuse an output before it computes anything.
 * @throws std::invalid_argument for a path with a NUL byte, that names no file, or a directory,
 *         FIFO, socket or device; std::system_error with the errno when the directory takes no
 *         temporary (a read-only or missing directory) or, std::errc::file_exists, when @p path
 *         exists and @p overwrite is false.
 */
VSR_EXPORT void check_output_path(const std::string& path, bool overwrite = true);

/**
 * @brief check_output_path, and @p path is none of @p kept (by any spelling: see above): for a
 * tool to refuse, before it computes anything, an output that would replace one of its inputs or
 * another of its outputs.
 * @throws what check_output_path throws; std::invalid_argument naming the kept file's role when
 *         @p path is one of them.
 */
VSR_EXPORT void check_output_path(const std::string& path, bool overwrite,
                                  const std::vector<KeptFile>& kept);

/**
 * @brief Writes @p bytes to @p path all or nothing (see above), for text outputs such as
 * statistics. With @p overwrite false an existing @p path is refused.
 * @throws what check_output_path throws; std::system_error with the errno when the file cannot
 *         be written (a full disk).
 */
VSR_EXPORT void write_file_atomically(const std::string& path, const std::string& bytes,
                                      bool overwrite = true);

/**
 * @brief write_file_atomically, refusing a @p path that is one of @p kept (check_output_path
 * with @p kept), checked before anything is written.
 */
VSR_EXPORT void write_file_atomically(const std::string& path, const std::string& bytes,
                                      bool overwrite, const std::vector<KeptFile>& kept);

/**
 * @brief Installs handlers for SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGPIPE, SIGXCPU and SIGXFSZ
 * (each only where its disposition is the default) that remove the temporary files of this
 * process's writes in progress (unlink, async-signal-safe; a child of fork without exec leaves
 * its parent's alone) and then re-raise the signal with its default
 * action, so the process still dies of it (exit status as before, e.g. 130 in a shell for
 * SIGINT) and the targets stay untouched. For programs: a library call never installs handlers
 * on its own. Idempotent and thread-safe; throws nothing. Up to 64 writes in progress at once
 * are covered; more still work but their temporary files may survive a signal.
 */
VSR_EXPORT void remove_partial_outputs_on_signals() noexcept;

}  // namespace vibespatial::raster
