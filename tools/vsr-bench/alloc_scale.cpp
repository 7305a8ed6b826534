// SPDX-License-Identifier: Apache-2.0
// vsr-bench alloc, section 5: the large trace's cost per op on the pool as the device grows, an
// 8 GiB and a 141 GiB (H200) emulated device side by side in one run (at most 1.1x is the aim:
// the pool's window search is bounded by the mapped extent, not the reserved one).
//
// The emulator reads its device size (VSR_EMU_DEVICE_MEMORY) once, at cuInit, so each size runs
// in a worker process of its own: this program again (/proc/self/exe) as the hidden command
// `alloc-scale-worker`, with the variable set. A worker rebuilds the parent's large trace from its
// sizes and seed, replays it once as a warm-up, says it is ready (its device's size and the
// trace's fingerprint, which the parent checks), then answers each request "round" with the ns
// per op of one more replay on its pool, until "quit". The parent alternates the two workers'
// rounds (8, 141, 8, 141, ...) and takes the median of the per-round ratios 141/8.
//
// The protocol runs over a socket pair that is the worker's stdin and stdout; the worker's
// answers are lines starting with "vsr-bench-scale " (anything else it prints is passed over),
// and an error in the worker is one line "vsr-bench-scale error <message>" and exit status 1.
#include "alloc.hpp"
#include "bench_driver.hpp"

#include <vibespatial/raster/driver.hpp>

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

namespace vsr_bench {
namespace {

constexpr std::string_view kPrefix = "vsr-bench-scale ";
constexpr std::size_t kSmallDevice = 8 * kGiB, kLargeDevice = 141 * kGiB;
constexpr int kAnswerTimeoutMs = 120'000;  // a warm-up or a round takes well under a second

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// One worker process on an emulated device of a given size.
class Worker {
 public:
  Worker(std::string name, std::size_t device_bytes, const std::vector<std::string>& args)
      : name_(std::move(name)) {
    // The environment as it is, with the device size replaced.
    const std::string size_var = "VSR_EMU_DEVICE_MEMORY=" + std::to_string(device_bytes);
    std::vector<char*> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "VSR_EMU_DEVICE_MEMORY=", 22) != 0) env.push_back(*e);
    }
    env.push_back(const_cast<char*>(size_var.c_str()));
    env.push_back(nullptr);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      throw std::runtime_error(name_ + ": " + errno_text("socketpair"));
    }
    fd_ = fds[0];
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    const int rc =
        ::posix_spawn(&pid_, "/proc/self/exe", &actions, nullptr, argv.data(), env.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    if (rc != 0) {
      pid_ = -1;
      ::close(fd_);
      throw std::runtime_error(name_ + ": cannot start /proc/self/exe: " + std::strerror(rc));
    }
  }

  const std::string& name() const { return name_; }

  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // A worker not finished (an error on the way) is killed: it started nothing of its own.
  ~Worker() {
    if (fd_ >= 0) ::close(fd_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }

  // The worker's next answer, without its prefix. Throws its error, or when it exits or does not
  // answer in time.
  std::string answer() {
    while (true) {
      const std::size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        if (line.rfind(kPrefix, 0) != 0) continue;  // not the protocol's
        line.erase(0, kPrefix.size());
        if (line.rfind("error ", 0) == 0) throw std::runtime_error(name_ + ": " + line.substr(6));
        return line;
      }
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, kAnswerTimeoutMs);
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) throw std::runtime_error(name_ + ": " + errno_text("poll"));
      if (ready == 0) {
        throw std::runtime_error(name_ + ": no answer within " +
                                 std::to_string(kAnswerTimeoutMs / 1000) + " s");
      }
      char chunk[512];
      const ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::runtime_error(name_ + ": " + errno_text("read"));
      if (n == 0) throw std::runtime_error(name_ + ": exited before answering (" + reap() + ")");
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  // Sends one request line (MSG_NOSIGNAL: a worker that died is an error here, not a SIGPIPE).
  void request(std::string_view line) {
    const std::string text = std::string(line) + "\n";
    if (::send(fd_, text.data(), text.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(text.size())) {
      throw std::runtime_error(name_ + ": " + errno_text("send"));
    }
  }

  // Asks the worker to quit and waits for it; throws unless it exits with status 0.
  void finish() {
    request("quit");
    const std::string how = reap();
    if (how != "exit status 0") throw std::runtime_error(name_ + ": " + how);
  }

 private:
  // Waits for the worker to end; how it ended.
  std::string reap() {
    int status = 0;
    pid_t r;
    while ((r = ::waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    if (r < 0) return errno_text("waitpid");
    if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
    return "status " + std::to_string(status);
  }

  std::string name_;
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buffer_;
};

// The value of the word "key=value" in a worker's answer; throws when there is none.
std::string field(const std::string& answer, const std::string& key, const std::string& who) {
  const std::string k = key + "=";
  for (std::size_t at = 0; at < answer.size();) {
    const std::size_t end = std::min(answer.find(' ', at), answer.size());
    if (end - at >= k.size() && answer.compare(at, k.size(), k) == 0) {
      return answer.substr(at + k.size(), end - at - k.size());
    }
    at = end + 1;
  }
  throw std::runtime_error(who + ": unexpected answer '" + answer + "' (no " + key + ")");
}

double number(const std::string& text, const std::string& who) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v) || v <= 0) {
    throw std::runtime_error(who + ": not a time: '" + text + "'");
  }
  return v;
}

