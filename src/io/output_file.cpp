// SPDX-License-Identifier: Apache-2.0
// All-or-nothing output files and the signal handlers that remove partial ones (output_file.hpp).
#include "io/output_file.hpp"

#include "common/text_escape.hpp"

#include <vibespatial/raster/io.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace vibespatial::raster {

namespace detail {

namespace {

// The registry the signal handler reads: fixed storage, no allocation, published with atomics.
// state: 0 free, 1 being filled or emptied by its owner, 2 published (the handler unlinks it).
constexpr int registry_slots = 64;
constexpr std::size_t path_capacity = 4096;
constexpr char aux_suffix[] = ".aux.xml";

struct Slot {
  std::atomic<int> state{0};
  char path[path_capacity];
  char aux[path_capacity + sizeof aux_suffix];
};

std::array<Slot, registry_slots> registry;

static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

/// Publishes @p temp for the signal handler; -1 when it is too long or every slot is taken.
int publish(const std::string& temp) noexcept {
  if (temp.size() + 1 > path_capacity) return -1;
  for (int i = 0; i < registry_slots; ++i) {
    Slot& s = registry[static_cast<std::size_t>(i)];
    int expected = 0;
    if (!s.state.compare_exchange_strong(expected, 1, std::memory_order_acquire)) continue;
    std::memcpy(s.path, temp.c_str(), temp.size() + 1);
    std::memcpy(s.aux, temp.c_str(), temp.size());
    std::memcpy(s.aux + temp.size(), aux_suffix, sizeof aux_suffix);
    s.state.store(2, std::memory_order_release);
    return i;
  }
  return -1;
}

void withdraw(int slot) noexcept {
  if (slot < 0) return;
  Slot& s = registry[static_cast<std::size_t>(slot)];
  s.state.store(1, std::memory_order_relaxed);
  s.state.store(0, std::memory_order_release);
}

constexpr std::array<int, 7> cleanup_signals = {SIGHUP,  SIGINT,  SIGQUIT, SIGTERM,
                                                SIGPIPE, SIGXCPU, SIGXFSZ};

void remove_partial_outputs_and_reraise(int sig) {
  const int saved_errno = errno;
  for (Slot& s : registry) {
    if (s.state.load(std::memory_order_acquire) == 2) {
      ::unlink(s.path);
      ::unlink(s.aux);
    }
  }
  // Default action, then the signal again: it is blocked while this handler runs, so it is
  // delivered (and ends the process as it would have) when the handler returns.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
  errno = saved_errno;
}

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

/// Six random characters for a temporary name.
std::string random_suffix() {
  static constexpr char alphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng = [] {
    std::random_device rd;
    std::seed_seq seq{
        rd(), rd(), static_cast<unsigned>(::getpid()),
        static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count())};
    return std::mt19937_64(seq);
  }();
  std::string s(6, 'x');
  for (char& c : s) c = alphabet[rng() % (sizeof alphabet - 1)];
  return s;
}

void sync_path(const std::string& path, int flags) noexcept {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

PendingOutput::PendingOutput(const std::string& target, bool overwrite) {
  namespace fs = std::filesystem;
  // The system calls would stop the path at the NUL and replace another file.
  if (target.find('\0') != std::string::npos) {
    throw std::invalid_argument("cannot write '" + printable(target) +
                                "': the path holds a NUL byte");
  }
  std::error_code ec;
  fs::path t(target);
  // Replace the file a symbolic link names, not the link.
  if (fs::is_symlink(fs::symlink_status(t, ec))) {
    const fs::path resolved = fs::weakly_canonical(t, ec);
    if (!ec) t = resolved;
  }
  target_ = t.string();
  dir_ = t.has_parent_path() ? t.parent_path().string() : std::string(".");
  const std::string name = t.filename().string();
  if (name.empty() || name == "." || name == "..") {
    throw std::runtime_error("cannot write '" + printable(target) + "': not a file name");
  }
  const std::size_t dot = name.rfind('.');
  stem_ = (dot == std::string::npos || dot == 0) ? name : name.substr(0, dot);
  const std::string ext = (dot == std::string::npos || dot == 0) ? "" : name.substr(dot);

  struct stat st {};
  const bool exists = ::stat(target_.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) {
    throw std::runtime_error("cannot write '" + printable(target) + "': it is a directory");
  }
  if (exists && !overwrite) {
    throw std::runtime_error("'" + printable(target) + "' exists (overwriting was not asked for)");
  }
  for (int attempt = 0;; ++attempt) {
    temp_stem_ = "." + stem_ + ".vsr-" + random_suffix();
    temp_ = (fs::path(dir_) / (temp_stem_ + ext)).string();
    const int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      if (exists) ::fchmod(fd, st.st_mode & 07777);
      ::close(fd);
      break;
    }
    const int err = errno;
    if (err != EEXIST || attempt >= 100) {
      throw std::runtime_error("cannot create a temporary file in '" + printable(dir_) +
                               "' to write '" + printable(target) + "': " + errno_text(err));
    }
  }
  slot_ = publish(temp_);
}

PendingOutput::~PendingOutput() {
  if (!committed_) remove_files();
  withdraw(slot_);
}

void PendingOutput::remove_files() noexcept {
  // Sidecars first, the temporary itself last.
  if (DIR* d = ::opendir(dir_.c_str()); d != nullptr) {
    std::vector<std::string> names;
    try {
      while (const dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n.rfind(temp_stem_, 0) == 0) names.push_back(n);
      }
    } catch (...) {
    }
    ::closedir(d);
    for (const std::string& n : names) {
      const std::string p = dir_ + "/" + n;
      if (p != temp_) ::unlink(p.c_str());
    }
  }
  ::unlink(temp_.c_str());
}

