// SPDX-License-Identifier: Apache-2.0
// Host memory for io.hpp's up-front refusals: HostMemoryLimitError and available_host_memory.
// Built with and without GDAL.
#include <vibespatial/raster/io.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace vibespatial::raster {

HostMemoryLimitError::HostMemoryLimitError(std::uint64_t needed_bytes, std::uint64_t limit_bytes,
                                           const std::string& what)
    : std::runtime_error(what), needed_(needed_bytes), limit_(limit_bytes) {}

std::uint64_t available_host_memory() noexcept {
  const auto read_number = [](const char* path, const char* key, std::uint64_t scale,
                              std::uint64_t& out) {
    std::FILE* f = std::fopen(path, "re");
    if (f == nullptr) return false;
    char line[256];
    bool found = false;
    const std::size_t key_len = key != nullptr ? std::strlen(key) : 0;
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (key != nullptr && std::strncmp(line, key, key_len) != 0) continue;
      char* end = nullptr;
      const unsigned long long v = std::strtoull(line + key_len, &end, 10);
      if (end != line + key_len) {
        out = static_cast<std::uint64_t>(v) * scale;
        found = true;
      }
      break;
    }
    std::fclose(f);
    return found;
  };
  std::uint64_t avail = 0;
  if (!read_number("/proc/meminfo", "MemAvailable:", 1024, avail)) {
    const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    avail = pages > 0 && page > 0
                ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page)
                : 0;
  }
  // A cgroup (v2, then v1) limit below that is what this process can really use.
  std::uint64_t limit = 0, used = 0;
  if ((read_number("/sys/fs/cgroup/memory.max", nullptr, 1, limit) &&
       read_number("/sys/fs/cgroup/memory.current", nullptr, 1, used)) ||
      (read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes", nullptr, 1, limit) &&
       read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes", nullptr, 1, used))) {
    avail = std::min(avail, limit > used ? limit - used : 0);
  }
  return avail;
}

}  // namespace vibespatial::raster
