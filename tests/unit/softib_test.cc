// softib, the software verbs device the ib transport's tests run on: devices, ports and GIDs; memory keys and the
// errors a bad one causes; the RC state machine and its attribute masks; writes with immediate between QPs of one
// process and of two (forked) processes, with their completions and a completion channel; receiver-not-ready, and a
// requester asleep on its channel woken when its responder can go on; inline data; remote access errors; writes
// that reach no responder, among them a dead peer's, and their transport timeout; the qp_error fault; flushes in
// the error state; the send queue's slots; several threads at once; processes that create the fabric at once; a
// lock holder that dies, and one that is stopped (no one else waits for it; a region it writes into is not
// deregistered); reclaiming what dead processes left. Waits have deadlines and times are only bounded
// loosely: the machines that run this are slow and shared.
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

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kWaitMs = 30000;  // how long anything may take before a test calls it lost

// The fabric of this test program, in a directory of its own so that it meets no other run's entries; removed at
// exit by the process that made it.
std::string fabricDir;
void removeFabricDir() {
  if (DIR* dir = opendir(fabricDir.c_str())) {
    while (dirent* entry = readdir(dir))
      if (entry->d_name[0] != '.') unlink((fabricDir + "/" + entry->d_name).c_str());
    closedir(dir);
  }
  rmdir(fabricDir.c_str());
}

