// softib's fabric: the tables that the processes of one machine share, in one file under LOOM_SOFTIB_DIR, so that
// a queue pair in one process can find its peer in another, check its keys, take its posted receives and push
// completions into its completion queue.
//
// The file holds fixed-size tables of queue pairs, memory regions, completion queues (with their rings of
// completions) and completion channels, and one robust process-shared mutex. Every entry records the process that
// owns it; entries of processes that have died are reclaimed lazily, when a table is full and when a process
// first opens the fabric. Identifiers (qp numbers, keys, CQ and channel ids) carry their slot in their low bits
// and a value of a shared counter above it, so a stale identifier does not match a reused slot. Work queues of
// sends and the verbs objects themselves live in the owning process (softib.cc); nothing here moves data.
//
// A real HCA goes on whatever the processes using it do; here the processes are the HCA, and any of them can be
// stopped (SIGSTOP, a debugger) at any instruction, holding whatever it holds. So that a stopped process blocks no
// other thread, the mutex guards only the data path (a write: checking the responder and keys, taking a receive,
// moving the bytes, pushing the completions), and a thread that finds it held by a stopped process does not wait:
// its write waits in its queue and goes out at a later poll, as if the network were slow. (Writes, every
// process's, wait so until the holder runs again or dies: the callers' deadlines end their waits.) Everything
// else works without the mutex: entries are claimed and released with atomics (claim(), release()), and a
// released entry is reused only once every critical section that could have seen it has ended (the lock epoch,
// below). A memory region is deregistered without the mutex too; the one write that may be landing in it at that
// moment is announced in the header (writingRkey), and deregMr waits for it, or fails with EBUSY when its writer is
// stopped. A holder that is not stopped but makes no progress (a frozen cgroup) is waited for kLockPatienceMs at
// each try: bounded, not instant.
#pragma once

#include <infiniband/verbs.h>
#include <pthread.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::softib {

constexpr int kGidCount = 2;  // per port: the host's link-local GID and the IPv4-mapped one
constexpr uint32_t kQpSlotBits = 11;
constexpr uint32_t kMrSlotBits = 13;
constexpr uint32_t kCqSlotBits = 9;
constexpr uint32_t kChannelSlotBits = 9;
constexpr uint32_t kMaxQps = 1u << kQpSlotBits;
constexpr uint32_t kMaxMrs = 1u << kMrSlotBits;
constexpr uint32_t kMaxCqs = 1u << kCqSlotBits;
constexpr uint32_t kMaxChannels = 1u << kChannelSlotBits;
constexpr uint32_t kMaxWr = 1024;        // per work queue (the receive queue's ring is this deep)
constexpr uint32_t kMaxCqe = 4096;       // per completion queue
constexpr uint32_t kRkeyBit = 1u << 31;  // set in rkeys, clear in lkeys: a key used on the wrong side fails

// One completion as it waits in a ring: the fields of ibv_wc that RDMA writes produce, plus what the owner needs
// to free its send queue's slots.
struct Cqe {
  uint64_t wrId;
  uint32_t byteLen;
  uint32_t immData;  // network order, as posted
  uint32_t qpNum;
  uint32_t srcQp;
  uint16_t sqRelease;  // send-queue slots this completion frees once polled (0 for receives)
  uint8_t status;      // ibv_wc_status
  uint8_t opcode;      // ibv_wc_opcode
  uint8_t wcFlags;
};
static_assert(sizeof(Cqe) == 32);

// Every table's entries begin with their pid word (pidWordOwner()): 0 when free, the owner's pid in use, minus it
// while the owner initialises a claimed entry, kReleasing | the releaser's pid while it is freed (lookups skip
// both), then the lock epoch at which it was last released (it may be claimed again once the epoch is past it).
struct QpSlot {
  int32_t pid;
  uint64_t freedEpoch;
  uint32_t qpNum;
  uint64_t pdId;
  uint32_t state;        // ibv_qp_state
  uint32_t accessFlags;  // the QP's qp_access_flags: remote writes need IBV_ACCESS_REMOTE_WRITE
  uint32_t sendCqId;
  uint32_t recvCqId;
  // Set by the owner while its first send work request waits for this QP's responder (RNR, or no responder yet);
  // cleared by whoever posts a receive there or brings it to RTR, who also wakes the owner (ChannelSignals::wake),
  // and by the requester itself once it goes on (and by a reset). The requester sets it, then looks at the
  // responder again; the responder's owner changes the responder, then looks at it (both ordered): one of them
  // sees the other.
  uint32_t waiting;
  uint32_t destQpNum;  // from RTR on
  ibv_gid portGids[kGidCount];
  ibv_gid dgid;
  ibv_gid sgid;
  uint8_t minRnrTimer;
  uint8_t pad[3];
  // Receive queue: wr_ids the owner posted, taken in order by the peer's writes with immediate. head and tail
  // count from 0 for ever; the ring is maxRecvWr entries of recvWrIds.
  uint32_t maxRecvWr;
  uint64_t recvHead;
  uint64_t recvTail;
  uint64_t recvWrIds[kMaxWr];
};

