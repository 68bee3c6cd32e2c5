// Peers' shared buffers mapped into this process, so that a direct message whose payload sits in a peer's
// loomMemAlloc allocation is read (copied, reduced) with plain loads: no system call per message, and a
// reduction reads the peer's data where it lies instead of from a staging copy.
//
// The file is fetched from the peer with pidfd_getfd, which the kernel allows under the same rule as
// process_vm_readv (ptrace access), and the whole allocation is mapped once (and touched, which for a large
// allocation takes a while the first time: once per allocation and communicator). A mapping keeps the peer's
// pages alive, so the cache is bounded, and only mappings idle for a while make room for new ones: a call that
// reads more peers' memory than the cache holds would otherwise remap on every message, round robin being the
// worst case of any least-recently-used cache. A message that finds no room is read with CMA instead.
#pragma once

#include <sys/types.h>

#include <chrono>
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
  // `writable`: the mappings may be written as well (the EP low-latency windows, src/ep/low_latency.h), and are
  // never evicted: they stay until this object goes.
  explicit PeerMappings(bool writable) : writable_(writable) {}
  ~PeerMappings();
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;

  // The payload of `message` in this address space: where it lies when the sender is this process, else in the
  // mapping of its allocation (made on first use); nullptr when the message names no shared region or the
  // region cannot be mapped (the caller then copies with CMA).
  const void* resolve(const DirectDescriptor& message);

  static constexpr size_t kMaxMappings = 64;
  static constexpr uint64_t kMaxMappedBytes = uint64_t{16} << 30;
  static constexpr std::chrono::seconds kIdleBeforeEviction{2};

 private:
  using Clock = std::chrono::steady_clock;
  struct Mapping {
    void* local;
    uint64_t bytes;
    Clock::time_point lastUse;
  };
  using Key = std::pair<pid_t, uint64_t>;  // peer process, inode of the file
  void* map(const DirectDescriptor& message);
  // Unmaps idle mappings until `bytes` more fit; false when they cannot be made to fit.
  bool makeRoom(uint64_t bytes);

  std::map<Key, Mapping> mappings_;
  std::set<pid_t> refused_;  // peers whose files this process may not take: CMA from then on
  std::set<Key> failed_;     // files that could not be mapped: CMA for them
  uint64_t mappedBytes_ = 0;
  bool writable_ = false;
};

}  // namespace loom