void PendingOutput::commit(bool overwrite) {
  std::vector<std::string> sidecars;
  if (DIR* d = ::opendir(dir_.c_str()); d != nullptr) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind(temp_stem_, 0) == 0 && dir_ + "/" + n != temp_) sidecars.push_back(n);
    }
    ::closedir(d);
  }
  sync_path(temp_, O_RDONLY);
  const auto fail = [&](const std::string& what, int err) {
    remove_files();
    throw std::runtime_error("cannot " + what + ": " + errno_text(err));
  };
  bool aux_written = false;
  for (const std::string& n : sidecars) {
    const std::string to = stem_ + n.substr(temp_stem_.size());
    const std::string from_path = dir_ + "/" + n, to_path = dir_ + "/" + to;
    if (to_path == target_ + aux_suffix) aux_written = true;
    if (::rename(from_path.c_str(), to_path.c_str()) != 0) {
      fail("rename '" + printable(from_path) + "' to '" + printable(to_path) + "'", errno);
    }
  }
  // A stale .aux.xml of the old file would otherwise apply its metadata to the new one.
  if (!aux_written) ::unlink((target_ + aux_suffix).c_str());
  if (overwrite) {
    if (::rename(temp_.c_str(), target_.c_str()) != 0) {
      fail("rename '" + printable(temp_) + "' to '" + printable(target_) + "'", errno);
    }
  } else {
    // link(2) never replaces: a target that appeared meanwhile is kept and the run fails.
    if (::link(temp_.c_str(), target_.c_str()) != 0) {
      fail("write '" + printable(target_) + "'" +
               (errno == EEXIST ? std::string(" (it exists; overwriting was not asked for)") : ""),
           errno);
    }
    ::unlink(temp_.c_str());
  }
  committed_ = true;
  sync_path(dir_, O_RDONLY | O_DIRECTORY);
}

}  // namespace detail

void write_file_atomically(const std::string& path, const std::string& bytes, bool overwrite) {
  detail::PendingOutput pending(path, overwrite);
  const int fd = ::open(pending.path().c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0)
    throw std::runtime_error("cannot write '" + detail::printable(path) +
                             "': " + detail::errno_text(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error("cannot write '" + detail::printable(path) +
                               "': " + detail::errno_text(err));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    throw std::runtime_error("cannot write '" + detail::printable(path) +
                             "': " + detail::errno_text(errno));
  }
  pending.commit(overwrite);
}

void remove_partial_outputs_on_signals() noexcept {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  for (const int sig : detail::cleanup_signals) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_handler = detail::remove_partial_outputs_and_reraise;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace vibespatial::raster
