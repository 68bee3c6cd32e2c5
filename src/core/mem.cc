// loomMemAlloc / loomMemFree and buffer registration.
//
// loomMemAlloc hands out memory backed by a memfd, mapped shared, so that a peer process on the same host can map
// the very same pages (zero-copy) rather than receive a copy. Registration (loomCommRegister) records a region on
// a communicator; handles are checked, so a bad handle is an argument error.
#include "src/core/mem.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>

#include "src/base/check.h"
#include "src/core/comm.h"

namespace loom {
namespace {

struct Allocation {
  int fd;
  size_t bytes;
  uint64_t inode;
  bool shareable = true;
};

std::mutex gAllocMutex;
std::map<void*, Allocation>& allocations() {
  static std::map<void*, Allocation> table;
  return table;
}

bool inside(const void* base, size_t size, const void* ptr, size_t bytes) {
  auto b = reinterpret_cast<uintptr_t>(base), p = reinterpret_cast<uintptr_t>(ptr);
  return p >= b && bytes <= size && p - b <= size - bytes;
}

}  // namespace

// Called with comm->runMutex held (from planning a call).
bool isRegistered(loomComm* comm, const void* ptr, size_t bytes) {
  if (ptr == nullptr || bytes == 0) return false;
  for (const auto& [base, size] : comm->registrations)
    if (inside(base, size, ptr, bytes)) return true;
  return sharedRegionOf(ptr, bytes).base != 0;  // inside a loomMemAlloc allocation
}

SharedRegion sharedRegionOf(const void* ptr, size_t bytes) {
  if (ptr == nullptr || bytes == 0) return {};
  std::lock_guard<std::mutex> lock(gAllocMutex);
  auto& table = allocations();
  auto found = table.upper_bound(const_cast<void*>(ptr));
  if (found == table.begin()) return {};
  --found;
  const auto& [base, allocation] = *found;
  if (!inside(base, allocation.bytes, ptr, bytes)) return {};
  return SharedRegion{allocation.shareable ? allocation.fd : -1, reinterpret_cast<uint64_t>(base), allocation.bytes,
                      allocation.inode};
}

}  // namespace loom

using namespace loom;

loomResult_t loomMemAlloc(void** ptr, size_t size) {
  clearThreadLastError();
  if (ptr == nullptr) return LOOM_FAIL(loomInvalidArgument, INIT, "loomMemAlloc: ptr is NULL");
  if (size == 0) return LOOM_FAIL(loomInvalidArgument, INIT, "loomMemAlloc: size is 0");
  int fd = memfd_create("loom-mem", MFD_CLOEXEC);
  if (fd < 0) return LOOM_FAIL(loomSystemError, INIT, "loomMemAlloc: memfd_create failed: %m");
  // Reserve and map every page now: a shortage of memory fails here, with a message, rather than as a SIGBUS at
  // first touch; and a collective never pays the page faults of its buffers (a fault of a shared page costs
  // about as much as copying it, which would halve the bandwidth of a first call).
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(size)); err != 0) {
    close(fd);
    errno = err;
    return LOOM_FAIL(loomSystemError, INIT, "loomMemAlloc: cannot reserve %zu bytes: %m", size);
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    close(fd);
    return LOOM_FAIL(loomSystemError, INIT, "loomMemAlloc: cannot map %zu bytes: %m", size);
  }
  std::lock_guard<std::mutex> lock(gAllocMutex);
  // Without its inode a peer could not check the file it takes, so such memory is not shared (fd -1).
  struct stat st {};
  bool known = fstat(fd, &st) == 0;
  allocations()[base] = {fd, size, known ? static_cast<uint64_t>(st.st_ino) : 0};
  if (!known) allocations()[base].shareable = false;
  *ptr = base;
  return loomSuccess;
}

loomResult_t loomMemFree(void* ptr) {
  clearThreadLastError();
  if (ptr == nullptr) return loomSuccess;
  std::lock_guard<std::mutex> lock(gAllocMutex);
  auto found = allocations().find(ptr);
  if (found == allocations().end())
    return LOOM_FAIL(loomInvalidArgument, INIT, "loomMemFree: %p was not returned by loomMemAlloc", ptr);
  munmap(ptr, found->second.bytes);
  close(found->second.fd);
  allocations().erase(found);
  return loomSuccess;
}

loomResult_t loomCommRegister(const loomComm_t comm, void* buff, size_t size, void** handle) {
  clearThreadLastError();
  if (comm == nullptr || buff == nullptr || handle == nullptr || size == 0)
    return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommRegister: comm, buff and handle must be non-NULL, size > 0");
  std::lock_guard<std::mutex> lock(comm->runMutex);
  comm->registrations.push_back({buff, size});
  *handle = buff;
  return loomSuccess;
}

loomResult_t loomCommDeregister(const loomComm_t comm, void* handle) {
  clearThreadLastError();
  if (comm == nullptr) return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommDeregister: comm is NULL");
  std::lock_guard<std::mutex> lock(comm->runMutex);
  for (auto it = comm->registrations.begin(); it != comm->registrations.end(); ++it) {
    if (it->first == handle) {
      comm->registrations.erase(it);
      return loomSuccess;
    }
  }
  return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommDeregister: %p is not a registration of this communicator",
                   handle);
}