struct MrSlot {
  int32_t pid;
  uint64_t freedEpoch;
  uint32_t lkey;
  uint32_t rkey;
  uint32_t access;
  uint64_t pdId;
  uint64_t addr;
  uint64_t length;
};

struct CqSlot {
  int32_t pid;
  uint64_t freedEpoch;
  uint32_t id;
  uint32_t capacity;
  uint32_t channelId;  // 0: none
  // 0, kArmedAll or kArmedSolicited: the next (solicited) completion signals the channel. Set by the owner without
  // the mutex, then it polls once more; a pusher publishes the tail (a waker, the requester's `waiting`), then
  // looks (both behind a full fence), so that either the owner's poll sees the work or the other sees the arming.
  uint32_t armed;
  uint32_t overrun;  // a completion found the ring full and was lost
  // Written by pushers under the fabric's mutex and read by the owner without it (tail), and the other way round
  // (head); both count from 0 for ever.
  alignas(64) uint64_t tail;
  alignas(64) uint64_t head;
  Cqe ring[kMaxCqe];
};
constexpr uint32_t kArmedAll = 1;
constexpr uint32_t kArmedSolicited = 2;

struct ChannelSlot {
  int32_t pid;
  uint64_t freedEpoch;
  uint32_t id;
};

struct Header {
  uint64_t magic;
  uint64_t bytes;
  pthread_mutex_t mutex;  // robust and process-shared: the data path's critical sections
  uint32_t nextSeq;       // source of the counter part of identifiers (atomic)
  uint64_t nextPdId;      // (atomic)
  // Raised by every holder of the mutex as it takes it: an entry released at epoch E may have been seen only by
  // the critical section of epoch E, so it is claimed again only once the epoch is past E.
  uint64_t lockEpoch;
  // The rkey of the region the mutex's holder is writing into (0: none), set before it looks the region up and
  // cleared once the bytes have moved: deregMr waits while it names the region.
  uint32_t writingRkey;
};

struct Tables {
  Header header;
  QpSlot qps[kMaxQps];
  MrSlot mrs[kMaxMrs];
  CqSlot cqs[kMaxCqs];
  ChannelSlot channels[kMaxChannels];
};

// Atomic access to a word of the shared tables that some readers look at without the mutex. kOrdered (sequentially
// consistent) is for the words two sides each write and then read the other's (a Dekker pairing: at least one of
// them sees the other's write).
constexpr std::memory_order kRelaxed = std::memory_order_relaxed, kAcquire = std::memory_order_acquire,
                            kRelease = std::memory_order_release, kOrdered = std::memory_order_seq_cst;
template <typename T>
T atomicLoad(T& word, std::memory_order order) {
  return std::atomic_ref<T>(word).load(order);
}
template <typename T>
void atomicStore(T& word, std::type_identity_t<T> value, std::memory_order order) {
  std::atomic_ref<T>(word).store(value, order);
}

constexpr int32_t kReleasing = INT32_MIN;
// The process a pid word names (the owner, the initialising owner or the releaser); 0 for a free entry. (Pids are
// below 2^22, so minus a pid and kReleasing | a pid never meet.)
inline int32_t pidWordOwner(int32_t word) {
  if (word >= 0) return word;
  return word < -(1 << 22) ? (word & INT32_MAX) : -word;
}

// True unless `pid` is known to be gone (kill(pid, 0) fails with ESRCH).
bool processAlive(pid_t pid);

// The fabric as this process sees it: the mapped tables and where the channels' FIFOs live.
class Fabric {
 public:
  // Maps the fabric of LOOM_SOFTIB_DIR, creating it if needed; nullptr with *why when it cannot. Once per process
  // (a forked child shares its parent's mapping).
  static Fabric* get(std::string* why);

  Tables& tables() { return *tables_; }
  // The FIFO that signals channel `id`.
  std::string channelPath(uint32_t id) const;

  // A fresh identifier for an entry in slot `slot` of a table with `slotBits` bits of slot, below 2^totalBits.
  uint32_t newId(uint32_t slot, uint32_t slotBits, uint32_t totalBits);
  // Claims a free entry of each table for the calling process, marked as being initialised (-pid), or -1 with
  // errno ENOMEM when the table is full even after reclaiming the entries of dead processes. Initialise it, then
  // publish() it. Without the mutex.
  int claimQp();
  int claimMr();
  int claimCq();
  int claimChannel();
  // Makes a claimed entry visible to lookups.
  template <typename Slot>
  static void publish(Slot& slot) {
    std::atomic_ref<int32_t>(slot.pid).store(getpid(), std::memory_order_release);
  }
  // Frees an entry: lookups stop finding it at once; it is claimed again only after the current critical section.
  template <typename Slot>
  void release(Slot& slot) {
    releaseAt(std::atomic_ref<int32_t>(slot.pid), slot.freedEpoch, std::atomic_ref<int32_t>(slot.pid).load());
  }

