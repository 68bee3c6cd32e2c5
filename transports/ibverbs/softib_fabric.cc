// softib's shared tables (softib_fabric.h): creating and mapping the file, the mutex, identifiers, slots, and
// signalling completion channels.
//
// The file is created under a temporary name, sized and initialised there, and only then linked to its real
// name, so a process never maps a half-made fabric; of two processes that create it at once, the one whose link
// fails maps the winner's. It stays after the last process has gone (the next one reuses it, reclaiming what the
// dead left behind) and is sparse: only the pages of entries in use take memory.
#include "transports/ibverbs/softib_fabric.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "src/base/log.h"
#include "src/base/params.h"

namespace loom::softib {
namespace {

constexpr uint64_t kMagic = 0x6c6f6f6d73696231;  // "loomsib1"
constexpr int kLayoutVersion = 2;                // in the file's name: a build with another layout makes its own fabric

std::string errnoText(const std::string& what) { return what + ": " + std::strerror(errno); }

// Initialises a freshly truncated (zeroed) fabric.
bool initTables(Tables* tables, std::string* why) {
  Header& header = tables->header;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  int rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  if (rc == 0) rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  if (rc == 0) rc = pthread_mutex_init(&header.mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc != 0) {
    *why = std::string("softib: cannot make a robust process-shared mutex: ") + std::strerror(rc);
    return false;
  }
  header.bytes = sizeof(Tables);
  header.nextPdId = 1;
  header.lockEpoch = 1;  // past the zeros that never-used entries hold
  header.magic = kMagic;
  return true;
}

Tables* mapTables(int fd, std::string* why, const std::string& path) {
  void* base = mmap(nullptr, sizeof(Tables), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    *why = errnoText("softib: mmap of " + path);
    return nullptr;
  }
  return static_cast<Tables*>(base);
}

// Maps the existing fabric at `path`; nullptr with *why (ENOENT left in errno when there is none).
Tables* openExisting(const std::string& path, std::string* why) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int error = errno;
    *why = errnoText("softib: cannot open " + path);
    errno = error;
    return nullptr;
  }
  struct stat st {};
  Tables* tables = nullptr;
  if (fstat(fd, &st) != 0) {
    *why = errnoText("softib: fstat of " + path);
  } else if (static_cast<uint64_t>(st.st_size) != sizeof(Tables)) {
    *why = "softib: " + path + " holds " + std::to_string(st.st_size) + " bytes where " +
           std::to_string(sizeof(Tables)) + " were expected; remove it";
  } else {
    tables = mapTables(fd, why, path);
    if (tables != nullptr && tables->header.magic != kMagic) {
      *why = "softib: " + path + " is not a softib fabric; remove it";
      munmap(tables, sizeof(Tables));
      tables = nullptr;
    }
  }
  close(fd);
  errno = 0;
  return tables;
}

// Creates the fabric at `path` (see the top of the file); nullptr with *why, or with errno EEXIST when another
// process made it first.
Tables* create(const std::string& path, std::string* why) {
  std::string temporary = path + ".init-" + std::to_string(getpid()) + "-" + std::to_string(gettid());
  int fd = open(temporary.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = errnoText("softib: cannot create " + temporary);
    return nullptr;
  }
  Tables* tables = nullptr;
  if (ftruncate(fd, sizeof(Tables)) != 0) {
    *why = errnoText("softib: cannot size " + temporary);
  } else {
    tables = mapTables(fd, why, temporary);
  }
  close(fd);
  if (tables != nullptr && !initTables(tables, why)) {
    munmap(tables, sizeof(Tables));
    tables = nullptr;
  }
  if (tables != nullptr && link(temporary.c_str(), path.c_str()) != 0) {
    int error = errno;
    *why = errnoText("softib: cannot link " + temporary + " to " + path);
    munmap(tables, sizeof(Tables));
    tables = nullptr;
    errno = error;
  }
  int error = errno;
  unlink(temporary.c_str());
  errno = error;
  return tables;
}