struct ScaleResult {
  std::vector<double> small, large, ratio;  // ns/op per round; large / small per round
};

ScaleResult measure(const Trace& large, std::uint64_t large_seed, const AllocSizes& z) {
  const std::string label = "5/6 scale";
  const std::vector<std::string> args{"vsr-bench",     "alloc-scale-worker",
                                      "--live",        std::to_string(large.fill.size()),
                                      "--trace-steps", std::to_string(large.steps.size()),
                                      "--steps",       std::to_string(z.large_steps),
                                      "--seed",        std::to_string(large_seed)};
  char want_fp[32];
  std::snprintf(want_fp, sizeof want_fp, "%016" PRIx64, fingerprint(large));
  // Started and warmed up one after the other, so the warm-ups do not share the CPUs.
  const auto start = [&](const char* size, std::size_t bytes) {
    progress("%s: %s device worker, warm-up", label.c_str(), size);
    auto w = std::make_unique<Worker>(std::string("the ") + size + " device's worker", bytes, args);
    const std::string ready = w->answer();
    const std::string total = field(ready, "total_bytes", w->name());
    const std::string trace = field(ready, "trace", w->name());
    if (total != std::to_string(bytes)) {
      throw std::runtime_error(w->name() + ": its device has " + total + " bytes, not " +
                               std::to_string(bytes) + " (VSR_EMU_DEVICE_MEMORY not applied?)");
    }
    if (trace != want_fp) {
      throw std::runtime_error(w->name() + ": built another trace (fingerprint " + trace +
                               ", here " + want_fp + ")");
    }
    return w;
  };
  const auto small_worker = start("8 GiB", kSmallDevice);
  const auto large_worker = start("141 GiB", kLargeDevice);
  const auto round = [](Worker& w) {
    w.request("round");
    return number(field(w.answer(), "ns_per_op", w.name()), w.name());
  };
  ScaleResult r;
  for (int i = 0; i < z.rounds; ++i) {
    progress("%s: round %d/%d", label.c_str(), i + 1, z.rounds);
    r.small.push_back(round(*small_worker));
    r.large.push_back(round(*large_worker));
    r.ratio.push_back(r.large.back() / r.small.back());
  }
  small_worker->finish();
  large_worker->finish();
  return r;
}

}  // namespace

