// What the softib tests share (softib_test.cc, softib_concurrency_test.cc): the fabric of the test program, a
// connected pair of ends (Side, Link, connectBoth), writes, receives and polls, and forked children. No tests here.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transports/ibverbs/softib_fabric.h"
#include "transports/ibverbs/verbs.h"

namespace loom::softib_test {

using Clock = std::chrono::steady_clock;
constexpr int kWaitMs = 30000;  // how long anything may take before a test calls it lost

// The fabric of this test program, in a directory of its own so that it meets no other run's entries; removed at
// exit by the process that made it.
inline std::string fabricDir;
inline void removeFabricDir() {
  if (DIR* dir = opendir(fabricDir.c_str())) {
    while (dirent* entry = readdir(dir))
      if (entry->d_name[0] != '.') unlink((fabricDir + "/" + entry->d_name).c_str());
    closedir(dir);
  }
  rmdir(fabricDir.c_str());
}

inline const VerbsApi& api() {
  static const VerbsApi* loaded = [] {
    char dir[] = "/dev/shm/loom-softib-test-XXXXXX";
    if (mkdtemp(dir) != nullptr) {
      fabricDir = dir;
      setenv("LOOM_SOFTIB_DIR", dir, 1);
      std::atexit(removeFabricDir);
    }
    std::string why;
    const VerbsApi* table = softibApi(&why);
    if (table == nullptr) {
      std::fprintf(stderr, "softib does not load: %s\n", why.c_str());
      std::abort();
    }
    return table;
  }();
  return *loaded;
}

inline ibv_context* openFirstDevice() {
  int count = 0;
  ibv_device** list = api().getDeviceList(&count);
  ibv_context* context = count > 0 ? api().openDevice(list[0]) : nullptr;
  api().freeDeviceList(list);
  return context;
}

struct SideOptions {
  uint32_t maxSendWr = 16;
  uint32_t maxRecvWr = 16;
  bool channel = false;
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
};

// One end: a device context, a PD, a CQ for both queues (with a channel when asked), an RC QP in RESET and a
// registered buffer.
struct Side {
  explicit Side(size_t bytes = 4096, SideOptions options = {}) : buffer(bytes) {
    context = openFirstDevice();
    if (context == nullptr) return;
    pd = api().allocPd(context);
    if (options.channel) channel = api().createCompChannel(context);
    cq = api().createCq(context, 256, this, channel, 0);
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = options.maxSendWr;
    init.cap.max_recv_wr = options.maxRecvWr;
    init.cap.max_send_sge = 4;
    init.cap.max_recv_sge = 1;
    qp = api().createQp(pd, &init);
    mr = api().regMr(pd, buffer.data(), buffer.size(), options.access);
  }
  ~Side() {
    if (mr != nullptr) api().deregMr(mr);
    if (qp != nullptr) api().destroyQp(qp);
    if (cq != nullptr) api().destroyCq(cq);
    if (channel != nullptr) api().destroyCompChannel(channel);
    if (pd != nullptr) api().deallocPd(pd);
    if (context != nullptr) api().closeDevice(context);
  }
  bool valid() const { return context && pd && cq && qp && mr; }
  ibv_gid gid(int index = 0) const {
    ibv_gid out{};
    api().queryGid(context, 1, index, &out);
    return out;
  }

  std::vector<uint8_t> buffer;
  ibv_context* context = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
};

struct Link {
  uint8_t timeout = 14;
  uint8_t retryCnt = 7;
  uint8_t rnrRetry = 7;
  uint8_t minRnrTimer = 12;
};

inline int toInit(ibv_qp* qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  return api().modifyQp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

inline ibv_qp_attr rtrAttr(uint32_t destQpNum, const ibv_gid& dgid, const Link& link) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = IBV_MTU_4096;
  attr.dest_qp_num = destQpNum;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = link.minRnrTimer;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.grh.dgid = dgid;
  attr.ah_attr.grh.sgid_index = 0;
  attr.ah_attr.grh.hop_limit = 1;
  attr.ah_attr.port_num = 1;
  return attr;
}
constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

inline ibv_qp_attr rtsAttr(const Link& link) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = link.timeout;
  attr.retry_cnt = link.retryCnt;
  attr.rnr_retry = link.rnrRetry;
  attr.max_rd_atomic = 1;
  return attr;
}
constexpr int kRtsMask =
    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;

