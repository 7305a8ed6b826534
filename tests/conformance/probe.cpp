// SPDX-License-Identifier: Apache-2.0
// Written from the ideas of the §10 probe program; it leaves out the double cuMemRelease (§10 l),
// which is undefined behaviour on the real driver.
#include "probe.hpp"

#include "harness.hpp"

#include <cuda.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace vsr_conf {
namespace {

void line(const char* label, CUresult r, const char* fmt = nullptr, ...) {
  std::printf("%-60s = %4d %s", label, static_cast<int>(r), error_name(r).c_str());
  if (fmt != nullptr) {
    std::printf(" ");
    va_list ap;
    va_start(ap, fmt);
    std::vprintf(fmt, ap);
    va_end(ap);
  }
  std::printf("\n");
}

void free_line(const char* label) {
  std::size_t f = 0;
  std::size_t t = 0;
  const CUresult r = cu().cuMemGetInfo(&f, &t);
  line(label, r, "free=%zu total=%zu", f, t);
}

void probe_preinit() {
  const PreInit& p = env().pre;
  line("(j) preinit cuDriverGetVersion", p.driver_get_version, "v=%d", p.driver_version);
  line("(j) preinit cuDeviceGetCount", p.device_get_count);
  line("(j) preinit cuCtxGetCurrent", p.ctx_get_current, "wrote=%d",
       static_cast<int>(p.ctx_get_current_wrote));
  line("(j) preinit cuCtxGetDevice", p.ctx_get_device);
}

void probe_gpa() {
  const Driver& d = cu();
  void* pfn = reinterpret_cast<void*>(1);
  auto st = static_cast<CUdriverProcAddressQueryResult>(77);
  {
    const CUresult r_ = d.cuGetProcAddress_v2("cuMemAlloc_v2", &pfn, 12000, 0, &st);
    line("(i) gpa versioned name cuMemAlloc_v2", r_, "pfn=%p st=%d", pfn, static_cast<int>(st));
  }
  line("(i) gpa NULL pfn", d.cuGetProcAddress_v2("cuMemAlloc", nullptr, 12000, 0, nullptr));
  line("(i) gpa NULL symbol", d.cuGetProcAddress_v2(nullptr, &pfn, 12000, 0, nullptr));
  pfn = reinterpret_cast<void*>(1);
  {
    const CUresult r_ = d.cuGetProcAddress_v2("cuMemAlloc", &pfn, 12000, 4, nullptr);
    line("(i) gpa flags=4", r_, "pfn=%p", pfn);
  }
  void* a = nullptr;
  void* b = nullptr;
  const CUresult ra = d.cuGetProcAddress_v2("cuCtxSynchronize", &a, 12090, 0, nullptr);
  const CUresult rb = d.cuGetProcAddress_v2("cuCtxSynchronize", &b, 13000, 0, nullptr);
  line("(i) gpa cuCtxSynchronize@12090", ra, "is_v1=%d",
       static_cast<int>(a == d.exported("cuCtxSynchronize")));
  line("(i) gpa cuCtxSynchronize@13000", rb, "is_v2=%d",
       static_cast<int>(b != nullptr && b == d.exported("cuCtxSynchronize_v2")));
  void* m = nullptr;
  d.cuGetProcAddress_v2("cuMemAlloc", &m, 3020, 0, nullptr);
  std::printf("(i) gpa cuMemAlloc@3020 == dlsym(cuMemAlloc_v2): %d\n",
              static_cast<int>(m == d.exported("cuMemAlloc_v2")));
  auto legacy = reinterpret_cast<PFN_cuGetProcAddress_v11030>(d.exported("cuGetProcAddress"));
  if (legacy != nullptr) {
    pfn = reinterpret_cast<void*>(1);
    {
      const CUresult r_ = legacy("cuNoSuchEntryPoint", &pfn, 11030, 0);
      line("(i) gpa 4-arg unknown symbol", r_, "pfn=%p", pfn);
    }
  }
}

void probe_no_context() {
  std::thread t([] {
    const std::size_t G = env().gran;
    std::size_t g = 0;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    line("(a) noctx cuMemGetAllocationGranularity",
         cu().cuMemGetAllocationGranularity(&g, &env().prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    line("(a) noctx cuMemCreate", cu().cuMemCreate(&h, G, &env().prop, 0));
    line("(a) noctx cuMemAddressReserve", cu().cuMemAddressReserve(&va, G, 0, 0, 0));
    if (h != 0 && va != 0) {
      const CUmemAccessDesc d = access_desc();
      line("(a) noctx cuMemMap", cu().cuMemMap(va, G, 0, h, 0));
      line("(a) noctx cuMemSetAccess", cu().cuMemSetAccess(va, G, &d, 1));
      line("(a) noctx cuMemUnmap", cu().cuMemUnmap(va, G));
    }
    if (h != 0) line("(a) noctx cuMemRelease", cu().cuMemRelease(h));
    if (va != 0) line("(a) noctx cuMemAddressFree", cu().cuMemAddressFree(va, G));
  });
  t.join();
}

void probe_granularity() {
  std::size_t mn = 0;
  std::size_t rc = 0;
  CUmemAllocationProp q = env().prop;
  {
    const CUresult r_ =
        cu().cuMemGetAllocationGranularity(&mn, &q, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    line("(f) granularity device min", r_, "%zu", mn);
  }
  {
    const CUresult r_ =
        cu().cuMemGetAllocationGranularity(&rc, &q, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    line("(f) granularity device rec", r_, "%zu", rc);
  }
  q.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  mn = 0;
  {
    const CUresult r_ =
        cu().cuMemGetAllocationGranularity(&mn, &q, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    line("(f) granularity device +POSIX_FD min", r_, "%zu", mn);
  }
  q = env().prop;
  q.location.type = CU_MEM_LOCATION_TYPE_HOST;
  q.location.id = 0;
  mn = 0;
  {
    const CUresult r_ =
        cu().cuMemGetAllocationGranularity(&mn, &q, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    line("(f) granularity HOST min", r_, "%zu", mn);
  }
  q.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  mn = 0;
  {
    const CUresult r_ =
        cu().cuMemGetAllocationGranularity(&mn, &q, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    line("(f) granularity HOST_NUMA(0) min", r_, "%zu", mn);
  }
}

void probe_reserve() {
  const std::size_t G = env().gran;
  const std::size_t pg = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  CUdeviceptr a = 0;
  {
    const CUresult r_ = cu().cuMemAddressReserve(&a, pg, 0, 0, 0);
    line("(e) reserve size=pagesize", r_, "ptr%%G=%llu", static_cast<unsigned long long>(a % G));
  }
  if (a != 0) cu().cuMemAddressFree(a, pg);
  a = 0;
  line("(e) reserve size=pagesize+1", cu().cuMemAddressReserve(&a, pg + 1, 0, 0, 0));
  if (a != 0) cu().cuMemAddressFree(a, pg + 1);
  a = 0;
  line("(e) reserve flags=1", cu().cuMemAddressReserve(&a, G, 0, 0, 1));
  if (a != 0) cu().cuMemAddressFree(a, G);
  a = 0;
  {
    const CUresult r_ = cu().cuMemAddressReserve(&a, G, 1ull << 30, 0, 0);
    line("(e) reserve align=1GiB", r_, "aligned=%d", static_cast<int>(a % (1ull << 30) == 0));
  }
  if (a != 0) cu().cuMemAddressFree(a, G);
  a = 0;
  {
    const CUresult r_ = cu().cuMemAddressReserve(&a, 4 * G, 0, 0, 0);
    line("(e) reserve 4G default alignment", r_, "ptr%%G=%llu ptr%%2G=%llu",
         static_cast<unsigned long long>(a % G), static_cast<unsigned long long>(a % (2 * G)));
  }
  CUdeviceptr b = 0;
  {
    const CUresult r_ = cu().cuMemAddressReserve(&b, 2 * G, 0, a + 4 * G, 0);
    line("(e) reserve hint=a+4G (free?)", r_, "honoured=%d", static_cast<int>(b == a + 4 * G));
  }
  CUdeviceptr c = 0;
  {
    const CUresult r_ = cu().cuMemAddressReserve(&c, G, 0, a, 0);
    line("(e) reserve hint=a (occupied)", r_, "moved=%d", static_cast<int>(c != a));
  }
  if (c != 0 && c != a) cu().cuMemAddressFree(c, G);
  if (b != 0) cu().cuMemAddressFree(b, 2 * G);
  if (a != 0) cu().cuMemAddressFree(a, 4 * G);
}

void probe_map_access_unmap() {
  const std::size_t G = env().gran;
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  CUmemGenericAllocationHandle h1 = 0;
  CUmemGenericAllocationHandle h2 = 0;
  if (cu().cuMemAddressReserve(&a, 4 * G, 0, 0, 0) != CUDA_SUCCESS) return;
  cu().cuMemAddressReserve(&b, 2 * G, 0, a + 4 * G, 0);
  const bool adjacent = b == a + 4 * G;
  cu().cuMemCreate(&h1, 2 * G, &env().prop, 0);
  cu().cuMemCreate(&h2, G, &env().prop, 0);
  const CUmemAccessDesc rw = access_desc();
  line("(b) map partial (G of a 2G handle, offset 0)", cu().cuMemMap(a, G, 0, h1, 0));
  cu().cuMemUnmap(a, G);
  line("(b) map offset=G (G of a 2G handle)", cu().cuMemMap(a, G, G, h1, 0));
  cu().cuMemUnmap(a, G);
  line("(b) map offset+size > handle", cu().cuMemMap(a, 2 * G, G, h1, 0));
  line("(b) map h1 whole at a", cu().cuMemMap(a, 2 * G, 0, h1, 0));
  line("(b) map overlapping the h1 mapping", cu().cuMemMap(a + G, G, 0, h2, 0));
  if (adjacent) {
    const CUresult r = cu().cuMemMap(a + 3 * G, 2 * G, 0, h1, 0);
    line("(b) map straddling adjacent reservations", r);
    if (r == CUDA_SUCCESS) cu().cuMemUnmap(a + 3 * G, 2 * G);
  } else {
    std::printf("(b) map straddling adjacent reservations: hint not honoured, not probed\n");
  }
  line("(b) map h2 at a+2G", cu().cuMemMap(a + 2 * G, G, 0, h2, 0));
  line("(c) setaccess sub-range of one mapping [a, a+G)", cu().cuMemSetAccess(a, G, &rw, 1));
  line("(c) setaccess range with a gap [a, a+4G)", cu().cuMemSetAccess(a, 4 * G, &rw, 1));
  line("(c) setaccess count=0", cu().cuMemSetAccess(a, 2 * G, &rw, 0));
  line("(c) setaccess desc=NULL", cu().cuMemSetAccess(a, 2 * G, nullptr, 1));
  line("(c) setaccess two mappings [a, a+3G)", cu().cuMemSetAccess(a, 3 * G, &rw, 1));
  line("(g) cuMemFree on a VMM address", cu().cuMemFree(a));
  free_line("(d) free memory before addressfree probes");
  line("(d) addressfree wrong size (a, 2G)", cu().cuMemAddressFree(a, 2 * G));
  line("(b) unmap [a, a+3G) two mappings", cu().cuMemUnmap(a, 3 * G));
  if (adjacent) {
    const CUresult r = cu().cuMemAddressFree(a, 6 * G);
    line("(d) addressfree spanning adjacent reservations", r);
    if (r == CUDA_SUCCESS) a = b = 0;
  }
  // Live mapping at a (h2) when a's reservation is freed: the last probe on this reservation.
  if (a != 0 && cu().cuMemMap(a, G, 0, h2, 0) == CUDA_SUCCESS) {
    const CUresult r = cu().cuMemAddressFree(a, 4 * G);
    line("(d) addressfree with a live mapping", r);
    if (r != CUDA_SUCCESS) {
      cu().cuMemUnmap(a, G);
      cu().cuMemAddressFree(a, 4 * G);
    }
  }
  if (b != 0) cu().cuMemAddressFree(b, 2 * G);
  cu().cuMemRelease(h1);
  cu().cuMemRelease(h2);
  free_line("(d) free memory after releasing both handles");
}

void probe_free_and_streams() {
  CUdeviceptr m = 0;
  if (cu().cuMemAlloc(&m, 4096) == CUDA_SUCCESS) {
    line("(g) cuMemFree interior pointer", cu().cuMemFree(m + 16));
    line("(g) cuMemFree", cu().cuMemFree(m));
    line("(g) cuMemFree double", cu().cuMemFree(m));
  }
  line("(k) cuStreamDestroy(NULL)", cu().cuStreamDestroy(nullptr));
  CUevent e = nullptr;
  const CUresult re = cu().cuEventCreate(&e, CU_EVENT_INTERPROCESS);
  line("(k) cuEventCreate(INTERPROCESS) alone", re);
  if (re == CUDA_SUCCESS) cu().cuEventDestroy(e);
  CUstream s = nullptr;
  if (cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
    CUdeviceptr p = 0;
    const CUresult r = cu().cuMemAllocAsync(&p, 0, s);
    line("(k) cuMemAllocAsync 0 bytes", r, "ptr=%llu", static_cast<unsigned long long>(p));
    if (r == CUDA_SUCCESS && p != 0) cu().cuMemFreeAsync(p, s);
    cu().cuStreamSynchronize(s);
    cu().cuStreamDestroy(s);
  }
}

// cuMemGetAddressRange where the emulator's answer is its own strict choice (§3.4.10, §10 (p)).
void probe_address_range() {
  CUdeviceptr base = 0;
  std::size_t size = 0;
  CUdeviceptr m = 0;
  if (cu().cuMemAlloc(&m, 1000) == CUDA_SUCCESS) {
    const CUresult r = cu().cuMemGetAddressRange(&base, &size, m + 999);
    line("(p) cuMemGetAddressRange of cuMemAlloc(1000)", r, "base=+%lld size=%zu",
         static_cast<long long>(base - m), size);
    cu().cuMemFree(m);
    line("(p) cuMemGetAddressRange after cuMemFree", cu().cuMemGetAddressRange(&base, &size, m));
  }
  void* pinned = nullptr;
  if (cu().cuMemHostAlloc(&pinned, 4096, 0) == CUDA_SUCCESS) {
    size = 0;
    const CUresult r =
        cu().cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(pinned));
    line("(p) cuMemGetAddressRange of pinned host memory", r, "size=%zu", size);
    cu().cuMemFreeHost(pinned);
  }
  int on_stack = 0;
  line("(p) cuMemGetAddressRange of a stack address",
       cu().cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(&on_stack)));
  CUstream s = nullptr;
  if (cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
    CUdeviceptr p = 0;
    if (cu().cuMemAllocAsync(&p, 1 << 20, s) == CUDA_SUCCESS) {
      cu().cuMemFreeAsync(p, s);
      line("(p) cuMemGetAddressRange once cuMemFreeAsync is queued",
           cu().cuMemGetAddressRange(&base, &size, p));
    }
    cu().cuStreamSynchronize(s);
    cu().cuStreamDestroy(s);
  }
}

// Spans across the boundary of two adjacent reservations, each mapped at the seam (§4 invariant
// 1; the emulator rejects them).
void probe_spans() {
  const std::size_t G = env().gran;
  CUdeviceptr area = 0;
  if (cu().cuMemAddressReserve(&area, 4 * G, 0, 0, 0) != CUDA_SUCCESS) return;
  cu().cuMemAddressFree(area, 4 * G);
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  cu().cuMemAddressReserve(&a, 2 * G, 0, area, 0);
  cu().cuMemAddressReserve(&b, 2 * G, 0, a + 2 * G, 0);
  if (a == 0 || b != a + 2 * G) {
    std::printf("(m) spans across reservations: hints not honoured, not probed\n");
  } else {
    CUmemGenericAllocationHandle ha = 0;
    CUmemGenericAllocationHandle hb = 0;
    cu().cuMemCreate(&ha, G, &env().prop, 0);
    cu().cuMemCreate(&hb, G, &env().prop, 0);
    const CUmemAccessDesc rw = access_desc();
    cu().cuMemMap(a + G, G, 0, ha, 0);
    cu().cuMemMap(b, G, 0, hb, 0);
    line("(m) setaccess spanning adjacent reservations", cu().cuMemSetAccess(a + G, 2 * G, &rw, 1));
    const CUresult r = cu().cuMemUnmap(a + G, 2 * G);
    line("(m) unmap spanning adjacent reservations", r);
    if (r != CUDA_SUCCESS) {
      cu().cuMemUnmap(a + G, G);
      cu().cuMemUnmap(b, G);
    }
    cu().cuMemRelease(ha);
    cu().cuMemRelease(hb);
  }
  if (b != 0) cu().cuMemAddressFree(b, 2 * G);
  if (a != 0) cu().cuMemAddressFree(a, 2 * G);
}

// Calls on a created stream and an event from a thread with no current context (§1.2; the
// emulator's REQUIRE_CONTEXT mode says INVALID_CONTEXT).
void probe_stream_no_context() {
  CUstream s = nullptr;
  CUevent e = nullptr;
  if (cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return;
  if (cu().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    cu().cuStreamDestroy(s);
    return;
  }
  bool stream_gone = false;
  bool event_gone = false;
  std::thread t([&] {
    line("(n) noctx cuStreamQuery(created)", cu().cuStreamQuery(s));
    line("(n) noctx cuStreamSynchronize(created)", cu().cuStreamSynchronize(s));
    line("(n) noctx cuEventRecord(e, created)", cu().cuEventRecord(e, s));
    line("(n) noctx cuEventQuery", cu().cuEventQuery(e));
    line("(n) noctx cuEventSynchronize", cu().cuEventSynchronize(e));
    line("(n) noctx cuStreamWaitEvent(created, e)", cu().cuStreamWaitEvent(s, e, 0));
    line("(n) noctx cuStreamSynchronize(NULL)", cu().cuStreamSynchronize(nullptr));
    const CUresult re = cu().cuEventDestroy(e);
    line("(n) noctx cuEventDestroy", re);
    event_gone = re == CUDA_SUCCESS;
    const CUresult rs = cu().cuStreamDestroy(s);
    line("(n) noctx cuStreamDestroy", rs);
    stream_gone = rs == CUDA_SUCCESS;
  });
  t.join();
  if (!event_gone) cu().cuEventDestroy(e);
  if (!stream_gone) cu().cuStreamDestroy(s);
}

// §10 h: one device access to unusable VA, then what the context says afterwards.
void sticky_probe(int which) {
  const std::size_t G = env().gran;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  cu().cuMemAddressReserve(&va, 2 * G, 0, 0, 0);
  cu().cuMemCreate(&h, G, &env().prop, 0);
  cu().cuMemMap(va, G, 0, h, 0);
  unsigned char buf[16] = {1};
  const char* label = "";
  CUresult r = CUDA_SUCCESS;
  switch (which) {
    case 0:
      label = "(h) HtoD into reserved-unmapped";
      r = cu().cuMemcpyHtoD(va + G, buf, sizeof buf);
      break;
    case 1:
      label = "(h) memsetD8 into reserved-unmapped";
      r = cu().cuMemsetD8(va + G, 0, 16);
      break;
    case 2:
      label = "(h) HtoD into mapped-without-access";
      r = cu().cuMemcpyHtoD(va, buf, sizeof buf);
      break;
    case 4:
      label = "(o) memsetD8 into mapped-without-access, then VMM calls";
      r = cu().cuMemsetD8(va, 0, 16);
      break;
    default:
      label = "(h) memsetD8 into mapped-without-access";
      r = cu().cuMemsetD8(va, 0, 16);
      break;
  }
  line(label, r);
  line("    then cuCtxSynchronize", cu().cuCtxSynchronize());
  CUdeviceptr p = 0;
  line("    then cuMemAlloc", cu().cuMemAlloc(&p, 1024));
  line("    then cuCtxSynchronize again", cu().cuCtxSynchronize());
  if (which != 4) return;
  // VMM calls after the sticky error (cuda.h \notefnerr): which report it, and whether they
  // did their work anyway. Each handle is released once only, whatever the answer.
  CUmemGenericAllocationHandle h2 = 0;
  CUdeviceptr va2 = 0;
  const CUresult rc = cu().cuMemCreate(&h2, G, &env().prop, 0);
  line("(o) after sticky: cuMemCreate", rc, "handle=%llu", static_cast<unsigned long long>(h2));
  const CUresult rr = cu().cuMemAddressReserve(&va2, G, 0, 0, 0);
  line("(o) after sticky: cuMemAddressReserve", rr, "ptr!=0: %d", static_cast<int>(va2 != 0));
  if (h2 != 0 && va2 != 0) {
    const CUmemAccessDesc rw = access_desc();
    line("(o) after sticky: cuMemMap", cu().cuMemMap(va2, G, 0, h2, 0));
    line("(o) after sticky: cuMemSetAccess", cu().cuMemSetAccess(va2, G, &rw, 1));
    line("(o) after sticky: cuMemUnmap", cu().cuMemUnmap(va2, G));
    line("(o) after sticky: cuMemUnmap again (was it unmapped?)", cu().cuMemUnmap(va2, G));
  }
  if (h2 != 0) line("(o) after sticky: cuMemRelease", cu().cuMemRelease(h2));
  if (va2 != 0) line("(o) after sticky: cuMemAddressFree", cu().cuMemAddressFree(va2, G));
  line("(o) after sticky: cuMemUnmap of the mapping made before", cu().cuMemUnmap(va, G));
  line("(o) after sticky: cuMemRelease of the handle made before", cu().cuMemRelease(h));
}

}  // namespace

int run_probe() {
  std::printf("vsr-conformance --probe: %s, driver version %d, granularity %zu\n",
              cu().path.c_str(), env().driver_version, env().gran);
  probe_preinit();
  probe_gpa();
  probe_no_context();
  probe_granularity();
  probe_reserve();
  probe_free_and_streams();
  probe_address_range();
  probe_stream_no_context();
  probe_map_access_unmap();
  probe_spans();
  return 0;
}

int run_probe_sticky(int (*start_driver)()) {
  int last = 0;
  for (int which = 0; which < 5; ++which) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      const int started = start_driver();
      if (started == 0) sticky_probe(which);
      std::fflush(nullptr);
      std::_Exit(started);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    last = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  }
  return last;
}

}  // namespace vsr_conf