// Writes one event (the CQ's id) into channel `path`'s FIFO. A reader that closes it between the open and the
// write would raise SIGPIPE, which would end the whole process: the signal is held off and swallowed.
void signalChannel(const std::string& path, uint32_t cqId) {
  int fd = open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    // ENXIO: nobody holds the channel open any more (its owner died); ENOENT: it was destroyed.
    LOOM_TRACE(IB, "softib: channel %s is gone: %m", path.c_str());
    return;
  }
  sigset_t pipeSignal, saved, pending;
  sigemptyset(&pipeSignal);
  sigaddset(&pipeSignal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipeSignal, &saved);
  sigpending(&pending);
  bool wasPending = sigismember(&pending, SIGPIPE) == 1;
  ssize_t written = write(fd, &cqId, sizeof(cqId));
  int error = errno;
  if (written < 0 && error == EPIPE && !wasPending) {
    timespec zero{};
    sigtimedwait(&pipeSignal, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  close(fd);
  if (written != static_cast<ssize_t>(sizeof(cqId)) && error != EPIPE) {
    errno = error;
    LOOM_WARN(IB, "softib: cannot signal completion channel %s (an event is lost): %m", path.c_str());
  }
}

// Whether thread `tid` (of any process) is stopped: by a signal (SIGSTOP, SIGTSTP) or a tracer. False when it is
// gone or its state cannot be read.
bool threadStopped(pid_t tid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(tid));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[512];
  ssize_t n = read(fd, text, sizeof(text) - 1);
  close(fd);
  if (n <= 0) return false;
  text[n] = '\0';
  // "tid (comm) S ...": the state follows the last ')', as the name may hold any character.
  const char* close = std::strrchr(text, ')');
  if (close == nullptr || close[1] != ' ') return false;
  return close[2] == 'T' || close[2] == 't';
}

// The thread that holds `mutex`, from its futex word (a robust mutex keeps its owner's thread id there, for the
// kernel's sake); 0 when none.
pid_t mutexHolder(pthread_mutex_t& mutex) {
  return static_cast<pid_t>(std::atomic_ref<int>(mutex.__data.__lock).load(std::memory_order_relaxed) &
                            FUTEX_TID_MASK);
}

}  // namespace

bool processAlive(pid_t pid) {
  if (pid == getpid()) return true;
  return kill(pid, 0) == 0 || errno != ESRCH;
}

Fabric* Fabric::get(std::string* why) {
  struct Opened {
    Fabric* fabric = nullptr;
    std::string why;
  };
  static const Opened opened = [] {
    Opened result;
    std::string prefix =
        params::softibDir() + "/loom-softib-" + std::to_string(getuid()) + "-v" + std::to_string(kLayoutVersion);
    Tables* tables = nullptr;
    // Normally one round: open it, else create it. Another process may create it between the two; then the
    // link fails and the next round opens theirs.
    for (int round = 0; round < 3 && tables == nullptr; ++round) {
      tables = openExisting(prefix, &result.why);
      if (tables != nullptr || errno != ENOENT) break;
      tables = create(prefix, &result.why);
      if (tables == nullptr && errno != EEXIST) break;
    }
    if (tables == nullptr) return result;
    result.why.clear();
    result.fabric = new Fabric(tables, prefix);  // for the life of the process
    result.fabric->reclaim(Table::kAll);
    LOOM_INFO(IB, "softib: fabric %s", prefix.c_str());
    return result;
  }();
  if (opened.fabric == nullptr) *why = opened.why;
  return opened.fabric;
}

std::string Fabric::channelPath(uint32_t id) const { return prefix_ + ".channel-" + std::to_string(id); }

bool Fabric::holderStopped() {
  const pid_t holder = mutexHolder(tables_->header.mutex);
  if (holder == 0 || !threadStopped(holder)) return false;
  if (stoppedHolder_.exchange(holder) != holder)
    LOOM_INFO(IB, "softib: the fabric's lock is held by thread %d, which is stopped: writes wait until it runs again",
              static_cast<int>(holder));
  return true;
}

