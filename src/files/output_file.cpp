// SPDX-License-Identifier: Apache-2.0
// All-or-nothing output files, the signal handlers that remove partial ones, and the removal of
// stale ones (output_file.hpp); the rules of a target and the public calls are output_target.cpp.
#include "files/output_file.hpp"

#include "common/text_escape.hpp"

#include <vibespatial/raster/outputs.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace vibespatial::raster {

namespace detail {

namespace {

constexpr char data_dir[] = "data";
constexpr char owner_file[] = "owner";
constexpr char owner_new_file[] = "owner.new";
/// Sidecars GDAL reads along with any raster file named like them: its PAM metadata and its
/// external overviews. One left from an old target would apply to the new file.
constexpr std::array<const char*, 2> read_along_suffixes = {".aux.xml", ".ovr"};
constexpr char temp_marker[] = ".vsr-";
constexpr std::size_t temp_random = 6;  ///< mkdtemp's XXXXXX
/// The target's name in the temporary directory's name is cut to this many bytes, so that the
/// directory's name stays within NAME_MAX (255) for any target name.
constexpr std::size_t temp_name_bytes = 200;

// ---- removal that a signal handler may run -----------------------------------------------------

/// A Linux directory entry as getdents64(2) returns it.
struct LinuxDirent64 {
  std::uint64_t d_ino;
  std::int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

/// Unlinks every entry of the open directory @p dfd that is not a directory; async-signal-safe
/// (getdents64, lseek, unlinkat). Passes until one removes nothing, since unlinking while reading
/// may move entries.
void unlink_entries(int dfd) noexcept {
  alignas(8) char buf[4096];
  for (int pass = 0; pass < 64; ++pass) {
    if (::lseek(dfd, 0, SEEK_SET) != 0) return;
    bool removed = false;
    for (;;) {
      const long n = ::syscall(SYS_getdents64, dfd, buf, sizeof buf);
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        const auto* d = reinterpret_cast<const LinuxDirent64*>(buf + off);
        off += d->d_reclen;
        const char* name = d->d_name;
        if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
        if (::unlinkat(dfd, name, 0) == 0) removed = true;
      }
    }
    if (!removed) return;
  }
}

/// Removes the temporary directory @p temp: the files of data/, data/, the files beside it (the
/// owner record, a staged GeoTIFF), then the directory. Async-signal-safe; leaves what a driver
/// nested deeper (the caller's std::filesystem pass removes that outside a signal handler).
void remove_temporary_signal_safe(const char* temp) noexcept {
  const int t = ::open(temp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (t >= 0) {
    const int d = ::openat(t, data_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d >= 0) {
      unlink_entries(d);
      ::close(d);
    }
    ::unlinkat(t, data_dir, AT_REMOVEDIR);
    // The owner record and what a writer stages beside data/ (a CreateCopy driver's GeoTIFF).
    unlink_entries(t);
    ::close(t);
  }
  ::rmdir(temp);
}

/// Removes the temporary directory @p temp and everything in it. Never throws.
void remove_temporary(const std::string& temp) noexcept {
  try {
    std::error_code ec;
    std::filesystem::remove_all(temp, ec);
  } catch (...) {
  }
  remove_temporary_signal_safe(temp.c_str());
}

// ---- the registry the signal handler reads -----------------------------------------------------

// Fixed storage, no allocation, published with atomics.
// state: 0 free, 1 being filled or emptied by its owner, 2 published (the handler removes it).
constexpr int registry_slots = 64;
constexpr std::size_t path_capacity = 4096;

struct Slot {
  std::atomic<int> state{0};
  pid_t owner = 0;  ///< the process that made the temporary: a child of fork leaves it alone
  char temp[path_capacity];
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
    std::memcpy(s.temp, temp.c_str(), temp.size() + 1);
    s.owner = ::getpid();
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
  const pid_t me = ::getpid();
  for (Slot& s : registry) {
    if (s.state.load(std::memory_order_acquire) == 2 && s.owner == me) {
      remove_temporary_signal_safe(s.temp);
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

// ---- owner records -----------------------------------------------------------------------------

/// The first line of @p path (at most 255 bytes), "" when it cannot be read.
std::string first_line(const char* path) {
  std::FILE* f = std::fopen(path, "re");
  if (f == nullptr) return "";
  char line[256] = {};
  const bool ok = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  if (!ok) return "";
  std::string s = line;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

/// When process @p pid started (clock ticks after boot, /proc/<pid>/stat field 22); "" when
/// unknown (no such process, no /proc).
std::string start_time_of(long pid) {
  const std::string stat = first_line(("/proc/" + std::to_string(pid) + "/stat").c_str());
  // The command (field 2) is in parentheses and may hold spaces: count from the last ')'.
  const std::size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return "";
  std::size_t at = paren + 1;
  for (int field = 3; field <= 22; ++field) {
    while (at < stat.size() && stat[at] == ' ') ++at;
    const std::size_t end = stat.find(' ', at);
    if (field == 22) return stat.substr(at, end == std::string::npos ? end : end - at);
    if (end == std::string::npos) return "";
    at = end;
  }
  return "";
}

std::string boot_id() {
  return first_line("/proc/sys/kernel/random/boot_id");
}

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "";
  return host;
}

/// Who wrote a temporary directory.
struct OwnerRecord {
  long pid = 0;
  std::string start, boot, host;
};

std::string record_text(const OwnerRecord& r, const std::string& target) {
  return "vibespatial-raster temporary output\npid " + std::to_string(r.pid) + "\nstart " +
         r.start + "\nboot " + r.boot + "\nhost " + r.host + "\ntarget " + printable(target) + "\n";
}

/// Parses what record_text wrote; false when it is not such a record.
bool parse_record(const std::string& text, OwnerRecord& r) {
  if (text.rfind("vibespatial-raster temporary output\n", 0) != 0) return false;
  const auto value = [&](const char* key) -> std::string {
    const std::string k = std::string("\n") + key + " ";
    const std::size_t at = text.find(k);
    if (at == std::string::npos) return "";
    const std::size_t begin = at + k.size();
    return text.substr(begin, text.find('\n', begin) - begin);
  };
  const std::string pid = value("pid");
  char* end = nullptr;
  r.pid = std::strtol(pid.c_str(), &end, 10);
  if (pid.empty() || *end != '\0' || r.pid <= 0) return false;
  r.start = value("start");
  r.boot = value("boot");
  r.host = value("host");
  return true;
}

/// Whether the process the record names may still run: same boot, and its pid is a process
/// that started when the record says (or that cannot be told apart).
bool may_be_running(const OwnerRecord& r) {
  if (::kill(static_cast<pid_t>(r.pid), 0) != 0 && errno == ESRCH) return false;
  const std::string start = start_time_of(r.pid);
  return start.empty() || r.start.empty() || start == r.start;
}

/// Whether the temporary directory @p temp (its owner record locked by the caller, through
/// @p fd) is stale: its writer has gone.
bool is_stale(int fd) {
  std::string text;
  char buf[1024];
  for (ssize_t n; (n = ::pread(fd, buf, sizeof buf, static_cast<off_t>(text.size()))) > 0;) {
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > 65536) return false;
  }
  OwnerRecord r;
  if (!parse_record(text, r)) return false;
  const std::string boot = boot_id();
  if (!r.boot.empty() && r.boot == boot) return !may_be_running(r);
  // Another boot: of this host (it was rebooted, so the writer is gone), or another machine
  // sharing the directory, whose processes this one cannot see: left alone.
  return !r.host.empty() && r.host == host_name() && !r.boot.empty() && !boot.empty();
}

/// Removes the stale temporary directories of target name @p temp_prefix ("." + name + ".vsr-")
/// in @p dir. Never throws.
void remove_stale_temporaries(const std::string& dir, const std::string& temp_prefix) noexcept {
  try {
    std::vector<std::string> candidates;
    if (DIR* d = ::opendir(dir.c_str()); d != nullptr) {
      while (const dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n.size() == temp_prefix.size() + temp_random && n.rfind(temp_prefix, 0) == 0) {
          candidates.push_back(dir + "/" + n);
        }
      }
      ::closedir(d);
    }
    for (const std::string& temp : candidates) {
      struct stat st {};
      if (::lstat(temp.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
      const std::string owner = temp + "/" + owner_file;
      const int fd = ::open(owner.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) continue;  // no record: whose it is cannot be told
      // The lock is held by the writer for as long as it lives (and dropped by the kernel when
      // it dies, however it dies); held here while removing, so two cleaners never race.
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && is_stale(fd)) remove_temporary(temp);
      ::close(fd);
    }
  } catch (...) {
  }
}

void sync_path(const std::string& path, int flags) noexcept {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

/// The outputs in progress whose paths without_temporaries replaces. Never destroyed: an output
/// may outlive the statics of the program (one held by a static object).
std::mutex& live_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<const PendingOutput*>& live_outputs() {
  static auto* v = new std::vector<const PendingOutput*>;
  return *v;
}

[[noreturn]] void throw_errno(int err, const std::string& what) {
  throw std::system_error(err, std::generic_category(), what);
}

}  // namespace

PendingOutput::PendingOutput(const std::string& target, bool overwrite, const char* who)
    : given_(target), who_(who) {
  namespace fs = std::filesystem;
  // The system calls would stop the path at the NUL and replace another file.
  if (target.find('\0') != std::string::npos) {
    throw std::invalid_argument(cannot_write() + ": the path holds a NUL byte");
  }
  std::error_code ec;
  fs::path t(target);
  // Replace (or make) the file a symbolic link names, not the link.
  if (fs::is_symlink(fs::symlink_status(t, ec))) t = resolved_path(target);
  target_ = t.string();
  dir_ = t.has_parent_path() ? t.parent_path().string() : std::string(".");
  name_ = t.filename().string();
  if (name_.empty() || name_ == "." || name_ == "..") {
    throw std::invalid_argument(cannot_write() + ": not a file name");
  }

  struct stat st {};
  target_existed_ = ::stat(target_.c_str(), &st) == 0;
  if (target_existed_ && S_ISDIR(st.st_mode)) {
    throw std::invalid_argument(cannot_write() + ": it is a directory");
  }
  // A FIFO, socket or device (/dev/null) would be replaced by a regular file: its readers
  // would wait forever, or the system would lose the device node.
  if (target_existed_ && !S_ISREG(st.st_mode)) {
    throw std::invalid_argument(cannot_write() +
                                ": not a regular file (a FIFO, socket or device), which an "
                                "output never replaces");
  }
  if (target_existed_ && !overwrite) {
    throw_errno(EEXIST, cannot_write() + ": it exists (overwriting was not asked for)");
  }
  target_mode_ = st.st_mode;

  // Built piecewise: GCC 12 at -O3 warns (-Wrestrict, a false positive) on "." + substr(...).
  std::string prefix(1, '.');
  prefix.append(name_, 0, temp_name_bytes).append(temp_marker);
  remove_stale_temporaries(dir_, prefix);

  const std::string cannot_make = std::string(who_ != nullptr ? who_ : "") +
                                  (who_ != nullptr ? ": " : "") +
                                  "cannot create a temporary directory in '" + printable(dir_) +
                                  "' to write '" + printable(target) + "'";
  std::string templ = (fs::path(dir_) / (prefix + std::string(temp_random, 'X'))).string();
  if (::mkdtemp(templ.data()) == nullptr) throw_errno(errno, cannot_make);
  temp_ = templ;
  data_ = temp_ + "/" + data_dir;
  file_ = data_ + "/" + name_;
  slot_ = publish(temp_);
  if (::mkdir(data_.c_str(), 0700) != 0) {
    const int err = errno;
    remove_files();
    withdraw(slot_);
    throw_errno(err, cannot_make);
  }
  // The owner record, locked before it gets its name: a cleaner never sees it unlocked while
  // this process lives. Without flock (some network file systems) there is no record, and
  // nothing but this process removes the temporary.
  const std::string fresh = temp_ + "/" + owner_new_file;
  const int fd = ::open(fresh.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    bool kept = false;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      OwnerRecord me;
      me.pid = static_cast<long>(::getpid());
      me.start = start_time_of(me.pid);
      me.boot = boot_id();
      me.host = host_name();
      const std::string text = record_text(me, target_);
      kept = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
             ::rename(fresh.c_str(), (temp_ + "/" + owner_file).c_str()) == 0;
    }
    if (kept) {
      lock_fd_ = fd;
    } else {
      ::close(fd);
      ::unlink(fresh.c_str());
    }
  }
  try {
    const std::lock_guard<std::mutex> lock(live_mutex());
    live_outputs().push_back(this);
    listed_ = true;
  } catch (...) {
    // Out of memory: the output is written all the same; its messages may name its temporary.
  }
}

PendingOutput::~PendingOutput() {
  if (listed_) {
    const std::lock_guard<std::mutex> lock(live_mutex());
    auto& live = live_outputs();
    live.erase(std::remove(live.begin(), live.end(), this), live.end());
  }
  if (!committed_) remove_files();
  withdraw(slot_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string PendingOutput::cannot_write() const {
  return std::string(who_ != nullptr ? who_ : "") + (who_ != nullptr ? ": " : "") +
         "cannot write '" + printable(given_) + "'";
}

std::string PendingOutput::without_temporaries(std::string text) {
  if (text.find(temp_marker) == std::string::npos) return text;
  const std::string data = std::string("/") + data_dir + "/";
  const std::lock_guard<std::mutex> lock(live_mutex());
  for (const PendingOutput* p : live_outputs()) {
    if (text.find(p->temp_) == std::string::npos) continue;
    // Sidecars are named as they will be, beside the target.
    const std::string beside =
        p->dir_ == "." && p->target_.find('/') == std::string::npos ? "" : p->dir_ + "/";
    std::string out;
    std::size_t at = 0;
    for (std::size_t i; (i = text.find(p->temp_, at)) != std::string::npos;) {
      out.append(text, at, i - at);
      std::size_t j = i + p->temp_.size();
      if (text.compare(j, data.size() + p->name_.size(), data + p->name_) == 0 &&
          (j + data.size() + p->name_.size() == text.size() ||
           text[j + data.size() + p->name_.size()] != '.')) {
        out += p->given_;
        j += data.size() + p->name_.size();
      } else if (text.compare(j, data.size(), data) == 0) {
        out += beside;
        j += data.size();
      } else {
        // Another file of the temporary directory (a staged copy): the target it is made for.
        out += p->given_;
        if (j < text.size() && text[j] == '/') {
          ++j;
          while (j < text.size() && std::strchr(" :'\"`,;()[]", text[j]) == nullptr) ++j;
        }
      }
      at = j;
    }
    out.append(text, at, std::string::npos);
    text = std::move(out);
  }
  return text;
}

void PendingOutput::remove_files() noexcept {
  remove_temporary(temp_);
}

void PendingOutput::commit(bool overwrite, bool may_be_empty) {
  // Removes the temporary files, then throws: std::system_error with @p err when there is one.
  const auto fail = [&](const std::string& why, int err = 0) {
    remove_files();
    if (err != 0) throw_errno(err, cannot_write() + ": " + why);
    throw std::runtime_error(cannot_write() + ": " + why);
  };
  // What the writer left in data/: names and their types, read before anything is judged.
  std::vector<std::pair<std::string, struct stat>> entries;
  if (DIR* d = ::opendir(data_.c_str()); d != nullptr) {
    try {
      while (const dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n == "." || n == "..") continue;
        struct stat st {};
        if (::lstat((data_ + "/" + n).c_str(), &st) != 0) st.st_mode = 0;
        entries.emplace_back(n, st);
      }
    } catch (...) {
      ::closedir(d);
      throw;
    }
    ::closedir(d);
  }
  std::vector<std::string> sidecars;
  const struct stat* main = nullptr;
  std::string others;
  for (const auto& [n, st] : entries) {
    if (!S_ISREG(st.st_mode)) {
      fail("the writer made '" + printable(n) +
           "', which is not a regular file (outputs are files; a directory output is not "
           "supported): nothing was replaced");
    }
    if (n == name_) {
      main = &st;
    } else {
      sidecars.push_back(n);
      others += (others.empty() ? "" : ", ") + printable(n);
    }
  }
  if (main == nullptr) {
    fail("the writer wrote no file under its name" +
         (others.empty() ? std::string(" (nothing at all)") : " (only " + others + ")") +
         ": nothing was replaced");
  }
  if (main->st_size == 0 && !may_be_empty) {
    fail("the writer left it empty (0 bytes): nothing was replaced");
  }
  for (const std::string& n : sidecars) sync_path(data_ + "/" + n, O_RDONLY);
  sync_path(file_, O_RDONLY);
  if (target_existed_) ::chmod(file_.c_str(), target_mode_ & 07777);

  // The read-along sidecars (see read_along_suffixes) this write did not write: removed.
  const auto read_along = [&](const std::string& n) {
    for (const char* suffix : read_along_suffixes) {
      if (n == name_ + suffix) return true;
    }
    return false;
  };
  const auto remove_stale_read_along = [&] {
    for (const char* suffix : read_along_suffixes) {
      if (std::find(sidecars.begin(), sidecars.end(), name_ + suffix) == sidecars.end()) {
        ::unlink((target_ + suffix).c_str());
      }
    }
  };
  if (overwrite) {
    for (const std::string& n : sidecars) {
      const std::string from = data_ + "/" + n, to = dir_ + "/" + n;
      if (::rename(from.c_str(), to.c_str()) != 0) {
        fail("cannot rename its sidecar into place as '" + printable(to) + "'", errno);
      }
    }
    // A stale .aux.xml or .ovr of the old file would otherwise apply to the new one.
    remove_stale_read_along();
    if (::rename(file_.c_str(), target_.c_str()) != 0) {
      fail("cannot rename the written file over it", errno);
    }
  } else {
    // link(2) never replaces: a target that appeared meanwhile is kept and the write fails. The
    // file first (it claims the name), then its sidecars; a sidecar of that name that exists
    // undoes the write.
    if (::link(file_.c_str(), target_.c_str()) != 0) {
      const int err = errno;
      fail(err == EEXIST ? std::string("it exists (overwriting was not asked for)")
                         : std::string("cannot link the written file into place"),
           err);
    }
    std::vector<std::string> linked;
    for (const std::string& n : sidecars) {
      const std::string from = data_ + "/" + n, to = dir_ + "/" + n;
      // An .aux.xml or .ovr beside a target that did not exist is stale: replaced.
      const bool ok = read_along(n) ? ::rename(from.c_str(), to.c_str()) == 0
                                    : ::link(from.c_str(), to.c_str()) == 0;
      if (!ok) {
        const int err = errno;
        for (const std::string& l : linked) ::unlink(l.c_str());
        ::unlink(target_.c_str());
        fail("its sidecar '" + printable(to) + "' " +
                 (err == EEXIST ? std::string("exists (overwriting was not asked for)")
                                : std::string("cannot be written")),
             err);
      }
      if (!read_along(n)) linked.push_back(to);
    }
    remove_stale_read_along();
  }
  committed_ = true;
  remove_files();
  sync_path(dir_, O_RDONLY | O_DIRECTORY);
}

}  // namespace detail

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
