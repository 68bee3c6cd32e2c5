// softib's fabric: the tables that the processes of one machine share, in one file under LOOM_SOFTIB_DIR, so that
// a queue pair in one process can find its peer in another, check its keys, take its posted receives and push
// completions into its completion queue.
//
// The file holds fixed-size tables of queue pairs, memory regions, completion queues (with their rings of
// completions) and completion channels, and one robust process-shared mutex over all of them. Every entry records
// the process that owns it; entries of processes that have died are reclaimed lazily, when a table is full and
// when a process first opens the fabric. Identifiers (qp numbers, keys, CQ and channel ids) carry their slot in
// their low bits and a value of a shared counter above it, so a stale identifier does not match a reused slot.
// Work queues of sends and the verbs objects themselves live in the owning process (softib.cc); nothing here
// moves data.
#pragma once

#include <infiniband/verbs.h>
#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
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

struct QpSlot {
  int32_t pid;  // owner; 0: free
  uint32_t qpNum;
  uint64_t pdId;
  uint32_t state;        // ibv_qp_state
  uint32_t accessFlags;  // the QP's qp_access_flags: remote writes need IBV_ACCESS_REMOTE_WRITE
  uint32_t sendCqId;
  uint32_t recvCqId;
  // Set by the owner while its first send work request waits for this QP's responder (RNR, or no responder yet);
  // cleared by whoever posts a receive there or brings it to RTR, who also wakes the owner (FabricLock::wake).
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
  int32_t pid;  // 0: free
  uint32_t lkey;
  uint32_t rkey;
  uint32_t access;
  uint64_t pdId;
  uint64_t addr;
  uint64_t length;
};

struct CqSlot {
  int32_t pid;  // 0: free
  uint32_t id;
  uint32_t capacity;
  uint32_t channelId;  // 0: none
  uint32_t armed;      // 0, kArmedAll or kArmedSolicited: the next (solicited) completion signals the channel
  uint32_t overrun;    // a completion found the ring full and was lost
  // Written by pushers under the fabric's mutex and read by the owner without it (tail), and the other way round
  // (head); both count from 0 for ever.
  alignas(64) uint64_t tail;
  alignas(64) uint64_t head;
  Cqe ring[kMaxCqe];
};
constexpr uint32_t kArmedAll = 1;
constexpr uint32_t kArmedSolicited = 2;

struct ChannelSlot {
  int32_t pid;  // 0: free
  uint32_t id;
};

struct Header {
  uint64_t magic;
  uint64_t bytes;
  pthread_mutex_t mutex;  // robust and process-shared, over everything in the file
  uint32_t nextSeq;       // source of the counter part of identifiers
  uint64_t nextPdId;
};

struct Tables {
  Header header;
  QpSlot qps[kMaxQps];
  MrSlot mrs[kMaxMrs];
  CqSlot cqs[kMaxCqs];
  ChannelSlot channels[kMaxChannels];
};

// Atomic access to a word of the shared tables that some readers look at without the mutex.
inline uint64_t loadAcquire(uint64_t& word) { return std::atomic_ref<uint64_t>(word).load(std::memory_order_acquire); }
inline void storeRelease(uint64_t& word, uint64_t value) {
  std::atomic_ref<uint64_t>(word).store(value, std::memory_order_release);
}

inline uint32_t loadRelaxed(uint32_t& word) { return std::atomic_ref<uint32_t>(word).load(std::memory_order_relaxed); }
inline void storeRelaxed(uint32_t& word, uint32_t value) {
  std::atomic_ref<uint32_t>(word).store(value, std::memory_order_relaxed);
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
  // Call with the mutex held.
  uint32_t newId(uint32_t slot, uint32_t slotBits, uint32_t totalBits);
  // A free slot of each table for the calling process (its pid recorded), or -1 with errno ENOMEM when the table
  // is full even after reclaiming the entries of dead processes. Call with the mutex held.
  int allocQp();
  int allocMr();
  int allocCq();
  int allocChannel();

  // Entries by identifier; nullptr when none (or a stale identifier). Call with the mutex held.
  QpSlot* qp(uint32_t qpNum);
  MrSlot* mrByLkey(uint32_t lkey);
  MrSlot* mrByRkey(uint32_t rkey);
  CqSlot* cq(uint32_t id);

  void lock();
  void unlock();

 private:
  enum class Table { kAll, kQps, kMrs, kCqs, kChannels };

  explicit Fabric(Tables* tables, std::string prefix) : tables_(tables), prefix_(std::move(prefix)) {}
  // The first free slot of `slots` (one of the tables), reclaiming the entries of dead processes when there is none;
  // -1 when there is none even then. The caller records its pid there.
  template <typename Slot, size_t N>
  int freeSlot(Slot (&slots)[N], Table table);
  // Frees every entry of `table` whose owner has died.
  void reclaim(Table table);

  Tables* tables_;
  std::string prefix_;  // "<dir>/loom-softib-<uid>-v<layout>"
};

// Holds the fabric's mutex for a scope and adds completions to completion queues. A completion that lands in an
// armed queue with a channel disarms it; the channel is signalled once the mutex is released, so no process writes
// to a FIFO while every other one waits.
class FabricLock {
 public:
  explicit FabricLock(Fabric& fabric) : fabric_(fabric) { fabric_.lock(); }
  ~FabricLock();
  FabricLock(const FabricLock&) = delete;
  FabricLock& operator=(const FabricLock&) = delete;

  // Adds `cqe` to CQ `cqId`; false when the CQ is gone or full (then the CQ is marked overrun). `solicited`: it
  // may end a wait armed with solicited_only (errors always may).
  bool push(uint32_t cqId, const Cqe& cqe, bool solicited);
  // Signals CQ `cqId`'s channel if the CQ is armed, with no completion: its owner, asleep on the channel, has work
  // to carry on. A real HCA carries it on by itself and raises an event when it completes.
  void wake(uint32_t cqId);

 private:
  void signal(CqSlot& cq);

  Fabric& fabric_;
  std::vector<std::pair<uint32_t, uint32_t>> signals_;  // (channel id, CQ id) to signal after unlocking
};

}  // namespace loom::softib