bool Fabric::lock() {
  pthread_mutex_t& mutex = tables_->header.mutex;
  int rc = pthread_mutex_trylock(&mutex);
  if (rc == EBUSY) {
    // A holder known to be stopped is not waited for at all; any other gets a short wait before it is looked at.
    const pid_t known = stoppedHolder_.load();
    if (known != 0 && mutexHolder(mutex) == known && threadStopped(known)) return false;
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      // A slice of 2 ms. (timedlock's clock is the wall clock, which may jump: it then distorts one slice only;
      // pthread_mutex_clocklock would take the monotonic one, but ThreadSanitizer does not see it lock.)
      timespec until{};
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += 2000000;
      if (until.tv_nsec >= 1000000000) {
        until.tv_nsec -= 1000000000;
        ++until.tv_sec;
      }
      rc = pthread_mutex_timedlock(&mutex, &until);
      if (rc != ETIMEDOUT) break;
      if (holderStopped()) return false;
      if (std::chrono::steady_clock::now() - start > std::chrono::milliseconds(kLockPatienceMs)) {
        LOOM_WARN(IB, "softib: thread %d has held the fabric's lock for more than %d ms; going on without it",
                  static_cast<int>(mutexHolder(mutex)), kLockPatienceMs);
        return false;
      }
    }
  }
  if (rc == EOWNERDEAD) {
    // The tables may hold a change that process left half done; each is small and the worst is an entry that
    // looks used or a lost completion, not a crash. Its write, if it was writing, ended with it. Made consistent
    // first: a mutex given up again before that can never be taken again.
    pthread_mutex_consistent(&mutex);
    atomicStore(tables_->header.writingRkey, 0u, kOrdered);
    LOOM_WARN(IB, "softib: a process died holding the fabric's lock; carrying on");
    rc = 0;
  }
  if (rc != 0) {
    LOOM_WARN(IB, "softib: locking the fabric failed: %s%s", std::strerror(rc),
              rc == ENOTRECOVERABLE ? "; no write can move until the fabric is made anew: stop every process "
                                      "using it and remove its file in LOOM_SOFTIB_DIR"
                                    : "");
    return false;
  }
  std::atomic_ref<uint64_t>(tables_->header.lockEpoch).fetch_add(1, std::memory_order_seq_cst);
  return true;
}

void Fabric::unlock() { pthread_mutex_unlock(&tables_->header.mutex); }

bool Fabric::waitForWritesInto(uint32_t rkey) {
  const auto start = std::chrono::steady_clock::now();
  while (atomicLoad(tables_->header.writingRkey, kOrdered) == rkey) {
    // No holder left: the writer died mid-write (the next locker clears the word), and a dead process writes nothing.
    if (mutexHolder(tables_->header.mutex) == 0 || holderStopped()) return mutexHolder(tables_->header.mutex) == 0;
    if (std::chrono::steady_clock::now() - start > std::chrono::milliseconds(kLockPatienceMs)) return false;
    sched_yield();
  }
  return true;
}

uint32_t Fabric::newId(uint32_t slot, uint32_t slotBits, uint32_t totalBits) {
  const uint32_t counterMask = (1u << (totalBits - slotBits)) - 1;
  std::atomic_ref<uint32_t> next(tables_->header.nextSeq);
  uint32_t counter = (next.fetch_add(1) + 1) & counterMask;
  if (counter == 0) counter = (next.fetch_add(1) + 1) & counterMask;
  return counter << slotBits | slot;
}

bool Fabric::releaseAt(std::atomic_ref<int32_t> pid, uint64_t& freedEpoch, int32_t owner) {
  int32_t expected = owner;
  if (owner == 0 || !pid.compare_exchange_strong(expected, kReleasing | static_cast<int32_t>(getpid()),
                                                 std::memory_order_seq_cst))
    return false;
  // The epoch is read after lookups stop finding the entry (both ordered, as a holder's raise of the epoch and its
  // lookups are): a critical section that could still see the entry has the epoch read here or an earlier one.
  atomicStore(freedEpoch, atomicLoad(tables_->header.lockEpoch, kOrdered), kRelaxed);
  pid.store(0, std::memory_order_release);
  return true;
}