void section_scale(Report& rep, const Trace& large, std::uint64_t large_seed, const AllocSizes& z,
                   bool quiet) {
  const std::string goal = "<= 1.1";
  const std::string metric = "pool ns per op, large trace, 141 GiB / 8 GiB emulated device";
  const std::string title =
      "== 5. Device scale: the large trace on the pool with an 8 GiB and a 141 GiB emulated "
      "device, one worker process each (the emulator reads its device size at cuInit), "
      "alternating rounds after a warm-up each; ns per call (alloc or free), median of rounds; "
      "ratio = median of per-round ratios 141/8 ==";
  if (!rep.machine.emulated) {
    const std::string why = "n/a (emulator only)";
    skipped_row(rep, metric, goal, why);
    rep.section_json("{\"section\": \"scale\", \"skipped\": " + json_string(why) + "}");
    if (!quiet) std::printf("\n== 5. Device scale: %s ==\n", why.c_str());
    return;
  }
  Table tab({"trace", "live", "steps", "rounds", "8 GiB ns/op", "141 GiB ns/op", "141/8", "min-max",
             "goal", "met"});
  ScaleResult s;
  if (run_case(rep, tab, large.name, "scale " + large.name,
               [&] { s = measure(large, large_seed, z); })) {
    const double ratio = median(s.ratio);
    const auto [lo, hi] = std::minmax_element(s.ratio.begin(), s.ratio.end());
    const std::string met = met_str(ratio, goal);
    tab.add({large.name, std::to_string(large.fill.size()), std::to_string(z.large_steps),
             std::to_string(z.rounds), fmt("%.1f", median(s.small)), fmt("%.1f", median(s.large)),
             fmt("%.3f", ratio), fmt("%.3f", *lo) + "-" + fmt("%.3f", *hi), goal, met});
    rep.summary.push_back({metric, ratio, goal, met,
                           fmt("%.1f", median(s.small)) + " vs " + fmt("%.1f", median(s.large)) +
                               " ns/op; per-round ratios " + fmt("%.3f", *lo) + "-" +
                               fmt("%.3f", *hi)});
    rep.section_json("{\"section\": \"scale\", \"trace\": " + json_string(large.name) +
                     ", \"live\": " + std::to_string(large.fill.size()) + ", \"steps\": " +
                     std::to_string(z.large_steps) + ", \"rounds\": " + std::to_string(z.rounds) +
                     ", \"small_device_bytes\": " + std::to_string(kSmallDevice) +
                     ", \"large_device_bytes\": " + std::to_string(kLargeDevice) +
                     ", \"small_device_ns_per_op\": " + json_num(median(s.small)) +
                     ", \"large_device_ns_per_op\": " + json_num(median(s.large)) +
                     ", \"ratio\": " + json_num(ratio) + ", \"ratio_min\": " + json_num(*lo) +
                     ", \"ratio_max\": " + json_num(*hi) + ", \"goal\": " + json_string(goal) +
                     ", \"met\": " + json_string(met) + "}");
  }
  if (!quiet) tab.print(title);
}

int run_scale_worker(const ScaleWorkerOptions& o) {
  g_progress = false;
  try {
    const vsr::DriverInfo info = vsr::driver_info();
    if (!info.available || info.devices.empty()) {
      throw std::runtime_error("no usable CUDA driver or device (" + info.library +
                               "): " + info.reason);
    }
    if (!info.emulated) throw std::runtime_error("not the host emulator: no device size to set");
    bind_primary_context();
    std::size_t free_bytes = 0, total_bytes = 0;
    BENCH_CU_TRY(driver().cuMemGetInfo(&free_bytes, &total_bytes));
    const Trace t = make_large_trace(o.live, o.trace_steps, o.seed);
    if (o.live == 0 || o.steps == 0 || o.steps > t.steps.size()) {
      throw std::runtime_error("bad trace: " + std::to_string(o.live) + " live, " +
                               std::to_string(o.steps) + " of " + std::to_string(t.steps.size()) +
                               " steps");
    }
    PoolAlloc pool;
    replay(pool, t, o.steps);  // the warm-up
    std::printf("%.*sready total_bytes=%zu trace=%016" PRIx64 "\n",
                static_cast<int>(kPrefix.size()), kPrefix.data(), total_bytes, fingerprint(t));
    std::fflush(stdout);
    char line[64];
    while (std::fgets(line, sizeof line, stdin) != nullptr) {
      const std::string request(line, std::strcspn(line, "\n"));
      if (request == "quit") break;
      if (request != "round") throw std::runtime_error("unknown request '" + request + "'");
      const double ns = replay(pool, t, o.steps);
      std::printf("%.*sns_per_op=%.17g\n", static_cast<int>(kPrefix.size()), kPrefix.data(), ns);
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::printf("%.*serror %s\n", static_cast<int>(kPrefix.size()), kPrefix.data(),
                vsr_cli::printable(e.what()).c_str());
    std::fflush(stdout);
    return 1;
  }
}

}  // namespace vsr_bench
