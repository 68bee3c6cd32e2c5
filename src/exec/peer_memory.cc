// PeerMappings (see peer_memory.h).
#include "src/exec/peer_memory.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "src/core/log.h"

namespace loom {
namespace {

int openPidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

// A descriptor of this process for file `fd` of the process behind `pidfd`.
int takeFd(int pidfd, int fd) {
#ifdef SYS_pidfd_getfd
  return static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

PeerMappings::~PeerMappings() {
  for (auto& [key, mapping] : mappings_) munmap(mapping.local, mapping.bytes);
}

const void* PeerMappings::resolve(const DirectDescriptor& message) {
  if (message.pid == getpid()) return reinterpret_cast<const void*>(message.address);  // a rank of this process
  const SharedRegion& region = message.region;
  if (region.fd < 0 || message.address < region.base || message.bytes > region.bytes ||
      message.address - region.base > region.bytes - message.bytes)
    return nullptr;
  auto found = mappings_.find({message.pid, region.inode});
  void* local = nullptr;
  if (found != mappings_.end() && found->second.bytes >= region.bytes) {
    found->second.lastUse = ++uses_;
    local = found->second.local;
  } else {
    local = map(message);
    if (local == nullptr) return nullptr;
  }
  return static_cast<const std::byte*>(local) + (message.address - region.base);
}

void* PeerMappings::map(const DirectDescriptor& message) {
  const SharedRegion& region = message.region;
  pid_t pid = message.pid;
  if (refused_.count(pid)) return nullptr;
  int pidfd = openPidfd(pid);
  int fd = pidfd >= 0 ? takeFd(pidfd, region.fd) : -1;
  if (pidfd >= 0) close(pidfd);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != region.inode ||
      static_cast<uint64_t>(st.st_size) < region.bytes) {
    // Not permitted (or not supported): this peer's messages are copied with CMA instead, from now on.
    LOOM_INFO(SHM, "cannot map the buffers of process %d (%s); reading them with process_vm_readv", pid,
              fd < 0 ? strerror(errno) : "file changed");
    if (fd >= 0) close(fd);
    refused_.insert(pid);
    return nullptr;
  }
  evictFor(region.bytes);
  void* local = mmap(nullptr, region.bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (local == MAP_FAILED) {
    LOOM_INFO(SHM, "cannot map %llu bytes of process %d: %s", static_cast<unsigned long long>(region.bytes), pid,
              strerror(errno));
    return nullptr;
  }
  // Read one byte of every page now. MAP_POPULATE fills the page tables, but where the hypervisor shadows them
  // (paravirtualised guests), the first access to each page of a new mapping still traps, at about 2 us a page:
  // a quarter of the copy rate on the first pass over a buffer. Paid once here, it stays out of the calls.
  const long page = sysconf(_SC_PAGESIZE);
  for (uint64_t at = 0; at < region.bytes; at += static_cast<uint64_t>(page))
    (void)*static_cast<volatile const char*>(static_cast<const char*>(local) + at);
  auto [it, fresh] = mappings_.insert({{pid, region.inode}, Mapping{local, region.bytes, ++uses_}});
  if (!fresh) {  // a smaller, older mapping of the same file: replace it
    munmap(it->second.local, it->second.bytes);
    mappedBytes_ -= it->second.bytes;
    it->second = Mapping{local, region.bytes, uses_};
  }
  mappedBytes_ += region.bytes;
  return local;
}

void PeerMappings::evictFor(uint64_t bytes) {
  while (!mappings_.empty() && (mappings_.size() >= kMaxMappings || mappedBytes_ + bytes > kMaxMappedBytes)) {
    auto oldest = mappings_.begin();
    for (auto it = mappings_.begin(); it != mappings_.end(); ++it)
      if (it->second.lastUse < oldest->second.lastUse) oldest = it;
    munmap(oldest->second.local, oldest->second.bytes);
    mappedBytes_ -= oldest->second.bytes;
    mappings_.erase(oldest);
  }
}

}  // namespace loom
