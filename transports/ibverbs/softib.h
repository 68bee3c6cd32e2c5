// softib's verbs objects as the process that owns them holds them, and what its two halves share: softib.cc
// (devices, memory regions, completion queues and channels, the QP state machine) and softib_work.cc (work
// requests, their completions and polling). What other processes must see lives in the fabric
// (softib_fabric.h); these objects point into it.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "src/base/wait.h"
#include "transports/ibverbs/softib_fabric.h"

namespace loom::softib {

constexpr int kMaxSge = 16;
constexpr uint32_t kMaxInline = 512;
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 31;
constexpr uint8_t kPort = 1;
constexpr int kMaxRdAtomic = 16;
constexpr uint8_t kRnrRetryForever = 7;

// Each object begins with the libibverbs struct that callers hold, so the two convert both ways.

struct SoftDevice {
  ibv_device device;
};

struct SoftContext {
  ibv_context context;
  ibv_gid gids[kGidCount];
  uint64_t guid;  // the identity of this host and device, also GID 0's interface id
};

struct SoftPd {
  ibv_pd pd;
  uint64_t id;  // fabric-wide: a remote key works only with a QP of its region's PD
  std::atomic<int> users{0};
};

struct SoftMr {
  ibv_mr mr;
  SoftPd* pd;
};

struct SoftCq;

struct SoftChannel {
  ibv_comp_channel channel;
  uint32_t id;
  std::mutex mutex;
  std::unordered_map<uint32_t, SoftCq*> cqs;  // by CQ id: the CQs whose events it delivers
};

struct SoftQp;

struct SoftCq {
  ibv_cq cq;
  uint32_t id;
  CqSlot* slot;
  SoftChannel* channel;
  std::mutex pollMutex;          // one poller at a time takes entries from the ring
  std::mutex qpsMutex;           // guards sendQps
  std::vector<SoftQp*> sendQps;  // the QPs whose send CQ this is: polling it carries out their work requests
  std::atomic<int> queued{0};    // work requests waiting in those QPs
  std::atomic<int> qpUses{0};    // QPs using it as send or receive CQ
};

// A send work request as the QP keeps it until it completes.
struct PendingWr {
  uint64_t wrId;
  ibv_wr_opcode opcode;
  unsigned flags;
  uint32_t immData;
  uint64_t remoteAddr;
  uint32_t rkey;
  uint64_t length;
  int numSge;
  ibv_sge sge[kMaxSge];
  bool isInline;
  std::vector<uint8_t> inlineData;  // IBV_SEND_INLINE: the bytes, taken when it was posted
  bool started = false;
  Clock::time_point retryDeadline = Clock::time_point::max();  // set while its packets reach no responder
  Clock::time_point nextTry = Clock::time_point::min();        // after an RNR NAK or a try that reached nobody
  int rnrNaks = 0;
};

struct SoftQp {
  ibv_qp qp;
  SoftPd* pd;
  SoftCq* sendCq;
  SoftCq* recvCq;
  QpSlot* slot;
  ibv_qp_cap cap;
  bool signalAll;
  std::mutex sendMutex;  // the send queue, the state and the connection below
  // Between threads of the owner that post receives, flush them (the error state) or reset the ring; taken after
  // the fabric's lock, never before it.
  std::mutex recvMutex;
  uint32_t destQpNum = 0;
  ibv_gid dgid{};
  uint8_t timeout = 0;
  uint8_t retryCnt = 0;
  uint8_t rnrRetry = 0;
  std::deque<PendingWr> sendQueue;
  uint32_t unsignaled = 0;          // unsignaled writes done since the last send completion, whose slots it frees
  std::atomic<uint32_t> sqUsed{0};  // send-queue slots not yet freed by a polled completion
};

// The conversions below rely on it: a pointer to a standard-layout object is a pointer to its first member.
static_assert(std::is_standard_layout_v<SoftContext> && std::is_standard_layout_v<SoftPd> &&
              std::is_standard_layout_v<SoftMr> && std::is_standard_layout_v<SoftChannel> &&
              std::is_standard_layout_v<SoftCq> && std::is_standard_layout_v<SoftQp>);
inline SoftContext* asContext(ibv_context* context) { return reinterpret_cast<SoftContext*>(context); }
inline SoftPd* asPd(ibv_pd* pd) { return reinterpret_cast<SoftPd*>(pd); }
inline SoftMr* asMr(ibv_mr* mr) { return reinterpret_cast<SoftMr*>(mr); }
inline SoftChannel* asChannel(ibv_comp_channel* channel) { return reinterpret_cast<SoftChannel*>(channel); }
inline SoftCq* asCq(ibv_cq* cq) { return reinterpret_cast<SoftCq*>(cq); }
inline SoftQp* asQp(ibv_qp* qp) { return reinterpret_cast<SoftQp*>(qp); }

inline Fabric& fabric() {
  std::string ignored;
  return *Fabric::get(&ignored);  // softibApi() opened it before it handed out the table
}

inline bool isZero(const ibv_gid& gid) {
  static const ibv_gid kZero{};
  return std::memcmp(gid.raw, kZero.raw, sizeof(gid.raw)) == 0;
}
inline bool sameGid(const ibv_gid& a, const ibv_gid& b) { return std::memcmp(a.raw, b.raw, sizeof(a.raw)) == 0; }

// softib_work.cc
Cqe sendCqe(const SoftQp* qp, uint64_t wrId, ibv_wc_status status, uint64_t byteLen, uint32_t sqRelease);
Cqe recvCqe(uint64_t wrId, ibv_wc_status status, uint32_t qpNum);
// Moves `qp` to the error state: every send work request still queued and every posted receive completes with
// IBV_WC_WR_FLUSH_ERR, in order, as on an RC QP. Called with its send mutex and the fabric's lock held.
void flushAll(FabricLock& lock, SoftQp* qp);
// Called, without the fabric's lock, by whoever has just made `responder` able to take what its requester waits
// for (a receive posted, RTR reached): the requester tries again at once, and its owner wakes if it sleeps on its
// send CQ's channel.
void wakeRequester(ChannelSignals& signals, QpSlot& responder);
int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int pollCq(ibv_cq* cq, int entries, ibv_wc* wc);
const char* wcStatusStr(ibv_wc_status status);

}  // namespace loom::softib