const VerbsApi& api() {
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

ibv_context* openFirstDevice() {
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

int toInit(ibv_qp* qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  return api().modifyQp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

ibv_qp_attr rtrAttr(uint32_t destQpNum, const ibv_gid& dgid, const Link& link) {
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

ibv_qp_attr rtsAttr(const Link& link) {
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

int toRtr(ibv_qp* qp, uint32_t destQpNum, const ibv_gid& dgid, const Link& link = {}) {
  ibv_qp_attr attr = rtrAttr(destQpNum, dgid, link);
  return api().modifyQp(qp, &attr, kRtrMask);
}

// RESET to RTS, connected to `destQpNum` at `dgid`; the first failing modifyQp's result, or 0.
int connectQp(ibv_qp* qp, uint32_t destQpNum, const ibv_gid& dgid, const Link& link = {}) {
  if (int rc = toInit(qp)) return rc;
  if (int rc = toRtr(qp, destQpNum, dgid, link)) return rc;
  ibv_qp_attr attr = rtsAttr(link);
  return api().modifyQp(qp, &attr, kRtsMask);
}

int modifyToState(ibv_qp* qp, ibv_qp_state state) {
  ibv_qp_attr attr{};
  attr.qp_state = state;
  return api().modifyQp(qp, &attr, IBV_QP_STATE);
}

// Whether both sides were made and are now connected to each other.
bool connectBoth(Side& a, Side& b, const Link& link = {}) {
  return a.valid() && b.valid() && connectQp(a.qp, b.qp->qp_num, b.gid(), link) == 0 &&
         connectQp(b.qp, a.qp->qp_num, a.gid(), link) == 0;
}

int postWrite(ibv_qp* qp, uint64_t wrId, ibv_sge* sges, int numSge, uint64_t remoteAddr, uint32_t rkey, bool withImm,
              uint32_t immData, bool signaled) {
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
int rdmaWrite(Side& from, const Side& to, uint64_t wrId, size_t bytes, bool withImm, uint32_t immData = 0,
              size_t offset = 0) {
  ibv_sge sge{reinterpret_cast<uint64_t>(from.buffer.data()), static_cast<uint32_t>(bytes), from.mr->lkey};
  return postWrite(from.qp, wrId, &sge, 1, reinterpret_cast<uint64_t>(to.buffer.data()) + offset, to.mr->rkey, withImm,
                   immData, true);
}

int postRecv(ibv_qp* qp, uint64_t wrId) {
  ibv_recv_wr wr{};
  wr.wr_id = wrId;
  ibv_recv_wr* bad = nullptr;
  return api().postRecv(qp, &wr, &bad);
}

// Polls `cq` until it gives a completion (true) or `timeoutMs` pass.
bool pollOne(ibv_cq* cq, ibv_wc* wc, int timeoutMs = kWaitMs) {
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

// What a peer process tells the other about its end.
struct PeerInfo {
  uint32_t qpNum;
  ibv_gid gid;
  uint64_t addr;
  uint32_t rkey;
};

bool sendInfo(int fd, const PeerInfo& info) { return ::write(fd, &info, sizeof(info)) == sizeof(info); }

bool receiveInfo(int fd, PeerInfo* info) {
  pollfd readable{fd, POLLIN, 0};
  if (poll(&readable, 1, kWaitMs) != 1) return false;
  return read(fd, info, sizeof(*info)) == sizeof(*info);
}

// Runs `body` in a forked child; its result (0: passed, else the number of the check that failed) is the exit
// status. alarm() ends a child that hangs.
pid_t forkChild(const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(kWaitMs / 1000 * 2);
    _exit(body());
  }
  return pid;
}

// The child's exit status, or -1 (and it is killed) when it has not exited within `timeoutMs`.
int waitChild(pid_t pid, int timeoutMs = kWaitMs * 2) {
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

std::string readFile(const std::string& path) {
  std::string text;
  if (FILE* file = std::fopen(path.c_str(), "r")) {
    char buffer[4096];
    size_t got = 0;
    while ((got = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, got);
    std::fclose(file);
  }
  return text;
}

// ---- Tests ----

TEST(Softib, DevicesPortsAndGids) {
  api();
  setenv("LOOM_SOFTIB_DEVICES", "softibA,softibB", 1);
  int count = 0;
  ibv_device** list = api().getDeviceList(&count);
  unsetenv("LOOM_SOFTIB_DEVICES");
  ASSERT_NE(list, nullptr);
  ASSERT_EQ(count, 2);
  EXPECT_EQ(list[2], nullptr);
  EXPECT_STREQ(api().getDeviceName(list[0]), "softibA");
  EXPECT_STREQ(api().getDeviceName(list[1]), "softibB");
  ibv_context* a = api().openDevice(list[0]);
  ibv_context* b = api().openDevice(list[1]);
  api().freeDeviceList(list);
  ASSERT_TRUE(a && b);
  EXPECT_STREQ(a->device->name, "softibA");

  ibv_device_attr device{};
  ASSERT_EQ(api().queryDevice(a, &device), 0);
  EXPECT_GE(device.max_qp_wr, 256);
  EXPECT_GE(device.max_cqe, 1024);
  EXPECT_GE(device.max_sge, 4);
  EXPECT_GT(device.max_mr_size, uint64_t{1} << 32);
  EXPECT_EQ(device.phys_port_cnt, 1);

  ibv_port_attr port{};
  ASSERT_EQ(api().queryPort(a, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(port.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_EQ(port.active_mtu, IBV_MTU_4096);
  EXPECT_EQ(port.lid, 0);
  EXPECT_EQ(port.gid_tbl_len, 2);
  EXPECT_EQ(api().queryPort(a, 2, &port), EINVAL);

  ibv_gid gidA{}, gidB{}, mapped{};
  ASSERT_EQ(api().queryGid(a, 1, 0, &gidA), 0);
  ASSERT_EQ(api().queryGid(b, 1, 0, &gidB), 0);
  EXPECT_EQ(gidA.raw[0], 0xfe);
  EXPECT_EQ(gidA.raw[1], 0x80);
  EXPECT_NE(gidA.global.interface_id, 0u);
  EXPECT_NE(std::memcmp(gidA.raw, gidB.raw, 16), 0) << "each device has its own GID";
  ASSERT_EQ(api().queryGid(a, 1, 1, &mapped), 0);
  const uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  const uint8_t kZero[16] = {};
  EXPECT_TRUE(std::memcmp(mapped.raw, kMappedPrefix, 12) == 0 || std::memcmp(mapped.raw, kZero, 16) == 0)
      << "GID 1 is IPv4-mapped or empty";
  errno = 0;
  EXPECT_EQ(api().queryGid(a, 1, 2, &mapped), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(api().closeDevice(a), 0);
  EXPECT_EQ(api().closeDevice(b), 0);
}

TEST(Softib, StatusTextsMatchLibibverbs) {
  EXPECT_STREQ(api().wcStatusStr(IBV_WC_SUCCESS), "success");
  EXPECT_STREQ(api().wcStatusStr(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
  EXPECT_STREQ(api().wcStatusStr(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error");
  std::string why;
  const VerbsApi* real = libibverbsApi(&why);
  if (real == nullptr) GTEST_SKIP() << why;
  for (int status = IBV_WC_SUCCESS; status <= IBV_WC_TM_RNDV_INCOMPLETE + 1; ++status)
    EXPECT_STREQ(api().wcStatusStr(static_cast<ibv_wc_status>(status)),
                 real->wcStatusStr(static_cast<ibv_wc_status>(status)))
        << "status " << status;
}

TEST(Softib, MemoryRegionKeys) {
  Side a, b;
  ASSERT_TRUE(a.valid() && b.valid());
  EXPECT_NE(a.mr->lkey, 0u);
  EXPECT_NE(a.mr->rkey, 0u);
  EXPECT_NE(a.mr->lkey, b.mr->lkey);
  EXPECT_NE(a.mr->rkey, b.mr->rkey);
  EXPECT_EQ(a.mr->addr, a.buffer.data());
  EXPECT_EQ(a.mr->length, a.buffer.size());
  EXPECT_EQ(a.mr->pd, a.pd);
  EXPECT_EQ(api().deallocPd(a.pd), EBUSY) << "the PD still has a region and a QP";
  errno = 0;
  EXPECT_EQ(api().regMr(a.pd, a.buffer.data(), 64, IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL) << "remote write needs local write";

  ASSERT_TRUE(connectBoth(a, b));
  // An lkey of another PD (b's) is a local protection error, and the QP is in error from then on.
  ibv_sge sge{reinterpret_cast<uint64_t>(a.buffer.data()), 16, b.mr->lkey};
  ASSERT_EQ(postWrite(a.qp, 1, &sge, 1, reinterpret_cast<uint64_t>(b.buffer.data()), b.mr->rkey, false, 0, true), 0);
  ibv_wc wc{};
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << api().wcStatusStr(wc.status);
  EXPECT_EQ(a.qp->state, IBV_QPS_ERR);
}

TEST(Softib, LocalRangeAndRkeyErrors) {
  Side a, b;
  ASSERT_TRUE(connectBoth(a, b));
  // Past the end of the local region.
  ibv_sge sge{reinterpret_cast<uint64_t>(a.buffer.data()) + 8, static_cast<uint32_t>(a.buffer.size()), a.mr->lkey};
  ASSERT_EQ(postWrite(a.qp, 1, &sge, 1, reinterpret_cast<uint64_t>(b.buffer.data()), b.mr->rkey, false, 0, true), 0);
  ibv_wc wc{};
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << api().wcStatusStr(wc.status);

  // A bad rkey fails as a remote access error and takes the sender to the error state, flushing what follows; the
  // responder is not touched.
  Side c, d;
  ASSERT_TRUE(connectBoth(c, d));
  ASSERT_EQ(postRecv(d.qp, 50), 0);
  sge = {reinterpret_cast<uint64_t>(c.buffer.data()), 16, c.mr->lkey};
  ASSERT_EQ(postWrite(c.qp, 1, &sge, 1, reinterpret_cast<uint64_t>(d.buffer.data()), d.mr->rkey ^ 0x100, true, 7, true),
            0);
  ASSERT_EQ(postWrite(c.qp, 2, &sge, 1, reinterpret_cast<uint64_t>(d.buffer.data()), d.mr->rkey, true, 7, false), 0);
  ASSERT_TRUE(pollOne(c.cq, &wc));
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << api().wcStatusStr(wc.status);
  ASSERT_TRUE(pollOne(c.cq, &wc));
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR) << "an unsignaled request completes when flushed";
  EXPECT_EQ(c.qp->state, IBV_QPS_ERR);
  EXPECT_EQ(d.qp->state, IBV_QPS_RTS);
  EXPECT_EQ(api().pollCq(d.cq, 1, &wc), 0) << "the responder's receive stays posted";
}

TEST(Softib, RemoteAccessErrors) {
  // A region without remote write, and a range past the end of one that has it.
  Side a, b(4096, SideOptions{16, 16, false, IBV_ACCESS_LOCAL_WRITE});
  ASSERT_TRUE(connectBoth(a, b));
  ASSERT_EQ(rdmaWrite(a, b, 1, 64, false), 0);
  ibv_wc wc{};
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << api().wcStatusStr(wc.status);

  Side c, d;
  ASSERT_TRUE(connectBoth(c, d));
  ASSERT_EQ(rdmaWrite(c, d, 2, 64, false, 0, d.buffer.size() - 32), 0);
  ASSERT_TRUE(pollOne(c.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << api().wcStatusStr(wc.status);
  EXPECT_EQ(c.qp->state, IBV_QPS_ERR);
}

TEST(Softib, QpStateMachine) {
  Side a, b;
  ASSERT_TRUE(a.valid() && b.valid());
  EXPECT_EQ(a.qp->state, IBV_QPS_RESET);
  EXPECT_EQ(a.qp->qp_type, IBV_QPT_RC);
  EXPECT_EQ(a.qp->send_cq, a.cq);
  EXPECT_EQ(a.qp->pd, a.pd);
  EXPECT_NE(a.qp->qp_num, b.qp->qp_num);
  EXPECT_LT(a.qp->qp_num, 1u << 24);

  ibv_qp_init_attr ud{};
  ud.send_cq = ud.recv_cq = a.cq;
  ud.qp_type = IBV_QPT_UD;
  ud.cap.max_send_wr = 1;
  EXPECT_EQ(api().createQp(a.pd, &ud), nullptr) << "only RC";

  ibv_qp_attr attr = rtrAttr(b.qp->qp_num, b.gid(), {});
  EXPECT_EQ(api().modifyQp(a.qp, &attr, kRtrMask), EINVAL) << "RESET cannot go to RTR";
  attr = {};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  EXPECT_EQ(api().modifyQp(a.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL)
      << "INIT needs ACCESS_FLAGS";
  attr.port_num = 2;
  EXPECT_EQ(api().modifyQp(a.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), EINVAL)
      << "there is no port 2";
  ASSERT_EQ(toInit(a.qp), 0);
  EXPECT_EQ(a.qp->state, IBV_QPS_INIT);
  EXPECT_EQ(rdmaWrite(a, b, 1, 8, false), EINVAL) << "sends need RTS";

  attr = rtrAttr(b.qp->qp_num, b.gid(), {});
  EXPECT_EQ(api().modifyQp(a.qp, &attr, kRtrMask & ~IBV_QP_MIN_RNR_TIMER), EINVAL) << "RTR needs MIN_RNR_TIMER";
  EXPECT_EQ(api().modifyQp(a.qp, &attr, kRtrMask | IBV_QP_SQ_PSN), EINVAL) << "SQ_PSN belongs to RTS";
  attr.ah_attr.is_global = 0;
  EXPECT_EQ(api().modifyQp(a.qp, &attr, kRtrMask), EINVAL) << "an Ethernet port needs a GRH";
  attr = rtrAttr(b.qp->qp_num, b.gid(), {});
  ASSERT_EQ(api().modifyQp(a.qp, &attr, kRtrMask), 0);
  EXPECT_EQ(a.qp->state, IBV_QPS_RTR);
  EXPECT_EQ(postRecv(a.qp, 1), 0) << "receives may be posted from INIT on";
  EXPECT_EQ(rdmaWrite(a, b, 1, 8, false), EINVAL) << "sends need RTS";

  attr = rtsAttr({});
  EXPECT_EQ(api().modifyQp(a.qp, &attr, kRtsMask & ~IBV_QP_SQ_PSN), EINVAL) << "RTS needs SQ_PSN";
  ASSERT_EQ(api().modifyQp(a.qp, &attr, kRtsMask), 0);
  EXPECT_EQ(a.qp->state, IBV_QPS_RTS);
  attr = {};
  attr.min_rnr_timer = 3;
  EXPECT_EQ(api().modifyQp(a.qp, &attr, IBV_QP_MIN_RNR_TIMER), 0) << "RTS to RTS may change the RNR timer";
  EXPECT_EQ(api().modifyQp(a.qp, &attr, IBV_QP_DEST_QPN), EINVAL) << "but not the destination";

  ASSERT_EQ(modifyToState(a.qp, IBV_QPS_ERR), 0);
  EXPECT_EQ(a.qp->state, IBV_QPS_ERR);
  attr = {};
  attr.qp_state = IBV_QPS_INIT;
  EXPECT_EQ(api().modifyQp(a.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), EINVAL)
      << "ERR goes only to RESET";
  ASSERT_EQ(modifyToState(a.qp, IBV_QPS_RESET), 0);
  EXPECT_EQ(postRecv(a.qp, 1), EINVAL) << "no receives in RESET";
  EXPECT_EQ(connectQp(a.qp, b.qp->qp_num, b.gid()), 0) << "a reset QP connects again";
  EXPECT_EQ(api().destroyCq(a.cq), EBUSY) << "a QP still uses it";
}

TEST(Softib, WriteWithImmediateInOneProcess) {
  Side a, b;
  ASSERT_TRUE(connectBoth(a, b));
  for (size_t i = 0; i < a.buffer.size(); ++i) a.buffer[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_EQ(postRecv(b.qp, 77), 0);
  // Two local pieces land one after the other.
  ibv_sge sges[2] = {{reinterpret_cast<uint64_t>(a.buffer.data()), 100, a.mr->lkey},
                     {reinterpret_cast<uint64_t>(a.buffer.data()) + 1000, 200, a.mr->lkey}};
  const uint32_t imm = htonl(0x1234abcd);
  ASSERT_EQ(postWrite(a.qp, 5, sges, 2, reinterpret_cast<uint64_t>(b.buffer.data()) + 16, b.mr->rkey, true, imm, true),
            0);
  ibv_wc wc{};
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << api().wcStatusStr(wc.status);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wc.byte_len, 300u);
  EXPECT_EQ(wc.qp_num, a.qp->qp_num);
  ASSERT_TRUE(pollOne(b.cq, &wc));
  EXPECT_EQ(wc.wr_id, 77u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(wc.imm_data, imm) << "immediate data travels in network order, untouched";
  EXPECT_EQ(wc.byte_len, 300u);
  EXPECT_EQ(wc.qp_num, b.qp->qp_num);
  EXPECT_EQ(wc.src_qp, a.qp->qp_num);
  EXPECT_EQ(std::memcmp(b.buffer.data() + 16, a.buffer.data(), 100), 0);
  EXPECT_EQ(std::memcmp(b.buffer.data() + 116, a.buffer.data() + 1000, 200), 0);
  EXPECT_EQ(b.buffer[15], 0);
  EXPECT_EQ(b.buffer[316], 0);

  // An unsignaled plain write moves its data without a completion; a zero-byte write with immediate needs no key.
  ibv_sge one{reinterpret_cast<uint64_t>(a.buffer.data()), 64, a.mr->lkey};
  ASSERT_EQ(
      postWrite(a.qp, 6, &one, 1, reinterpret_cast<uint64_t>(b.buffer.data()) + 2048, b.mr->rkey, false, 0, false), 0);
  ASSERT_EQ(postRecv(b.qp, 78), 0);
  ASSERT_EQ(postWrite(a.qp, 7, nullptr, 0, 0, 0, true, htonl(9), true), 0);
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.wr_id, 7u) << "the unsignaled write has no completion";
  ASSERT_TRUE(pollOne(b.cq, &wc));
  EXPECT_EQ(wc.wr_id, 78u);
  EXPECT_EQ(wc.byte_len, 0u);
  EXPECT_EQ(std::memcmp(b.buffer.data() + 2048, a.buffer.data(), 64), 0);
}

TEST(Softib, CompletionChannelInOneProcess) {
  Side a, b(4096, SideOptions{16, 16, true});
  ASSERT_TRUE(a.valid() && b.valid() && b.channel != nullptr);
  EXPECT_EQ(b.cq->channel, b.channel);
  EXPECT_EQ(api().destroyCompChannel(b.channel), EBUSY) << "a CQ still uses it";
  ASSERT_TRUE(connectBoth(a, b));
  fcntl(b.channel->fd, F_SETFL, fcntl(b.channel->fd, F_GETFL) | O_NONBLOCK);
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  errno = 0;
  EXPECT_EQ(api().getCqEvent(b.channel, &cq, &context), -1);
  EXPECT_EQ(errno, EAGAIN);

  ASSERT_EQ(api().reqNotifyCq(b.cq, 0), 0);
  ASSERT_EQ(postRecv(b.qp, 1), 0);
  ASSERT_EQ(postRecv(b.qp, 2), 0);
  ASSERT_EQ(rdmaWrite(a, b, 10, 32, true), 0);
  ASSERT_EQ(rdmaWrite(a, b, 11, 32, true), 0);
  ibv_wc wc{};
  ASSERT_TRUE(pollOne(a.cq, &wc));
  ASSERT_TRUE(pollOne(a.cq, &wc));
  pollfd readable{b.channel->fd, POLLIN, 0};
  ASSERT_EQ(poll(&readable, 1, kWaitMs), 1);
  ASSERT_EQ(api().getCqEvent(b.channel, &cq, &context), 0);
  EXPECT_EQ(cq, b.cq);
  EXPECT_EQ(context, &b);
  EXPECT_EQ(api().getCqEvent(b.channel, &cq, &context), -1) << "one event per arming";
  api().ackCqEvents(cq, 1);
  EXPECT_EQ(b.cq->comp_events_completed, 1u);
  ibv_wc both[4];
  EXPECT_EQ(api().pollCq(b.cq, 4, both), 2);
}

TEST(Softib, ReceiverNotReady) {
  Side a, b;
  ASSERT_TRUE(connectBoth(a, b));  // rnr_retry 7: for ever
  std::fill(a.buffer.begin(), a.buffer.end(), 0x5a);
  ASSERT_EQ(rdmaWrite(a, b, 1, 128, true, htonl(3)), 0);
  ibv_wc wc{};
  EXPECT_FALSE(pollOne(a.cq, &wc, 100)) << "the write waits for a receive";
  ASSERT_EQ(postRecv(b.qp, 40), 0);
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << api().wcStatusStr(wc.status);
  ASSERT_TRUE(pollOne(b.cq, &wc));
  EXPECT_EQ(wc.wr_id, 40u);
  EXPECT_EQ(b.buffer[127], 0x5a);

  // With a finite rnr_retry the requester gives up.
  Side c, d;
  Link link;
  link.rnrRetry = 2;
  link.minRnrTimer = 1;  // 10 us
  ASSERT_TRUE(connectBoth(c, d, link));
  ASSERT_EQ(rdmaWrite(c, d, 2, 16, true), 0);
  ASSERT_TRUE(pollOne(c.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR) << api().wcStatusStr(wc.status);
  EXPECT_EQ(c.qp->state, IBV_QPS_ERR);
}

TEST(Softib, ASleepingRequesterWakesWhenItsResponderCanTakeTheWrite) {
  // The requester sleeps on its channel while its write waits (RNR NAKs, the longest timer); a receive posted at
  // the responder wakes it, and the next poll carries the write out. Likewise a responder reaching RTR.
  Side a(4096, SideOptions{16, 16, true}), b;
  Link link;
  link.minRnrTimer = 0;  // 655 ms between resends
  ASSERT_TRUE(connectBoth(a, b, link));
  ASSERT_EQ(rdmaWrite(a, b, 1, 64, true), 0);
  ibv_wc wc{};
  ASSERT_EQ(api().reqNotifyCq(a.cq, 0), 0);
  ASSERT_EQ(api().pollCq(a.cq, 1, &wc), 0);
  ASSERT_EQ(postRecv(b.qp, 9), 0);
  pollfd readable{a.channel->fd, POLLIN, 0};
  ASSERT_EQ(poll(&readable, 1, kWaitMs), 1);
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  ASSERT_EQ(api().getCqEvent(a.channel, &cq, &context), 0);
  api().ackCqEvents(cq, 1);
  ASSERT_EQ(api().pollCq(a.cq, 1, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << api().wcStatusStr(wc.status);

  Side c(4096, SideOptions{16, 16, true}), d;
  ASSERT_TRUE(c.valid() && d.valid());
  ASSERT_EQ(connectQp(c.qp, d.qp->qp_num, d.gid()), 0);
  ASSERT_EQ(rdmaWrite(c, d, 2, 64, false), 0);
  ASSERT_EQ(api().reqNotifyCq(c.cq, 0), 0);
  ASSERT_EQ(api().pollCq(c.cq, 1, &wc), 0);
  ASSERT_EQ(toInit(d.qp), 0);
  ASSERT_EQ(toRtr(d.qp, c.qp->qp_num, c.gid()), 0);
  readable = {c.channel->fd, POLLIN, 0};
  ASSERT_EQ(poll(&readable, 1, kWaitMs), 1);
  ASSERT_EQ(api().getCqEvent(c.channel, &cq, &context), 0);
  api().ackCqEvents(cq, 1);
  ASSERT_EQ(api().pollCq(c.cq, 1, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << api().wcStatusStr(wc.status);
}

TEST(Softib, InlineDataIsTakenWhenPosted) {
  Side a, b;
  ASSERT_TRUE(connectBoth(a, b));
  // The QP was made without inline room: an inline write is refused.
  std::memset(a.buffer.data(), 0x11, 32);
  ibv_sge sge{reinterpret_cast<uint64_t>(a.buffer.data()), 32, 0xdead};  // inline data needs no key
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(b.buffer.data());
  wr.wr.rdma.rkey = b.mr->rkey;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(api().postSend(a.qp, &wr, &bad), EINVAL);

  ibv_qp_init_attr withInline{};
  withInline.send_cq = withInline.recv_cq = a.cq;
  withInline.qp_type = IBV_QPT_RC;
  withInline.cap.max_send_wr = 4;
  withInline.cap.max_send_sge = 1;
  withInline.cap.max_inline_data = 64;
  ibv_qp* qp = api().createQp(a.pd, &withInline);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(modifyToState(b.qp, IBV_QPS_RESET), 0);
  ASSERT_EQ(connectQp(qp, b.qp->qp_num, b.gid()), 0);
  ASSERT_EQ(connectQp(b.qp, qp->qp_num, a.gid()), 0);
  // No receive yet: the write waits, and what it sends is what the buffer held when it was posted.
  ASSERT_EQ(api().postSend(qp, &wr, &bad), 0);
  std::memset(a.buffer.data(), 0x22, 32);
  ibv_wc wc{};
  EXPECT_EQ(api().pollCq(a.cq, 1, &wc), 0);
  ASSERT_EQ(postRecv(b.qp, 5), 0);
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << api().wcStatusStr(wc.status);
  EXPECT_EQ(b.buffer[0], 0x11);
  EXPECT_EQ(b.buffer[31], 0x11);
  EXPECT_EQ(api().destroyQp(qp), 0);
}

TEST(Softib, ErrorFlushesPostedReceivesAndSends) {
  Side a, b;
  ASSERT_TRUE(connectBoth(a, b));
  for (uint64_t id = 100; id < 103; ++id) ASSERT_EQ(postRecv(a.qp, id), 0);
  // A write to nobody (b is reset) waits; moving a to ERR flushes it too.
  ASSERT_EQ(modifyToState(b.qp, IBV_QPS_RESET), 0);
  ASSERT_EQ(rdmaWrite(a, b, 9, 8, false), 0);
  ibv_wc wc{};
  EXPECT_EQ(api().pollCq(a.cq, 1, &wc), 0);
  ASSERT_EQ(modifyToState(a.qp, IBV_QPS_ERR), 0);
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.wr_id, 9u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  for (uint64_t id = 100; id < 103; ++id) {
    ASSERT_TRUE(pollOne(a.cq, &wc));
    EXPECT_EQ(wc.wr_id, id);
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wc.qp_num, a.qp->qp_num);
  }
  // In ERR, new work completes flushed at once.
  ASSERT_EQ(postRecv(a.qp, 104), 0);
  ASSERT_EQ(rdmaWrite(a, b, 10, 8, false), 0);
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.wr_id, 104u);
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.wr_id, 10u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
}

TEST(Softib, SendQueueSlotsFreeWithPolledCompletions) {
  Side a(4096, SideOptions{4, 16, false}), b;
  ASSERT_TRUE(connectBoth(a, b));
  ibv_sge sge{reinterpret_cast<uint64_t>(a.buffer.data()), 8, a.mr->lkey};
  auto post = [&](uint64_t id, bool signaled) {
    return postWrite(a.qp, id, &sge, 1, reinterpret_cast<uint64_t>(b.buffer.data()), b.mr->rkey, false, 0, signaled);
  };
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_EQ(post(id, false), 0);
  ASSERT_EQ(post(4, true), 0);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(b.buffer.data());
  wr.wr.rdma.rkey = b.mr->rkey;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(api().postSend(a.qp, &wr, &bad), ENOMEM) << "four slots, none freed yet";
  EXPECT_EQ(bad, &wr);
  ibv_wc wc{};
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.wr_id, 4u);
  for (uint64_t id = 5; id <= 8; ++id) EXPECT_EQ(post(id, true), 0) << "the completion freed all four";
  wr.opcode = IBV_WR_SEND;
  EXPECT_EQ(api().postSend(a.qp, &wr, &bad), EINVAL) << "only RDMA writes";
}

TEST(Softib, AcrossProcessesWithAChannel) {
  api();
  Side parent;
  ASSERT_TRUE(parent.valid());
  Pipes pipes;
  for (size_t i = 0; i < parent.buffer.size(); ++i) parent.buffer[i] = static_cast<uint8_t>(i * 13 + 5);
  const uint32_t imm = htonl(0xfeed);
  pid_t child = forkChild([&] {
    // The child: a QP whose receive completions wake it through its channel.
    Side self(8192, SideOptions{16, 16, true});
    if (!self.valid() || self.channel == nullptr) return 1;
    PeerInfo peer{};
    if (!receiveInfo(pipes.toChild[0], &peer)) return 2;
    if (connectQp(self.qp, peer.qpNum, peer.gid) != 0) return 3;
    if (postRecv(self.qp, 500) != 0 || api().reqNotifyCq(self.cq, 0) != 0) return 4;
    PeerInfo mine{self.qp->qp_num, self.gid(), reinterpret_cast<uint64_t>(self.buffer.data()), self.mr->rkey};
    if (!sendInfo(pipes.toParent[1], mine)) return 5;
    pollfd readable{self.channel->fd, POLLIN, 0};
    if (poll(&readable, 1, kWaitMs) != 1) return 6;
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    if (api().getCqEvent(self.channel, &cq, &context) != 0 || cq != self.cq) return 7;
    api().ackCqEvents(cq, 1);
    ibv_wc wc{};
    if (api().pollCq(self.cq, 1, &wc) != 1) return 8;
    if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 500 || wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM) return 9;
    if (wc.imm_data != imm || wc.byte_len != 4000 || wc.src_qp != peer.qpNum) return 10;
    for (size_t i = 0; i < 4000; ++i)
      if (self.buffer[1000 + i] != static_cast<uint8_t>(i * 13 + 5)) return 11;
    return 0;
  });
  ASSERT_GT(child, 0);
  PeerInfo mine{parent.qp->qp_num, parent.gid(), 0, 0};
  ASSERT_TRUE(sendInfo(pipes.toChild[1], mine));
  PeerInfo peer{};
  ASSERT_TRUE(receiveInfo(pipes.toParent[0], &peer));
  ASSERT_EQ(connectQp(parent.qp, peer.qpNum, peer.gid), 0);
  ibv_sge sge{reinterpret_cast<uint64_t>(parent.buffer.data()), 4000, parent.mr->lkey};
  ASSERT_EQ(postWrite(parent.qp, 1, &sge, 1, peer.addr + 1000, peer.rkey, true, imm, true), 0);
  ibv_wc wc{};
  ASSERT_TRUE(pollOne(parent.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << api().wcStatusStr(wc.status);
  EXPECT_EQ(waitChild(child), 0) << "the child's failed check";
}

TEST(Softib, DeadPeerExceedsTheRetryCount) {
  api();
  Side parent;
  ASSERT_TRUE(parent.valid());
  Pipes pipes;
  pid_t child = forkChild([&] {
    Side self;
    PeerInfo peer{};
    if (!self.valid() || !receiveInfo(pipes.toChild[0], &peer)) return 1;
    if (connectQp(self.qp, peer.qpNum, peer.gid) != 0) return 2;
    PeerInfo mine{self.qp->qp_num, self.gid(), reinterpret_cast<uint64_t>(self.buffer.data()), self.mr->rkey};
    return sendInfo(pipes.toParent[1], mine) ? 0 : 3;  // and it dies at once, leaving its QP behind
  });
  ASSERT_GT(child, 0);
  ASSERT_TRUE(sendInfo(pipes.toChild[1], PeerInfo{parent.qp->qp_num, parent.gid(), 0, 0}));
  PeerInfo peer{};
  ASSERT_TRUE(receiveInfo(pipes.toParent[0], &peer));
  ASSERT_EQ(waitChild(child), 0);
  Link link;
  link.timeout = 8;  // 4.096 us x 256 x (1 + 1): about 2.1 ms
  link.retryCnt = 1;
  ASSERT_EQ(connectQp(parent.qp, peer.qpNum, peer.gid, link), 0);
  const auto expected = std::chrono::nanoseconds(4096 * 256 * 2);
  auto start = Clock::now();
  ibv_sge sge{reinterpret_cast<uint64_t>(parent.buffer.data()), 64, parent.mr->lkey};
  ASSERT_EQ(postWrite(parent.qp, 1, &sge, 1, peer.addr, peer.rkey, false, 0, true), 0);
  ASSERT_EQ(postWrite(parent.qp, 2, &sge, 1, peer.addr, peer.rkey, false, 0, false), 0);
  ASSERT_EQ(postRecv(parent.qp, 3), 0);
  ibv_wc wc{};
  ASSERT_TRUE(pollOne(parent.cq, &wc));
  auto took = Clock::now() - start;
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << api().wcStatusStr(wc.status);
  EXPECT_GE(took, expected) << "the requester resends for the whole transport timeout";
  EXPECT_LT(took, std::chrono::seconds(10));
  ASSERT_TRUE(pollOne(parent.cq, &wc));
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  ASSERT_TRUE(pollOne(parent.cq, &wc));
  EXPECT_EQ(wc.wr_id, 3u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(parent.qp->state, IBV_QPS_ERR);
}

TEST(Softib, WritesThatReachNoResponderTimeOut) {
  // Three ways to miss: a GID the responder's port does not have, a responder connected to another QP, and one
  // that never left INIT. Each write is resent for the transport timeout, then fails.
  Link link;
  link.timeout = 8;
  link.retryCnt = 1;
  for (int way = 0; way < 3; ++way) {
    Side a, b, other;
    ASSERT_TRUE(a.valid() && b.valid() && other.valid());
    ibv_gid dgid = b.gid();
    if (way == 0) dgid.raw[15] ^= 1;
    ASSERT_EQ(connectQp(a.qp, b.qp->qp_num, dgid, link), 0);
    int rc = way == 0   ? connectQp(b.qp, a.qp->qp_num, a.gid())
             : way == 1 ? connectQp(b.qp, other.qp->qp_num, other.gid())
                        : toInit(b.qp);
    ASSERT_EQ(rc, 0) << "way " << way;
    ASSERT_EQ(rdmaWrite(a, b, 1, 8, false), 0);
    ibv_wc wc{};
    ASSERT_TRUE(pollOne(a.cq, &wc)) << "way " << way;
    EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << "way " << way << ": " << api().wcStatusStr(wc.status);
    EXPECT_EQ(b.buffer[0], 0) << "way " << way;
  }
}

TEST(Softib, QpErrorFault) {
  api();
  // The setting is read once per process, so a child that sets it before its first write tries it.
  pid_t child = forkChild([] {
    setenv("LOOM_SOFTIB_FAULT", "qp_error:3", 1);
    Side a, b;
    if (!connectBoth(a, b)) return 1;
    for (uint64_t id = 1; id <= 5; ++id)
      if (rdmaWrite(a, b, id, 8, false) != 0) return 2;
    const ibv_wc_status expected[] = {IBV_WC_SUCCESS, IBV_WC_SUCCESS, IBV_WC_RETRY_EXC_ERR, IBV_WC_WR_FLUSH_ERR,
                                      IBV_WC_WR_FLUSH_ERR};
    for (uint64_t id = 1; id <= 5; ++id) {
      ibv_wc wc{};
      if (!pollOne(a.cq, &wc) || wc.wr_id != id) return 3;
      if (wc.status != expected[id - 1]) return 10 + static_cast<int>(id);
    }
    return a.qp->state == IBV_QPS_ERR && b.qp->state == IBV_QPS_RTS ? 0 : 4;
  });
  ASSERT_GT(child, 0);
  EXPECT_EQ(waitChild(child), 0) << "the child's failed check";
}

TEST(Softib, ThreadsShareTheDevice) {
  // Pairs of QPs whose ends run on different threads, all at once: each sender writes messages with immediate from
  // kSlots slots of its buffer into kSlots slots of its receiver's, three unsignaled writes between signaled ones.
  // It reuses a source slot once a later write has completed, and a destination slot once the receiver has taken
  // the message in it (its credit).
  constexpr int kPairs = 3;
  constexpr int kMessages = 400;
  constexpr int kSlots = 8;
  constexpr size_t kSlotBytes = 256;
  struct Pair {
    Side sender{kSlots * kSlotBytes};
    Side receiver{kSlots * kSlotBytes, SideOptions{16, kSlots, false}};
    std::atomic<int> taken{0};
    int senderFailures = 0;
    int receiverFailures = 0;
  };
  std::vector<std::unique_ptr<Pair>> pairs;
  for (int p = 0; p < kPairs; ++p) {
    pairs.push_back(std::make_unique<Pair>());
    ASSERT_TRUE(connectBoth(pairs[p]->sender, pairs[p]->receiver));
    for (int slot = 0; slot < kSlots; ++slot) ASSERT_EQ(postRecv(pairs[p]->receiver.qp, slot), 0);
  }
  std::vector<std::thread> threads;
  for (int p = 0; p < kPairs; ++p) {
    Pair& pair = *pairs[p];
    threads.emplace_back([&pair, p] {
      Side& a = pair.sender;
      for (int m = 0; m < kMessages; ++m) {
        auto end = Clock::now() + std::chrono::milliseconds(kWaitMs);
        while (m - pair.taken.load() >= kSlots && Clock::now() < end) std::this_thread::yield();
        uint8_t* source = a.buffer.data() + (m % kSlots) * kSlotBytes;
        std::fill(source, source + kSlotBytes, static_cast<uint8_t>(m * 3 + p));
        ibv_sge sge{reinterpret_cast<uint64_t>(source), kSlotBytes, a.mr->lkey};
        uint64_t remote = reinterpret_cast<uint64_t>(pair.receiver.buffer.data()) + (m % kSlots) * kSlotBytes;
        bool signaled = m % 4 == 3;
        if (postWrite(a.qp, m, &sge, 1, remote, pair.receiver.mr->rkey, true, htonl(m), signaled) != 0) {
          ++pair.senderFailures;
          continue;
        }
        ibv_wc wc{};
        if (signaled && (!pollOne(a.cq, &wc) || wc.status != IBV_WC_SUCCESS || wc.wr_id != uint64_t(m)))
          ++pair.senderFailures;
      }
    });
    threads.emplace_back([&pair, p] {
      Side& b = pair.receiver;
      for (int m = 0; m < kMessages; ++m) {
        ibv_wc wc{};
        if (!pollOne(b.cq, &wc) || wc.status != IBV_WC_SUCCESS || wc.imm_data != htonl(m) ||
            wc.wr_id != uint64_t(m % kSlots)) {
          ++pair.receiverFailures;
          break;
        }
        const uint8_t* slot = b.buffer.data() + (m % kSlots) * kSlotBytes;
        if (slot[0] != static_cast<uint8_t>(m * 3 + p) || slot[kSlotBytes - 1] != slot[0]) ++pair.receiverFailures;
        if (postRecv(b.qp, m % kSlots) != 0) ++pair.receiverFailures;
        pair.taken.store(m + 1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int p = 0; p < kPairs; ++p) {
    EXPECT_EQ(pairs[p]->senderFailures, 0) << "pair " << p;
    EXPECT_EQ(pairs[p]->receiverFailures, 0) << "pair " << p;
  }
}

// Not a test of its own: the body of the processes that ProcessesStartingAtOnceShareOneFabric starts. It opens
// the fabric of LOOM_SOFTIB_DIR (the parent's choice), makes a QP there and writes its number to a file.
TEST(Softib, StartingAtOnceChild) {
  const char* out = std::getenv("SOFTIB_TEST_CHILD_OUT");
  if (out == nullptr) GTEST_SKIP() << "runs only as a child of ProcessesStartingAtOnceShareOneFabric";
  std::string why;
  const VerbsApi* table = softibApi(&why);
  ASSERT_NE(table, nullptr) << why;
  int count = 0;
  ibv_device** list = table->getDeviceList(&count);
  ASSERT_GT(count, 0);
  ibv_context* context = table->openDevice(list[0]);
  table->freeDeviceList(list);
  ibv_pd* pd = table->allocPd(context);
  ibv_cq* cq = table->createCq(context, 4, nullptr, nullptr, 0);
  ASSERT_TRUE(pd && cq);
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  ibv_qp* qp = table->createQp(pd, &init);
  ASSERT_NE(qp, nullptr);
  FILE* file = std::fopen(out, "w");
  ASSERT_NE(file, nullptr);
  std::fprintf(file, "%u\n", qp->qp_num);
  std::fclose(file);
}

TEST(Softib, ProcessesStartingAtOnceShareOneFabric) {
  // Processes that find no fabric all try to create it at once: every one ends up in the same one (their QPs
  // have distinct numbers), and no half-made file is left behind.
  constexpr int kProcesses = 4;
  char dir[] = "/dev/shm/loom-softib-race-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  int start[2];
  ASSERT_EQ(pipe(start), 0);
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      close(start[1]);
      char byte;
      (void)!read(start[0], &byte, 1);  // returns when the parent closes its end: all go at once
      setenv("LOOM_SOFTIB_DIR", dir, 1);
      setenv("SOFTIB_TEST_CHILD_OUT", (std::string(dir) + "/qp-" + std::to_string(i)).c_str(), 1);
      int log = open((std::string(dir) + "/log-" + std::to_string(i)).c_str(), O_WRONLY | O_CREAT, 0600);
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
      execl("/proc/self/exe", "unit_softib", "--gtest_filter=Softib.StartingAtOnceChild", nullptr);
      _exit(127);
    }
    ASSERT_GT(pid, 0);
    children.push_back(pid);
  }
  close(start[0]);
  close(start[1]);
  bool childFailed = false;
  for (pid_t child : children) {
    int status = waitChild(child);
    EXPECT_EQ(status, 0);
    childFailed |= status != 0;
  }
  std::vector<std::string> fabrics, others;
  std::vector<unsigned> qpNums;
  if (DIR* listing = opendir(dir)) {
    while (dirent* entry = readdir(listing)) {
      std::string name = entry->d_name, path = std::string(dir) + "/" + name;
      if (name == "." || name == "..") continue;
      if (name.rfind("log-", 0) == 0) {
        if (childFailed) std::printf("--- %s\n%s", name.c_str(), readFile(path).c_str());
      } else if (name.rfind("qp-", 0) == 0) {
        qpNums.push_back(static_cast<unsigned>(std::strtoul(readFile(path).c_str(), nullptr, 10)));
      } else {
        (name.find(".init-") == std::string::npos ? fabrics : others).push_back(name);
      }
      unlink(path.c_str());
    }
    closedir(listing);
  }
  rmdir(dir);
  EXPECT_EQ(fabrics.size(), 1u);
  EXPECT_TRUE(others.empty()) << others.front();
  ASSERT_EQ(qpNums.size(), static_cast<size_t>(kProcesses));
  std::sort(qpNums.begin(), qpNums.end());
  EXPECT_EQ(std::unique(qpNums.begin(), qpNums.end()), qpNums.end()) << "each QP has a number of its own";
}

TEST(Softib, ALockHolderThatDiesWedgesNobody) {
  std::string why;
  api();
  softib::Fabric* fabric = softib::Fabric::get(&why);
  ASSERT_NE(fabric, nullptr) << why;
  pid_t child = forkChild([fabric] {
    fabric->lock();
    return 0;  // exits holding the fabric's lock
  });
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitChild(child), 0);
  Side a, b;
  ASSERT_TRUE(connectBoth(a, b)) << "the next locker takes the lock over";
  ASSERT_EQ(rdmaWrite(a, b, 1, 8, false), 0);
  ibv_wc wc{};
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// A forked child that takes the fabric's lock (and, with `writingRkey`, announces a write into that region, as a
// writer between its check and its copy does), says so, and holds it until the parent writes a byte; it is
// stopped meanwhile. The parent waits until it is.
struct StoppedLockHolder {
  explicit StoppedLockHolder(softib::Fabric* fabric, uint32_t writingRkey = 0) {
    pid = forkChild([&, fabric, writingRkey] {
      if (!fabric->lock()) return 1;
      if (writingRkey != 0) softib::atomicStore(fabric->tables().header.writingRkey, writingRkey, softib::kOrdered);
      if (::write(pipes.toParent[1], "h", 1) != 1) return 2;
      char go = 0;
      if (read(pipes.toChild[0], &go, 1) != 1) return 3;
      if (writingRkey != 0) softib::atomicStore(fabric->tables().header.writingRkey, 0u, softib::kOrdered);
      fabric->unlock();
      return 0;
    });
    char held = 0;
    pollfd readable{pipes.toParent[0], POLLIN, 0};
    if (pid <= 0 || poll(&readable, 1, kWaitMs) != 1 || read(pipes.toParent[0], &held, 1) != 1) return;
    kill(pid, SIGSTOP);
    const std::string stat = "/proc/" + std::to_string(pid) + "/stat";
    for (auto end = Clock::now() + std::chrono::milliseconds(kWaitMs); Clock::now() < end;) {
      const std::string text = readFile(stat);
      const size_t close = text.rfind(')');
      if (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'T') {
        stopped = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  // Resumed, it lets the lock go and exits 0; killed, it dies holding it. Its exit status.
  int end(bool resume) {
    if (resume) {
      kill(pid, SIGCONT);
      if (::write(pipes.toChild[1], "g", 1) != 1) return -2;
    } else {
      kill(pid, SIGKILL);
    }
    return waitChild(pid);
  }
  Pipes pipes;
  pid_t pid = -1;
  bool stopped = false;
};

// A process stopped while it holds the fabric's lock (SIGSTOP, say, in the middle of a write) stalls nobody: QPs
// are made, connected and destroyed, receives posted, CQs armed, regions registered and deregistered, all at
// once; a write waits in its send queue; and it goes out once the holder is resumed, or killed.
TEST(Softib, ALockHolderThatIsStoppedStallsNobody) {
  std::string why;
  api();
  softib::Fabric* fabric = softib::Fabric::get(&why);
  ASSERT_NE(fabric, nullptr) << why;
  for (bool resume : {true, false}) {
    SCOPED_TRACE(resume ? "the holder is resumed" : "the holder is killed");
    StoppedLockHolder holder(fabric);
    ASSERT_TRUE(holder.stopped) << "the lock holder did not stop";
    const Clock::time_point start = Clock::now();
    Side a, b;
    ASSERT_TRUE(connectBoth(a, b)) << "QPs connect while a stopped process holds the lock";
    std::fill(a.buffer.begin(), a.buffer.end(), uint8_t{0x5a});
    ASSERT_EQ(postRecv(b.qp, 7), 0);
    ASSERT_EQ(rdmaWrite(a, b, 1, 64, true, htonl(42)), 0);
    ibv_wc wc{};
    EXPECT_FALSE(pollOne(a.cq, &wc, 200)) << "the write cannot move while the holder is stopped";
    EXPECT_EQ(b.buffer[0], 0);
    EXPECT_EQ(api().reqNotifyCq(a.cq, 0), 0);
    std::vector<uint8_t> other(4096);
    ibv_mr* mr = api().regMr(a.pd, other.data(), other.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(mr, nullptr);
    EXPECT_EQ(api().deregMr(mr), 0) << "no write is landing in it";
    {
      Side c;
      EXPECT_TRUE(c.valid());
    }  // destroyed: its QP, CQ, region and PD
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0) << "every call returned promptly";
    ASSERT_EQ(holder.end(resume), resume ? 0 : 128 + SIGKILL);
    ASSERT_TRUE(pollOne(a.cq, &wc)) << "the write goes out once the holder has gone";
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    ASSERT_TRUE(pollOne(b.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    EXPECT_EQ(ntohl(wc.imm_data), 42u);
    EXPECT_EQ(b.buffer[0], 0x5a);
    EXPECT_EQ(b.buffer[63], 0x5a);
  }
}

// A region that a stopped lock holder may be writing into is not deregistered (EBUSY: its memory must not be
// freed), while every other region is; no new write finds it; a later deregMr succeeds once the write is over.
TEST(Softib, ARegionAStoppedProcessWritesIntoIsNotDeregistered) {
  std::string why;
  api();
  softib::Fabric* fabric = softib::Fabric::get(&why);
  ASSERT_NE(fabric, nullptr) << why;
  Side a, b;
  ASSERT_TRUE(connectBoth(a, b));
  StoppedLockHolder holder(fabric, b.mr->rkey);
  ASSERT_TRUE(holder.stopped) << "the lock holder did not stop";
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(api().deregMr(b.mr), EBUSY);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
  std::vector<uint8_t> other(4096);
  ibv_mr* mr = api().regMr(a.pd, other.data(), other.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(api().deregMr(mr), 0);
  ASSERT_EQ(holder.end(true), 0);
  ASSERT_EQ(rdmaWrite(a, b, 1, 64, false), 0);
  ibv_wc wc{};
  ASSERT_TRUE(pollOne(a.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << "the region's key is gone";
  EXPECT_EQ(api().deregMr(b.mr), 0);
  b.mr = nullptr;
}

TEST(Softib, EntriesOfDeadProcessesAreReclaimed) {
  api();
  // A child takes every free CQ entry and exits without destroying them; the parent's next CQ reclaims them.
  pid_t child = forkChild([] {
    ibv_context* context = openFirstDevice();
    int made = 0;
    while (context != nullptr && api().createCq(context, 4, nullptr, nullptr, 0) != nullptr) ++made;
    return made > 0 && errno == ENOMEM ? 0 : 1;
  });
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitChild(child), 0);
  ibv_context* context = openFirstDevice();
  ASSERT_NE(context, nullptr);
  ibv_cq* cq = api().createCq(context, 4, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr) << std::strerror(errno);
  EXPECT_EQ(api().destroyCq(cq), 0);
  EXPECT_EQ(api().closeDevice(context), 0);
}

}  // namespace
}  // namespace loom
