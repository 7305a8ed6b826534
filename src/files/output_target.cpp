// SPDX-License-Identifier: Apache-2.0
// The rules of an output's target that every writer shares (outputs.hpp, output_file.hpp): a
// target is never one of the files a run keeps (its inputs, its other outputs) by any spelling;
// bytes written all or nothing; and the public calls over them.
#include "common/text_escape.hpp"
#include "files/output_file.hpp"

#include <vibespatial/raster/outputs.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace vibespatial::raster {

namespace detail {

std::string resolved_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(path), ec);
  if (ec) p = fs::path(path);
  // Each link by hand: weakly_canonical leaves a link whose file does not exist unresolved, and
  // a write through it makes that file. As many links as the kernel follows (ELOOP beyond).
  for (int hops = 0; hops < 40; ++hops) {
    if (!fs::is_symlink(fs::symlink_status(p, ec))) break;
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) break;
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  const fs::path canonical = fs::weakly_canonical(p, ec);
  return (ec ? p.lexically_normal() : canonical).string();
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {};
  struct stat sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) {
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  }
  return resolved_path(a) == resolved_path(b);
}

void refuse_kept(const char* who, const std::string& target, const std::vector<KeptFile>& kept) {
  if (target.find('\0') != std::string::npos) return;  // PendingOutput refuses it
  for (const KeptFile& k : kept) {
    if (k.path.empty() || k.path.find('\0') != std::string::npos) continue;
    if (!same_file(target, k.path)) continue;
    throw std::invalid_argument(std::string(who != nullptr ? who : "") +
                                (who != nullptr ? ": " : "") + "cannot write '" +
                                printable(target) + "': it is the same file as " + k.role + " '" +
                                printable(k.path) + "', which must not be replaced");
  }
}

void write_output_file(const char* who, const std::string& path, std::string_view bytes,
                       bool overwrite, const std::vector<KeptFile>& kept) {
  refuse_kept(who, path, kept);
  PendingOutput pending(path, overwrite, who);
  const std::string cannot = std::string(who != nullptr ? who : "") + (who != nullptr ? ": " : "") +
                             "cannot write '" + printable(path) + "'";
  const int fd =
      ::open(pending.path().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), cannot);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw std::system_error(err, std::generic_category(), cannot);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) throw std::system_error(errno, std::generic_category(), cannot);
  pending.commit(overwrite, bytes.empty());
}

}  // namespace detail

void check_output_path(const std::string& path, bool overwrite) {
  const detail::PendingOutput pending(path, overwrite);  // never committed: removed
}

void check_output_path(const std::string& path, bool overwrite, const std::vector<KeptFile>& kept) {
  detail::refuse_kept(nullptr, path, kept);
  check_output_path(path, overwrite);
}

void write_file_atomically(const std::string& path, const std::string& bytes, bool overwrite) {
  detail::write_output_file(nullptr, path, bytes, overwrite);
}

void write_file_atomically(const std::string& path, const std::string& bytes, bool overwrite,
                           const std::vector<KeptFile>& kept) {
  detail::write_output_file(nullptr, path, bytes, overwrite, kept);
}

}  // namespace vibespatial::raster
