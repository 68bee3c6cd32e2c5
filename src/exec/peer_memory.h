// Peers' shared buffers mapped into this process, so that a direct message whose payload sits in a peer's
// loomMemAlloc allocation is read (copied, reduced) with plain loads: no system call per message, and a
// reduction reads the peer's data where it lies instead of from a staging copy.
//
// The file is fetched from the peer with pidfd_getfd, which the kernel allows under the same rule as
// process_vm_readv (ptrace access), and the whole allocation is mapped once. A mapping keeps the peer's pages
// alive, so the cache is bounded (least recently used mappings are unmapped first) and dies with its owner.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "transports/fifo.h"

namespace loom {

class PeerMappings {
 public:
  PeerMappings() = default;
  ~PeerMappings();
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;

  // The payload of `message` in this address space: where it lies when the sender is this process, else in the
  // mapping of its allocation (made on first use); nullptr when the message names no shared region or the
  // region cannot be mapped (the caller then copies with CMA).
  const void* resolve(const DirectDescriptor& message);

  static constexpr size_t kMaxMappings = 64;
  static constexpr uint64_t kMaxMappedBytes = uint64_t{16} << 30;

 private:
  struct Mapping {
    void* local;
    uint64_t bytes;
    uint64_t lastUse;
  };
  using Key = std::pair<pid_t, uint64_t>;  // peer process, inode of the file
  void* map(const DirectDescriptor& message);
  void evictFor(uint64_t bytes);

  std::map<Key, Mapping> mappings_;
  std::set<pid_t> refused_;  // peers whose files this process may not take: CMA from then on
  uint64_t mappedBytes_ = 0;
  uint64_t uses_ = 0;
};

}  // namespace loom