  // Entries by identifier; nullptr when none (or a stale identifier). Under the mutex, for what the entry's owner
  // may change meanwhile; without it, for its owner and for words read atomically.
  QpSlot* qp(uint32_t qpNum);
  MrSlot* mrByLkey(uint32_t lkey);
  MrSlot* mrByRkey(uint32_t rkey);
  CqSlot* cq(uint32_t id);

  // Takes the mutex, unless the thread that holds it belongs to a stopped process (or has held it for longer than
  // anything under it takes, kLockPatience): false then, and nothing is held. A holder that dies leaves it to the
  // next (robust).
  bool lock();
  void unlock();
  // Waits while the mutex's holder writes into the region with `rkey` (writingRkey): true once no write is landing
  // there, false when the writer is stopped (or slower than kLockPatience).
  bool waitForWritesInto(uint32_t rkey);

 private:
  enum class Table { kAll, kQps, kMrs, kCqs, kChannels };

  explicit Fabric(Tables* tables, std::string prefix) : tables_(tables), prefix_(std::move(prefix)) {}
  template <typename Slot, size_t N>
  int claim(Slot (&slots)[N], Table table);
  // Frees an entry whose pid word held `owner`, if it still does; whether it did. Marked kReleasing first, so that
  // neither a lookup nor a claimer takes it while its release epoch is written.
  bool releaseAt(std::atomic_ref<int32_t> pid, uint64_t& freedEpoch, int32_t owner);
  // Frees every entry of `table` whose owner has died.
  void reclaim(Table table);
  // Whether the mutex's holder, if any, is stopped: then remembered, so that the next look at the same holder is
  // a single read of its state.
  bool holderStopped();

  Tables* tables_;
  std::string prefix_;  // "<dir>/loom-softib-<uid>-v<layout>"
  std::atomic<int> stoppedHolder_{0};  // the last holder found stopped (a thread id)
};

// Events for completion channels, written when it goes out of scope (after the mutex is released, for a
// FabricLock's), so that no process writes to a FIFO while every other one waits.
class ChannelSignals {
 public:
  explicit ChannelSignals(Fabric& fabric) : fabric_(fabric) {}
  ~ChannelSignals();
  ChannelSignals(const ChannelSignals&) = delete;
  ChannelSignals& operator=(const ChannelSignals&) = delete;

  // Signals CQ `cq`'s channel if the CQ is armed for a completion of this kind (`solicited`, `error`), disarming
  // it; with `always`, whatever it is armed for (a wake-up with no completion).
  void raise(CqSlot& cq, bool solicited, bool error, bool always = false);
  // raise(..., always) for the CQ with id `cqId`, if it exists: its owner, asleep on the channel, has work to carry
  // on. A real HCA carries it on by itself and raises an event when it completes.
  void wake(uint32_t cqId);

 private:
  Fabric& fabric_;
  std::vector<std::pair<uint32_t, uint32_t>> signals_;  // (channel id, CQ id)
};

// Holds the fabric's mutex for a scope, if it can be had (held()), and adds completions to completion queues.
class FabricLock {
 public:
  explicit FabricLock(Fabric& fabric) : fabric_(fabric), signals_(fabric), held_(fabric.lock()) {}
  ~FabricLock() {
    if (held_) fabric_.unlock();
  }  // then signals_ goes, writing its events
  FabricLock(const FabricLock&) = delete;
  FabricLock& operator=(const FabricLock&) = delete;

  bool held() const { return held_; }
  // Adds `cqe` to CQ `cqId`; false when the CQ is gone or full (then the CQ is marked overrun). `solicited`: it
  // may end a wait armed with solicited_only (errors always may). Only while held().
  bool push(uint32_t cqId, const Cqe& cqe, bool solicited);
  ChannelSignals& signals() { return signals_; }

 private:
  Fabric& fabric_;
  ChannelSignals signals_;
  const bool held_;
};

// How long a thread waits for the mutex's holder, or for a write into a region being deregistered, while that
// holder runs; far more than anything under the mutex takes, even on a loaded machine. After it, the wait ends
// as if the holder were stopped (the work waits for a later poll; deregMr fails with EBUSY).
constexpr int kLockPatienceMs = 1000;

}  // namespace loom::softib
