// softib, the software verbs device the ib transport's tests run on, with several users at once: threads sharing
// the device; processes that create the fabric at once; a lock holder that dies, and one that is stopped (no one
// else waits for it; a region it writes into is not deregistered); reclaiming what dead processes left. One
// process's devices, keys, QPs and writes: softib_test.cc. Waits have deadlines and times are only bounded
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

#include "tests/unit/softib_test_util.h"
#include "transports/ibverbs/softib_fabric.h"
#include "transports/ibverbs/verbs.h"

namespace loom {
namespace {

using namespace loom::softib_test;

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
