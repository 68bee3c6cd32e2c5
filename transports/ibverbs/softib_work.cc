// softib's work requests (softib.h): posting sends and receives, carrying out RDMA writes as an RC QP does, and
// polling completion queues. See softib.cc for what is emulated and how work progresses.
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "src/base/log.h"
#include "src/base/params.h"
#include "transports/ibverbs/softib.h"

namespace loom::softib {

// ---- Completions ----

Cqe sendCqe(const SoftQp* qp, uint64_t wrId, ibv_wc_status status, uint64_t byteLen, uint32_t sqRelease) {
  Cqe cqe{};
  cqe.wrId = wrId;
  cqe.status = static_cast<uint8_t>(status);
  cqe.opcode = IBV_WC_RDMA_WRITE;
  cqe.byteLen = static_cast<uint32_t>(byteLen);
  cqe.qpNum = qp->qp.qp_num;
  cqe.sqRelease = static_cast<uint16_t>(sqRelease);
  return cqe;
}

Cqe recvCqe(uint64_t wrId, ibv_wc_status status, uint32_t qpNum) {
  Cqe cqe{};
  cqe.wrId = wrId;
  cqe.status = static_cast<uint8_t>(status);
  cqe.opcode = IBV_WC_RECV;
  cqe.qpNum = qpNum;
  return cqe;
}

void flushSends(FabricLock& lock, SoftQp* qp) {
  for (const PendingWr& wr : qp->sendQueue) {
    lock.push(qp->sendCq->id, sendCqe(qp, wr.wrId, IBV_WC_WR_FLUSH_ERR, 0, qp->unsignaled + 1), true);
    qp->unsignaled = 0;
  }
  qp->sendCq->queued -= static_cast<int>(qp->sendQueue.size());
  qp->sendQueue.clear();
}

void flushAll(FabricLock& lock, SoftQp* qp) {
  flushSends(lock, qp);
  QpSlot& shared = *qp->slot;
  std::lock_guard<std::mutex> receives(qp->recvMutex);  // a receive posted from now on sees the error state
  uint64_t head = atomicLoad(shared.recvHead, kRelaxed);
  for (const uint64_t tail = atomicLoad(shared.recvTail, kAcquire); head != tail; ++head)
    lock.push(qp->recvCq->id, recvCqe(shared.recvWrIds[head % shared.maxRecvWr], IBV_WC_WR_FLUSH_ERR, qp->qp.qp_num),
              true);
  atomicStore(shared.recvHead, head, kRelease);
  atomicStore(shared.state, static_cast<uint32_t>(IBV_QPS_ERR), kOrdered);
  qp->qp.state = IBV_QPS_ERR;
}

void wakeRequester(ChannelSignals& signals, QpSlot& responder) {
  QpSlot* requester = fabric().qp(atomicLoad(responder.destQpNum, kRelaxed));
  if (requester == nullptr || atomicLoad(requester->waiting, kOrdered) == 0 ||
      atomicLoad(requester->destQpNum, kRelaxed) != atomicLoad(responder.qpNum, kRelaxed))
    return;
  atomicStore(requester->waiting, 0u, kRelaxed);
  signals.wake(atomicLoad(requester->sendCqId, kRelaxed));
}

// ---- Send work requests ----

namespace {

// LOOM_SOFTIB_FAULT=qp_error:N: whether the write starting now is the N-th of this process. The setting is read
// once per process (a forked child reads it again and counts from 1).
bool injectedFault() {
  static std::mutex mutex;
  static pid_t readBy = 0;
  static int64_t failAt = 0;
  static int64_t writes = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (readBy != getpid()) {
    readBy = getpid();
    writes = 0;
    failAt = 0;
    const std::string fault = params::softibFault();
    const std::string prefix = "qp_error:";
    if (!fault.empty()) {
      char* end = nullptr;
      if (fault.rfind(prefix, 0) == 0) failAt = std::strtoll(fault.c_str() + prefix.size(), &end, 10);
      if (failAt <= 0 || end == nullptr || *end != '\0') {
        LOOM_WARN(IB, "softib: LOOM_SOFTIB_FAULT=\"%s\" ignored: expected qp_error:N with N >= 1", fault.c_str());
        failAt = 0;
      }
    }
  }
  return ++writes == failAt;
}

// The time an RNR NAK tells the requester to wait, by the responder's min_rnr_timer (the verbs' table).
Clock::duration rnrDelay(uint8_t minRnrTimer) {
  static const int kMicros[32] = {655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,   320,
                                  480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240, 15360,
                                  20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return std::chrono::microseconds(kMicros[minRnrTimer & 31]);
}

bool covers(const MrSlot& mr, uint64_t addr, uint64_t length) {
  return addr >= mr.addr && length <= mr.length && addr - mr.addr <= mr.length - length;
}

bool answersTo(const QpSlot& responder, const ibv_gid& dgid) {
  for (const ibv_gid& gid : responder.portGids)
    if (!isZero(gid) && sameGid(gid, dgid)) return true;
  return false;
}

// What a work request meets, checked under the fabric's lock.
enum class Verdict {
  kReady,            // the responder takes it (and, with immediate, gave it a receive)
  kNoResponder,      // its packets reach no QP that would answer
  kLocalProtection,  // a local SGE names no region of this process and PD, or goes past one
  kRemoteAccess,     // the responder refuses the remote key, range or access
  kNotReady,         // a write with immediate found no posted receive: RNR NAK
};

struct Target {
  pid_t pid = 0;
  uint32_t qpNum = 0;
  uint64_t recvWrId = 0;  // the receive taken for a write with immediate
  uint8_t minRnrTimer = 0;
};

// Under the fabric's lock. A write of bytes announces its region in writingRkey before it looks the region up
// (deregMr releases the region, then looks at writingRkey: one of them sees the other); the caller clears it once
// the bytes have moved.
Verdict examine(const SoftQp* qp, const PendingWr& wr, Target* target) {
  Fabric& f = fabric();
  const pid_t self = getpid();
  if (!wr.isInline) {
    for (int i = 0; i < wr.numSge; ++i) {
      const MrSlot* mr = f.mrByLkey(wr.sge[i].lkey);
      if (mr == nullptr || atomicLoad(mr->pid, kRelaxed) != self || mr->pdId != qp->pd->id ||
          !covers(*mr, wr.sge[i].addr, wr.sge[i].length))
        return Verdict::kLocalProtection;
    }
  }
  QpSlot* responder = f.qp(qp->destQpNum);
  if (responder == nullptr) return Verdict::kNoResponder;
  const uint32_t state = atomicLoad(responder->state, kOrdered);  // first: the words below were written before it
  if ((state != IBV_QPS_RTR && state != IBV_QPS_RTS) || atomicLoad(responder->destQpNum, kRelaxed) != qp->qp.qp_num ||
      !answersTo(*responder, qp->dgid) || !processAlive(atomicLoad(responder->pid, kRelaxed)))
    return Verdict::kNoResponder;
  if ((atomicLoad(responder->accessFlags, kRelaxed) & IBV_ACCESS_REMOTE_WRITE) == 0) return Verdict::kRemoteAccess;
  // As on hardware, a write of no bytes names no memory, so its key is not looked at.
  if (wr.length > 0) {
    atomicStore(f.tables().header.writingRkey, wr.rkey, kOrdered);
    const MrSlot* mr = f.mrByRkey(wr.rkey);
    if (mr == nullptr || mr->pdId != responder->pdId || (mr->access & IBV_ACCESS_REMOTE_WRITE) == 0 ||
        !covers(*mr, wr.remoteAddr, wr.length))
      return Verdict::kRemoteAccess;
  }
  target->pid = atomicLoad(responder->pid, kRelaxed);
  target->qpNum = responder->qpNum;
  if (wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
    // Receives are posted without the lock: the owner writes the entry, then publishes the tail.
    const uint64_t head = atomicLoad(responder->recvHead, kRelaxed);
    if (head == atomicLoad(responder->recvTail, kOrdered)) {
      target->minRnrTimer = atomicLoad(responder->minRnrTimer, kRelaxed);
      return Verdict::kNotReady;
    }
    target->recvWrId = responder->recvWrIds[head % responder->maxRecvWr];
    atomicStore(responder->recvHead, head + 1, kRelease);
  }
  return Verdict::kReady;
}

bool waitsForResponder(Verdict verdict) { return verdict == Verdict::kNoResponder || verdict == Verdict::kNotReady; }

// examine(), which also records in the shared table whether the QP now waits for its responder: recorded first,
// then the responder looked at once more, since its owner, who posts receives and reaches RTR without the lock,
// changes it first and then looks for a waiting requester (QpSlot::waiting).
Verdict check(SoftQp* qp, const PendingWr& wr, Target* target) {
  Verdict verdict = examine(qp, wr, target);
  if (waitsForResponder(verdict)) {
    atomicStore(qp->slot->waiting, 1u, kOrdered);
    verdict = examine(qp, wr, target);
  }
  if (!waitsForResponder(verdict)) atomicStore(qp->slot->waiting, 0u, kRelaxed);
  if (verdict != Verdict::kReady) atomicStore(fabric().tables().header.writingRkey, 0u, kOrdered);
  return verdict;
}

// Copies the work request's bytes to [remoteAddr, +length) in process `pid`; 0 or an errno value.
int copyOut(const PendingWr& wr, pid_t pid) {
  if (wr.length == 0) return 0;
  iovec local[kMaxSge];
  int count = 0;
  if (wr.isInline) {
    local[count++] = {const_cast<uint8_t*>(wr.inlineData.data()), wr.inlineData.size()};
  } else {
    for (int i = 0; i < wr.numSge; ++i)
      if (wr.sge[i].length > 0) local[count++] = {reinterpret_cast<void*>(wr.sge[i].addr), wr.sge[i].length};
  }
  if (pid == getpid()) {
    auto* out = reinterpret_cast<uint8_t*>(wr.remoteAddr);
    for (int i = 0; i < count; ++i) {
      std::memcpy(out, local[i].iov_base, local[i].iov_len);
      out += local[i].iov_len;
    }
    return 0;
  }
  iovec remote{reinterpret_cast<void*>(wr.remoteAddr), wr.length};
  int first = 0;
  while (remote.iov_len > 0) {
    ssize_t moved = process_vm_writev(pid, local + first, count - first, &remote, 1, 0);
    if (moved < 0) return errno;
    if (moved == 0) return EFAULT;
    // A partial write stops at a page it could not reach; go on from there, which fails if it really is missing.
    remote.iov_base = static_cast<uint8_t*>(remote.iov_base) + moved;
    remote.iov_len -= static_cast<size_t>(moved);
    for (auto left = static_cast<size_t>(moved); left > 0;) {
      size_t step = std::min(left, local[first].iov_len);
      local[first].iov_base = static_cast<uint8_t*>(local[first].iov_base) + step;
      local[first].iov_len -= step;
      left -= step;
      if (local[first].iov_len == 0) ++first;
    }
  }
  return 0;
}

// Completes the first work request of `qp` with `status`. A failure also takes the QP to the error state,
// flushing the rest. Called with its send mutex and the fabric's lock held.
void completeFirst(FabricLock& lock, SoftQp* qp, ibv_wc_status status) {
  PendingWr& wr = qp->sendQueue.front();
  if (status != IBV_WC_SUCCESS)
    LOOM_INFO(IB, "softib: qp %u: write (wr_id %llu) to qp %u failed: %s", qp->qp.qp_num,
              static_cast<unsigned long long>(wr.wrId), qp->destQpNum, wcStatusStr(status));
  bool signaled = status != IBV_WC_SUCCESS || qp->signalAll || (wr.flags & IBV_SEND_SIGNALED) != 0;
  if (signaled) {
    lock.push(qp->sendCq->id, sendCqe(qp, wr.wrId, status, wr.length, qp->unsignaled + 1), true);
    qp->unsignaled = 0;
  } else {
    ++qp->unsignaled;
  }
  qp->sendQueue.pop_front();
  qp->sendCq->queued--;
  if (status != IBV_WC_SUCCESS) flushAll(lock, qp);
}

enum class Step { kDone, kWait };

// The work request's packets reach no responder: it is resent until the transport timeout runs out. Resends
// look again once per local ACK timeout, or every millisecond where that is longer, so that a responder that comes
// up is found soon without every poll taking the fabric's lock.
Step noResponder(FabricLock& lock, SoftQp* qp, PendingWr& wr, Clock::time_point now) {
  const Clock::duration oneTry = std::chrono::nanoseconds(int64_t{4096} << qp->timeout);
  wr.nextTry = now + std::min<Clock::duration>(oneTry, std::chrono::milliseconds(1));
  if (qp->timeout == 0) return Step::kWait;  // the verbs' "infinite" local ACK timeout
  // A requester gives up after retry_cnt resends, each after a local ACK timeout of 4.096 us x 2^timeout.
  if (wr.retryDeadline == Clock::time_point::max()) wr.retryDeadline = now + oneTry * (qp->retryCnt + 1);
  if (now < wr.retryDeadline) return Step::kWait;
  completeFirst(lock, qp, IBV_WC_RETRY_EXC_ERR);
  return Step::kDone;
}

// Hands the responder its receive completion for a write with immediate whose data has landed; false when it
// left RTR and RTS meanwhile (then the write goes unanswered, and the receive it took is flushed with the rest).
bool deliver(FabricLock& lock, const SoftQp* qp, const PendingWr& wr, const Target& target) {
  QpSlot* responder = fabric().qp(target.qpNum);
  if (responder == nullptr || atomicLoad(responder->pid, kRelaxed) != target.pid) return false;
  Cqe cqe = recvCqe(target.recvWrId, IBV_WC_SUCCESS, target.qpNum);
  const uint32_t state = atomicLoad(responder->state, kOrdered);
  if (state != IBV_QPS_RTR && state != IBV_QPS_RTS) {
    if (state == IBV_QPS_ERR) {
      cqe.status = IBV_WC_WR_FLUSH_ERR;
      lock.push(responder->recvCqId, cqe, true);
    }
    return false;
  }
  cqe.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
  cqe.wcFlags = IBV_WC_WITH_IMM;
  cqe.immData = wr.immData;
  cqe.byteLen = static_cast<uint32_t>(wr.length);
  cqe.srcQp = qp->qp.qp_num;
  lock.push(responder->recvCqId, cqe, (wr.flags & IBV_SEND_SOLICITED) != 0);
  return true;
}

// A write whose bytes could not be moved into the responder's process, to be told once the lock is released.
struct CopyFailure {
  int error = 0;
  pid_t pid = 0;
  uint64_t length = 0;
};

// Carries the first work request of `qp` as far as it goes now, in the critical section `lock` holds: checked,
// moved, delivered and completed, or left to wait. Called with its send mutex held.
Step carryOut(FabricLock& lock, SoftQp* qp, PendingWr& wr, Clock::time_point now, CopyFailure* failure) {
  if (!wr.started) {
    wr.started = true;
    if (injectedFault()) {
      LOOM_INFO(IB, "softib: LOOM_SOFTIB_FAULT: the link of qp %u dies", qp->qp.qp_num);
      completeFirst(lock, qp, IBV_WC_RETRY_EXC_ERR);
      return Step::kDone;
    }
    if (wr.length > kMaxMessageBytes) {
      completeFirst(lock, qp, IBV_WC_LOC_LEN_ERR);
      return Step::kDone;
    }
  }
  Target target;
  const Verdict verdict = check(qp, wr, &target);
  switch (verdict) {
    case Verdict::kLocalProtection:
      completeFirst(lock, qp, IBV_WC_LOC_PROT_ERR);
      return Step::kDone;
    case Verdict::kRemoteAccess:
      completeFirst(lock, qp, IBV_WC_REM_ACCESS_ERR);
      return Step::kDone;
    case Verdict::kNoResponder:
      return noResponder(lock, qp, wr, now);
    case Verdict::kNotReady:
      wr.retryDeadline = Clock::time_point::max();  // a NAK is an answer: the transport timer starts again
      if (qp->rnrRetry != kRnrRetryForever && wr.rnrNaks++ >= qp->rnrRetry) {
        completeFirst(lock, qp, IBV_WC_RNR_RETRY_EXC_ERR);
        return Step::kDone;
      }
      wr.nextTry = now + rnrDelay(target.minRnrTimer);
      return Step::kWait;
    case Verdict::kReady:
      break;
  }
  // The bytes move under the fabric's lock and announced in writingRkey, which deregMr waits on: as with a real
  // HCA, once the owner's deregMr has returned, no write lands in the region, so the owner may free or reuse its
  // memory.
  const int error = copyOut(wr, target.pid);
  atomicStore(fabric().tables().header.writingRkey, 0u, kOrdered);
  wr.retryDeadline = Clock::time_point::max();
  if (error == ESRCH) return noResponder(lock, qp, wr, now);  // the responder's process has just gone
  if (error != 0) {
    *failure = {error, target.pid, wr.length};
    completeFirst(lock, qp, error == EFAULT ? IBV_WC_REM_ACCESS_ERR : IBV_WC_GENERAL_ERR);
    return Step::kDone;
  }
  if (wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM && !deliver(lock, qp, wr, target)) return noResponder(lock, qp, wr, now);
  completeFirst(lock, qp, IBV_WC_SUCCESS);
  return Step::kDone;
}

// carryOut() in a critical section of its own; the work request waits as it is when the lock is held by a stopped
// process (it goes at a later poll, as if the network were slow). Called with its send mutex held.
Step attempt(SoftQp* qp, PendingWr& wr) {
  const Clock::time_point now = Clock::now();
  // Not yet time to resend, unless the responder has changed since (softib's shortcut: a real requester waits out
  // its timer).
  if (now < wr.nextTry && atomicLoad(qp->slot->waiting, kRelaxed) != 0) return Step::kWait;
  CopyFailure failure;
  Step step;
  {
    FabricLock lock(fabric());
    if (!lock.held()) return Step::kWait;
    step = carryOut(lock, qp, wr, now, &failure);
  }
  if (failure.error != 0) {
    errno = failure.error;
    LOOM_WARN(IB, "softib: qp %u: process_vm_writev of %llu bytes into process %d: %m%s", qp->qp.qp_num,
              static_cast<unsigned long long>(failure.length), static_cast<int>(failure.pid),
              failure.error == EPERM ? " (the two processes need the same user, and ptrace access to each other)"
                                     : "");
  }
  return step;
}

// Carries out `qp`'s work requests in order until one must wait; in the error state, flushes them. Called with
// its send mutex held.
void progress(SoftQp* qp) {
  if (qp->qp.state == IBV_QPS_ERR && !qp->sendQueue.empty()) {
    FabricLock lock(fabric());
    if (lock.held()) flushSends(lock, qp);
    return;
  }
  while (!qp->sendQueue.empty() && qp->qp.state == IBV_QPS_RTS)
    if (attempt(qp, qp->sendQueue.front()) == Step::kWait) break;
}

// Queues one work request (flushed by progress() in the error state); 0 or the errno value postSend returns.
int enqueue(SoftQp* qp, const ibv_send_wr& wr) {
  const ibv_qp_state state = qp->qp.state;
  if (state != IBV_QPS_RTS && state != IBV_QPS_ERR) return EINVAL;
  if (wr.opcode != IBV_WR_RDMA_WRITE && wr.opcode != IBV_WR_RDMA_WRITE_WITH_IMM) return EINVAL;
  if (wr.num_sge < 0 || wr.num_sge > static_cast<int>(qp->cap.max_send_sge)) return EINVAL;
  uint64_t length = 0;
  for (int i = 0; i < wr.num_sge; ++i) length += wr.sg_list[i].length;
  const bool isInline = (wr.send_flags & IBV_SEND_INLINE) != 0;
  if (isInline && length > qp->cap.max_inline_data) return EINVAL;
  if (qp->sqUsed.load() >= qp->cap.max_send_wr) return ENOMEM;
  ++qp->sqUsed;
  PendingWr& pending = qp->sendQueue.emplace_back();
  pending.wrId = wr.wr_id;
  pending.opcode = wr.opcode;
  pending.flags = wr.send_flags;
  pending.immData = wr.imm_data;
  pending.remoteAddr = wr.wr.rdma.remote_addr;
  pending.rkey = wr.wr.rdma.rkey;
  pending.length = length;
  pending.numSge = wr.num_sge;
  pending.isInline = isInline;
  std::copy(wr.sg_list, wr.sg_list + wr.num_sge, pending.sge);
  if (isInline) {
    pending.inlineData.reserve(length);
    for (int i = 0; i < wr.num_sge; ++i) {
      const auto* bytes = reinterpret_cast<const uint8_t*>(wr.sg_list[i].addr);
      pending.inlineData.insert(pending.inlineData.end(), bytes, bytes + wr.sg_list[i].length);
    }
  }
  qp->sendCq->queued++;
  return 0;
}

}  // namespace

int postSend(ibv_qp* ibQp, ibv_send_wr* wr, ibv_send_wr** bad) {
  SoftQp* qp = asQp(ibQp);
  std::lock_guard<std::mutex> sendLock(qp->sendMutex);
  int error = 0;
  for (; wr != nullptr && error == 0; wr = wr->next) {
    error = enqueue(qp, *wr);
    if (error != 0) *bad = wr;
  }
  progress(qp);
  return error;
}

// Without the fabric's lock (but in the error state, whose flush completion needs it: EAGAIN while a stopped
// process holds it): the QP's owner is the only writer of its receive ring's tail, and a requester takes entries
// under the lock.
int postRecv(ibv_qp* ibQp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  SoftQp* qp = asQp(ibQp);
  QpSlot& shared = *qp->slot;
  bool posted = false;
  for (; wr != nullptr; wr = wr->next) {
    int error = 0;
    bool flush = false;
    {
      std::lock_guard<std::mutex> receives(qp->recvMutex);
      const uint32_t state = atomicLoad(shared.state, kOrdered);
      if (state == IBV_QPS_RESET || wr->num_sge < 0 || wr->num_sge > static_cast<int>(qp->cap.max_recv_sge)) {
        error = EINVAL;
      } else if (state == IBV_QPS_ERR) {
        flush = true;
      } else {
        const uint64_t tail = atomicLoad(shared.recvTail, kRelaxed);
        if (tail - atomicLoad(shared.recvHead, kAcquire) >= shared.maxRecvWr) {
          error = ENOMEM;
        } else {
          shared.recvWrIds[tail % shared.maxRecvWr] = wr->wr_id;
          atomicStore(shared.recvTail, tail + 1, kOrdered);
          posted = true;
        }
      }
    }
    if (flush) {
      // In the error state for good (only a reset, under the lock, leaves it): its flush completion, pushed under
      // the fabric's lock, which is taken before the receive mutex, never after.
      FabricLock lock(fabric());
      if (lock.held())
        lock.push(qp->recvCq->id, recvCqe(wr->wr_id, IBV_WC_WR_FLUSH_ERR, qp->qp.qp_num), true);
      else
        error = EAGAIN;
    }
    if (error != 0) {
      *bad = wr;
      return error;
    }
  }
  if (posted) {
    ChannelSignals signals(fabric());
    wakeRequester(signals, shared);
  }
  return 0;
}

// ---- Polling ----

namespace {

// Carries out the work requests of the QPs that report to `cq`, unless another thread is at it already.
void progressSendQps(SoftCq* cq) {
  std::unique_lock<std::mutex> qpsLock(cq->qpsMutex, std::try_to_lock);
  if (!qpsLock.owns_lock()) return;
  for (SoftQp* qp : cq->sendQps) {
    std::unique_lock<std::mutex> sendLock(qp->sendMutex, std::try_to_lock);
    if (sendLock.owns_lock()) progress(qp);
  }
}

// A polled send completion frees its slots of the send queue (its own, and those of the unsignaled writes
// before it), as a real provider's send queue does.
void releaseSlots(SoftCq* cq, uint32_t qpNum, uint32_t count) {
  std::lock_guard<std::mutex> lock(cq->qpsMutex);
  for (SoftQp* qp : cq->sendQps) {
    if (qp->qp.qp_num != qpNum) continue;
    uint32_t used = qp->sqUsed.load();
    while (!qp->sqUsed.compare_exchange_weak(used, used - std::min(used, count))) {
    }
    return;
  }
}

}  // namespace

int pollCq(ibv_cq* ibCq, int entries, ibv_wc* wc) {
  SoftCq* cq = asCq(ibCq);
  if (entries < 0) {
    errno = EINVAL;
    return -1;
  }
  if (cq->queued.load(std::memory_order_relaxed) > 0) progressSendQps(cq);
  CqSlot& slot = *cq->slot;
  if (std::atomic_ref<uint32_t>(slot.overrun).load(std::memory_order_relaxed) != 0) {
    errno = EOVERFLOW;
    return -1;
  }
  std::lock_guard<std::mutex> pollLock(cq->pollMutex);
  uint64_t head = atomicLoad(slot.head, kAcquire);
  const uint64_t tail = atomicLoad(slot.tail, kAcquire);
  int got = 0;
  for (; got < entries && head != tail; ++got, ++head) {
    const Cqe& cqe = slot.ring[head % slot.capacity];
    ibv_wc& out = wc[got];
    out = ibv_wc{};
    out.wr_id = cqe.wrId;
    out.status = static_cast<ibv_wc_status>(cqe.status);
    out.opcode = static_cast<ibv_wc_opcode>(cqe.opcode);
    out.byte_len = cqe.byteLen;
    out.imm_data = cqe.immData;
    out.qp_num = cqe.qpNum;
    out.src_qp = cqe.srcQp;
    out.wc_flags = cqe.wcFlags;
    if (cqe.sqRelease > 0) releaseSlots(cq, cqe.qpNum, cqe.sqRelease);
  }
  atomicStore(slot.head, head, kRelease);
  return got;
}

// The texts libibverbs' ibv_wc_status_str gives.
const char* wcStatusStr(ibv_wc_status status) {
  static const char* const kTexts[] = {
      "success",
      "local length error",
      "local QP operation error",
      "local EE context operation error",
      "local protection error",
      "Work Request Flushed Error",
      "memory management operation error",
      "bad response error",
      "local access error",
      "remote invalid request error",
      "remote access error",
      "remote operation error",
      "transport retry counter exceeded",
      "RNR retry counter exceeded",
      "local RDD violation error",
      "remote invalid RD request",
      "aborted error",
      "invalid EE context number",
      "invalid EE context state",
      "fatal error",
      "response timeout error",
      "general error",
      "TM error",
      "TM software rendezvous",
  };
  static_assert(std::size(kTexts) == IBV_WC_TM_RNDV_INCOMPLETE + 1);
  if (status < IBV_WC_SUCCESS || status > IBV_WC_TM_RNDV_INCOMPLETE) return "unknown";
  return kTexts[status];
}

}  // namespace loom::softib