template <typename Slot, size_t N>
int Fabric::claim(Slot (&slots)[N], Table table) {
  const int32_t claimed = -static_cast<int32_t>(getpid());
  for (int round = 0; round < 3; ++round) {
    const uint64_t epoch = atomicLoad(tables_->header.lockEpoch, kOrdered);
    for (size_t i = 0; i < N; ++i) {
      std::atomic_ref<int32_t> pid(slots[i].pid);
      if (pid.load(std::memory_order_acquire) != 0 ||
          std::atomic_ref<uint64_t>(slots[i].freedEpoch).load(std::memory_order_acquire) >= epoch)
        continue;
      int32_t expected = 0;
      if (!pid.compare_exchange_strong(expected, claimed, std::memory_order_acq_rel)) continue;
      // Claimed, released again and freed once more since the look above: its epoch may be too recent now.
      if (std::atomic_ref<uint64_t>(slots[i].freedEpoch).load(std::memory_order_acquire) < epoch)
        return static_cast<int>(i);
      pid.store(0, std::memory_order_release);
    }
    if (round == 0) reclaim(table);
    // Entries released since the last critical section began become claimable once one more has: take the
    // mutex once (unless it is stalled).
    if (round == 1 && lock()) unlock();
  }
  errno = ENOMEM;
  return -1;
}

// A claimed entry starts from zeros. The words that lookups without the mutex read (a requester's wake-up, a
// channel's signal) are cleared atomically: such a lookup may still be reading the entry's previous life.
int Fabric::claimQp() {
  int slot = claim(tables_->qps, Table::kQps);
  if (slot >= 0) {
    QpSlot& qp = tables_->qps[slot];
    for (uint32_t* word : {&qp.qpNum, &qp.state, &qp.accessFlags, &qp.sendCqId, &qp.recvCqId, &qp.waiting,
                           &qp.destQpNum, &qp.maxRecvWr})
      atomicStore(*word, 0u, kRelaxed);
    atomicStore(qp.minRnrTimer, uint8_t{0}, kRelaxed);
    qp.pdId = 0;
    std::memset(qp.portGids, 0, sizeof(qp.portGids));
    qp.dgid = qp.sgid = ibv_gid{};
    // The receive ring's old contents are left as they are: nothing reads an entry before it is posted again.
    atomicStore(qp.recvHead, uint64_t{0}, kRelaxed);
    atomicStore(qp.recvTail, uint64_t{0}, kRelaxed);
  }
  return slot;
}

int Fabric::claimMr() {
  int slot = claim(tables_->mrs, Table::kMrs);
  if (slot >= 0) {
    MrSlot& mr = tables_->mrs[slot];
    atomicStore(mr.lkey, 0u, kRelaxed);
    atomicStore(mr.rkey, 0u, kRelaxed);
    mr.access = 0;
    mr.pdId = mr.addr = mr.length = 0;
  }
  return slot;
}

int Fabric::claimCq() {
  int slot = claim(tables_->cqs, Table::kCqs);
  if (slot >= 0) {
    CqSlot& cq = tables_->cqs[slot];
    for (uint32_t* word : {&cq.id, &cq.capacity, &cq.channelId, &cq.armed, &cq.overrun})
      atomicStore(*word, 0u, kRelaxed);
    atomicStore(cq.tail, 0, kRelease);
    atomicStore(cq.head, 0, kRelease);
  }
  return slot;
}

int Fabric::claimChannel() {
  int slot = claim(tables_->channels, Table::kChannels);
  if (slot >= 0) atomicStore(tables_->channels[slot].id, 0u, kRelaxed);
  return slot;
}

namespace {

// The entry of `slots` that identifier `id` (its slot in its low bits) names, if its `key` still is `id`.
template <typename Slot, size_t N>
Slot* lookUp(Slot (&slots)[N], uint32_t id, uint32_t Slot::*key) {
  static_assert((N & (N - 1)) == 0);
  Slot& slot = slots[id & (N - 1)];
  return atomicLoad(slot.pid, kOrdered) > 0 && atomicLoad(slot.*key, kRelaxed) == id ? &slot : nullptr;
}

}  // namespace