inline int toRtr(ibv_qp* qp, uint32_t destQpNum, const ibv_gid& dgid, const Link& link = {}) {
  ibv_qp_attr attr = rtrAttr(destQpNum, dgid, link);
  return api().modifyQp(qp, &attr, kRtrMask);
}

// RESET to RTS, connected to `destQpNum` at `dgid`; the first failing modifyQp's result, or 0.
inline int connectQp(ibv_qp* qp, uint32_t destQpNum, const ibv_gid& dgid, const Link& link = {}) {
  if (int rc = toInit(qp)) return rc;
  if (int rc = toRtr(qp, destQpNum, dgid, link)) return rc;
  ibv_qp_attr attr = rtsAttr(link);
  return api().modifyQp(qp, &attr, kRtsMask);
}

inline int modifyToState(ibv_qp* qp, ibv_qp_state state) {
  ibv_qp_attr attr{};
  attr.qp_state = state;
  return api().modifyQp(qp, &attr, IBV_QP_STATE);
}

// Whether both sides were made and are now connected to each other.
inline bool connectBoth(Side& a, Side& b, const Link& link = {}) {
  return a.valid() && b.valid() && connectQp(a.qp, b.qp->qp_num, b.gid(), link) == 0 &&
         connectQp(b.qp, a.qp->qp_num, a.gid(), link) == 0;
}

inline int postWrite(ibv_qp* qp, uint64_t wrId, ibv_sge* sges, int numSge, uint64_t remoteAddr, uint32_t rkey,
                     bool withImm, uint32_t immData, bool signaled) {
  ibv_send_wr wr{};
  wr.wr_id = wrId;
  wr.sg_list = sges;
  wr.num_sge = numSge;
  wr.opcode = withImm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  wr.imm_data = immData;
  wr.wr.rdma.remote_addr = remoteAddr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return api().postSend(qp, &wr, &bad);
}

// Writes `bytes` from the start of `from`'s buffer to offset `offset` of `to`'s.
inline int rdmaWrite(Side& from, const Side& to, uint64_t wrId, size_t bytes, bool withImm, uint32_t immData = 0,
                     size_t offset = 0) {
  ibv_sge sge{reinterpret_cast<uint64_t>(from.buffer.data()), static_cast<uint32_t>(bytes), from.mr->lkey};
  return postWrite(from.qp, wrId, &sge, 1, reinterpret_cast<uint64_t>(to.buffer.data()) + offset, to.mr->rkey, withImm,
                   immData, true);
}

inline int postRecv(ibv_qp* qp, uint64_t wrId) {
  ibv_recv_wr wr{};
  wr.wr_id = wrId;
  ibv_recv_wr* bad = nullptr;
  return api().postRecv(qp, &wr, &bad);
}

// Polls `cq` until it gives a completion (true) or `timeoutMs` pass.
inline bool pollOne(ibv_cq* cq, ibv_wc* wc, int timeoutMs = kWaitMs) {
  auto end = Clock::now() + std::chrono::milliseconds(timeoutMs);
  do {
    int got = api().pollCq(cq, 1, wc);
    if (got == 1) return true;
    if (got < 0) return false;
    std::this_thread::yield();
  } while (Clock::now() < end);
  return false;
}

// ---- Forked peers ----

// Runs `body` in a forked child; its result (0: passed, else the number of the check that failed) is the exit
// status. alarm() ends a child that hangs.
inline pid_t forkChild(const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(kWaitMs / 1000 * 2);
    _exit(body());
  }
  return pid;
}

// The child's exit status, or -1 (and it is killed) when it has not exited within `timeoutMs`.
inline int waitChild(pid_t pid, int timeoutMs = kWaitMs * 2) {
  auto end = Clock::now() + std::chrono::milliseconds(timeoutMs);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct Pipes {
  Pipes() {
    if (pipe(toChild) != 0 || pipe(toParent) != 0) ADD_FAILURE() << "pipe: " << std::strerror(errno);
  }
  ~Pipes() {
    for (int fd : {toChild[0], toChild[1], toParent[0], toParent[1]}) close(fd);
  }
  int toChild[2] = {-1, -1};
  int toParent[2] = {-1, -1};
};

}  // namespace loom::softib_test
