// PeerMappings (see peer_memory.h).
#include "src/exec/peer_memory.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "src/base/log.h"

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
  static const pid_t self = getpid();
  if (message.pid == self) return reinterpret_cast<const void*>(message.address);  // a rank of this process
  const SharedRegion& region = message.region;
  if (region.fd < 0 || message.address < region.base || message.bytes > region.bytes ||
      message.address - region.base > region.bytes - message.bytes)
    return nullptr;
  auto found = mappings_.find({message.pid, region.inode});
  void* local = nullptr;
  if (found != mappings_.end() && found->second.bytes >= region.bytes) {
    found->second.lastUse = Clock::now();
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
  Key key{pid, region.inode};
  if (refused_.count(pid) || failed_.count(key)) return nullptr;
  if (auto stale = mappings_.find(key); stale != mappings_.end()) {  // smaller: gives way to the larger one
    munmap(stale->second.local, stale->second.bytes);
    mappedBytes_ -= stale->second.bytes;
    mappings_.erase(stale);
  }
  if (!makeRoom(region.bytes)) return nullptr;  // CMA this time
  int pidfd = openPidfd(pid);
  int fd = pidfd >= 0 ? takeFd(pidfd, region.fd) : -1;
  int takeError = errno;
  if (pidfd >= 0) close(pidfd);
  struct stat st {};
  if (fd < 0) {
    // Not permitted (or not supported): this peer's messages are copied with CMA instead, from now on. Running
    // out of descriptors is this process's trouble, not the peer's: that file only.
    LOOM_INFO(SHM, "cannot take the buffers of process %d (%s); reading them with process_vm_readv", pid,
              strerror(takeError));
    if (takeError == EMFILE || takeError == ENFILE) {
      failed_.insert(key);
    } else {
      refused_.insert(pid);
    }
    return nullptr;
  }
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != region.inode ||
      static_cast<uint64_t>(st.st_size) < region.bytes) {
    close(fd);
    failed_.insert(key);
    return nullptr;
  }
  void* local = mmap(nullptr, region.bytes, PROT_READ | (writable_ ? PROT_WRITE : 0), MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (local == MAP_FAILED) {
    LOOM_INFO(SHM, "cannot map %llu bytes of process %d: %s", static_cast<unsigned long long>(region.bytes), pid,
              strerror(errno));
    failed_.insert(key);
    return nullptr;
  }
  // Read one byte of every page now. MAP_POPULATE fills the page tables, but where the hypervisor shadows them
  // (paravirtualised guests), the first access to each page of a new mapping still traps, at about 2 us a page:
  // a quarter of the copy rate on the first pass over a buffer. Paid once here, it stays out of the calls.
  const long page = sysconf(_SC_PAGESIZE);
  for (uint64_t at = 0; at < region.bytes; at += static_cast<uint64_t>(page))
    (void)*static_cast<volatile const char*>(static_cast<const char*>(local) + at);
  mappings_[key] = Mapping{local, region.bytes, Clock::now()};
  mappedBytes_ += region.bytes;
  return local;
}

bool PeerMappings::makeRoom(uint64_t bytes) {
  if (bytes > kMaxMappedBytes) return false;
  Clock::time_point idleSince = Clock::now() - kIdleBeforeEviction;
  while (mappings_.size() >= kMaxMappings || mappedBytes_ + bytes > kMaxMappedBytes) {
    auto oldest = mappings_.end();
    for (auto it = mappings_.begin(); it != mappings_.end(); ++it)
      if (oldest == mappings_.end() || it->second.lastUse < oldest->second.lastUse) oldest = it;
    if (oldest == mappings_.end() || oldest->second.lastUse > idleSince || writable_) return false;  // in use
    munmap(oldest->second.local, oldest->second.bytes);
    mappedBytes_ -= oldest->second.bytes;
    mappings_.erase(oldest);
  }
  return true;
}

}  // namespace loom