QpSlot* Fabric::qp(uint32_t qpNum) { return lookUp(tables_->qps, qpNum, &QpSlot::qpNum); }
MrSlot* Fabric::mrByLkey(uint32_t lkey) { return lookUp(tables_->mrs, lkey, &MrSlot::lkey); }
MrSlot* Fabric::mrByRkey(uint32_t rkey) { return lookUp(tables_->mrs, rkey, &MrSlot::rkey); }
CqSlot* Fabric::cq(uint32_t id) { return lookUp(tables_->cqs, id, &CqSlot::id); }

void Fabric::reclaim(Table table) {
  // Many entries share an owner: remember each pid's answer for this pass.
  std::vector<std::pair<int32_t, bool>> known;
  auto dead = [&](int32_t pid) {
    for (const auto& [knownPid, alive] : known)
      if (knownPid == pid) return !alive;
    bool alive = processAlive(pid);
    known.emplace_back(pid, alive);
    return !alive;
  };
  int reclaimed = 0;
  auto sweep = [&](auto& slots, auto&& onFree) {
    for (auto& slot : slots) {
      const int32_t owner = atomicLoad(slot.pid, kOrdered);
      if (owner == 0 || !dead(pidWordOwner(owner))) continue;
      onFree(slot);
      if (releaseAt(std::atomic_ref<int32_t>(slot.pid), slot.freedEpoch, owner)) ++reclaimed;
    }
  };
  auto nothing = [](auto&) {};
  if (table == Table::kAll || table == Table::kQps) sweep(tables_->qps, nothing);
  if (table == Table::kAll || table == Table::kMrs) sweep(tables_->mrs, nothing);
  if (table == Table::kAll || table == Table::kCqs) sweep(tables_->cqs, nothing);
  if (table == Table::kAll || table == Table::kChannels)
    sweep(tables_->channels, [&](ChannelSlot& channel) { unlink(channelPath(channel.id).c_str()); });
  if (reclaimed > 0) LOOM_INFO(IB, "softib: reclaimed %d entries of processes that have exited", reclaimed);
}

ChannelSignals::~ChannelSignals() {
  for (const auto& [channelId, cqId] : signals_) signalChannel(fabric_.channelPath(channelId), cqId);
}

void ChannelSignals::raise(CqSlot& cq, bool solicited, bool error, bool always) {
  std::atomic_ref<uint32_t> armed(cq.armed);
  uint32_t mode = armed.load(std::memory_order_seq_cst);
  if (mode == 0 || (!always && mode == kArmedSolicited && !solicited && !error)) return;
  // Whoever disarms it signals: one event per arming, as the verbs promise.
  if (!armed.compare_exchange_strong(mode, 0, std::memory_order_seq_cst)) return;
  const uint32_t channelId = atomicLoad(cq.channelId, kRelaxed);
  if (channelId != 0) signals_.emplace_back(channelId, atomicLoad(cq.id, kRelaxed));
}

void ChannelSignals::wake(uint32_t cqId) {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // what the owner will find out, then the arming looked at
  if (CqSlot* cq = fabric_.cq(cqId)) raise(*cq, true, true, true);
}

bool FabricLock::push(uint32_t cqId, const Cqe& cqe, bool solicited) {
  CqSlot* cq = fabric_.cq(cqId);
  if (cq == nullptr) return false;
  uint64_t tail = atomicLoad(cq->tail, kAcquire);
  if (tail - atomicLoad(cq->head, kAcquire) >= cq->capacity) {
    if (atomicLoad(cq->overrun, kRelaxed) == 0)
      LOOM_WARN(IB, "softib: completion queue %u (%u entries) overran: a completion was lost", cqId, cq->capacity);
    atomicStore(cq->overrun, 1u, kRelaxed);
    return false;
  }
  cq->ring[tail % cq->capacity] = cqe;
  atomicStore(cq->tail, tail + 1, kRelease);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the tail out, then the arming looked at (CqSlot::armed)
  signals_.raise(*cq, solicited, cqe.status != IBV_WC_SUCCESS);
  return true;
}

}  // namespace loom::softib
