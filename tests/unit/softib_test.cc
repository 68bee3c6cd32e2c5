// softib, the software verbs device the ib transport's tests run on: devices, ports and GIDs; memory keys and the
// errors a bad one causes; the RC state machine and its attribute masks; writes with immediate between QPs of one
// process and of two (forked) processes, with their completions and a completion channel; receiver-not-ready, and a
// requester asleep on its channel woken when its responder can go on; inline data; remote access errors; writes
// that reach no responder, among them a dead peer's, and their transport timeout; the qp_error fault; flushes in
// the error state; the send queue's slots. Several threads and processes at once, and locks held by dead or
// stopped processes: softib_concurrency_test.cc. Waits have deadlines and times are only bounded loosely: the
// machines that run this are slow and shared.
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

#include "tests/unit/softib_test_util.h"
#include "transports/ibverbs/softib_fabric.h"
#include "transports/ibverbs/verbs.h"

namespace loom {
namespace {

using namespace loom::softib_test;

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

}  // namespace
}  // namespace loom
