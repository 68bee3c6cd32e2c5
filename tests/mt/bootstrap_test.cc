// Bootstrap tests, every rank a thread of this process: create, allGather, barrier and send/recv at 1, 2, 3 and 8
// ranks; a root that keeps serving while bad clients attack it; rank-to-rank authentication; timeouts, aborts
// and closed peers; unique id validation; the SipHash-2-4 reference vectors. The bad clients speak the wire
// format of bootstrap.cc directly, so a change there must be mirrored in the helpers below.
#include "src/base/bootstrap.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/base/check.h"
#include "src/base/siphash.h"
#include "src/base/socket.h"

namespace loom {
namespace {

constexpr int64_t kTestTimeoutMs = 20000;
constexpr size_t kFrameLength = 4;  // the u32 length prefix of messages to and from the root

using Millis = std::chrono::milliseconds;

int64_t elapsedMs(Clock::time_point since) { return std::chrono::duration_cast<Millis>(Clock::now() - since).count(); }

void runRanks(int nranks, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) threads.emplace_back(body, rank);
  for (std::thread& thread : threads) thread.join();
}

// Creates every rank's bootstrap concurrently; results[rank] says how each went.
std::vector<std::unique_ptr<Bootstrap>> createAll(const loomUniqueId& id, int nranks,
                                                  std::vector<loomResult_t>* results,
                                                  int64_t timeoutMs = kTestTimeoutMs) {
  std::vector<std::unique_ptr<Bootstrap>> boots(nranks);
  results->assign(nranks, loomInternalError);
  runRanks(nranks, [&](int rank) {
    (*results)[rank] = Bootstrap::create(id, rank, nranks, Deadline(timeoutMs), nullptr, &boots[rank]);
  });
  return boots;
}

uint8_t pattern(int rank, size_t i) { return static_cast<uint8_t>(rank * 31 + i * 7 + 1); }

// allGather of rank-dependent data (small and larger than a socket buffer), a barrier, and every rank sending
// to every rank (itself included) with tags sent out of order, a repeated tag and an empty message.
void exerciseRank(Bootstrap& boot) {
  const int rank = boot.rank(), nranks = boot.nranks();
  for (size_t bytesPerRank : {size_t{1}, size_t{24}, size_t{300000}}) {
    std::vector<uint8_t> slots(bytesPerRank * nranks, 0);
    for (size_t i = 0; i < bytesPerRank; ++i) slots[rank * bytesPerRank + i] = pattern(rank, i);
    ASSERT_EQ(boot.allGather(slots.data(), bytesPerRank, kTestTimeoutMs), loomSuccess) << threadLastError();
    for (int r = 0; r < nranks; ++r) {
      for (size_t i = 0; i < bytesPerRank; ++i) {
        ASSERT_EQ(slots[r * bytesPerRank + i], pattern(r, i))
            << "allGather of " << bytesPerRank << " bytes per rank, " << nranks << " ranks: rank " << rank
            << " has a wrong byte " << i << " in slot " << r;
      }
    }
  }
  ASSERT_EQ(boot.barrier(kTestTimeoutMs), loomSuccess) << threadLastError();

  // Per peer: tag 3, tag 1 ("first"), tag 2 (empty), tag 1 ("second"); received as 1, 1, 2, 3.
  for (int peer = 0; peer < nranks; ++peer) {
    int64_t three = 3000 + rank;
    ASSERT_EQ(boot.send(peer, 3, &three, sizeof(three), kTestTimeoutMs), loomSuccess) << threadLastError();
    std::string first = "first from " + std::to_string(rank);
    ASSERT_EQ(boot.send(peer, 1, first.data(), first.size(), kTestTimeoutMs), loomSuccess) << threadLastError();
    ASSERT_EQ(boot.send(peer, 2, nullptr, 0, kTestTimeoutMs), loomSuccess) << threadLastError();
    std::string second = "second from " + std::to_string(rank);
    ASSERT_EQ(boot.send(peer, 1, second.data(), second.size(), kTestTimeoutMs), loomSuccess) << threadLastError();
  }
  for (int peer = 0; peer < nranks; ++peer) {
    for (const char* which : {"first", "second"}) {
      std::string want = std::string(which) + " from " + std::to_string(peer);
      std::string got(want.size(), '\0');
      ASSERT_EQ(boot.recv(peer, 1, got.data(), got.size(), kTestTimeoutMs), loomSuccess) << threadLastError();
      EXPECT_EQ(got, want) << "rank " << rank << ", tag 1 from rank " << peer;
    }
    ASSERT_EQ(boot.recv(peer, 2, nullptr, 0, kTestTimeoutMs), loomSuccess) << threadLastError();
    int64_t three = 0;
    ASSERT_EQ(boot.recv(peer, 3, &three, sizeof(three), kTestTimeoutMs), loomSuccess) << threadLastError();
    EXPECT_EQ(three, 3000 + peer) << "rank " << rank << ", tag 3 from rank " << peer;
  }
  ASSERT_EQ(boot.barrier(kTestTimeoutMs), loomSuccess) << threadLastError();
}

class BootstrapRanks : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapRanks, CollectivesAndPointToPoint) {
  const int nranks = GetParam();
  loomUniqueId id;
  ASSERT_EQ(createUniqueId(&id), loomSuccess) << threadLastError();
  std::vector<loomResult_t> results;
  auto boots = createAll(id, nranks, &results);
  for (int rank = 0; rank < nranks; ++rank) {
    ASSERT_EQ(results[rank], loomSuccess) << "create of rank " << rank << " of " << nranks;
    EXPECT_EQ(boots[rank]->rank(), rank);
    EXPECT_EQ(boots[rank]->nranks(), nranks);
    EXPECT_EQ(boots[rank]->commHash(), boots[0]->commHash()) << "rank " << rank;
  }
  runRanks(nranks, [&](int rank) { exerciseRank(*boots[rank]); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, BootstrapRanks, ::testing::Values(1, 2, 3, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

// LOOM_SOCKET_IFNAME in NCCL's syntax.
TEST(SocketIfname, PrefixesExclusionsAndExactNames) {
  InterfaceFilter prefixes = parseInterfaceFilter("eth,ib");
  EXPECT_TRUE(interfaceMatches(prefixes, "eth0"));
  EXPECT_TRUE(interfaceMatches(prefixes, "ib1"));
  EXPECT_FALSE(interfaceMatches(prefixes, "lo"));
  InterfaceFilter excluded = parseInterfaceFilter("^docker,lo");
  EXPECT_TRUE(interfaceMatches(excluded, "eth0"));
  EXPECT_FALSE(interfaceMatches(excluded, "docker0"));
  EXPECT_FALSE(interfaceMatches(excluded, "lo"));
  InterfaceFilter exact = parseInterfaceFilter("=eth0");
  EXPECT_TRUE(interfaceMatches(exact, "eth0"));
  EXPECT_FALSE(interfaceMatches(exact, "eth01"));
  InterfaceFilter exactExcluded = parseInterfaceFilter("^=eth1");
  EXPECT_TRUE(interfaceMatches(exactExcluded, "eth10"));
  EXPECT_FALSE(interfaceMatches(exactExcluded, "eth1"));
}

// A filter that allows nothing up here is refused with the interfaces there are; loopback, named, is allowed; an
// unknown address family is refused.
TEST(SocketIfname, ChoosesAnAllowedInterfaceOrSaysWhichThereAre) {
  SocketAddress address;
  setenv("LOOM_SOCKET_IFNAME", "=lo", 1);
  ASSERT_EQ(chooseListenAddress(&address), loomSuccess) << loomGetLastError(nullptr);
  EXPECT_TRUE(isLoopback(address));
  setenv("LOOM_SOCKET_IFNAME", "no-such-interface", 1);
  EXPECT_EQ(chooseListenAddress(&address), loomInvalidUsage);
  EXPECT_NE(std::string(loomGetLastError(nullptr)).find("matches no interface"), std::string::npos);
  unsetenv("LOOM_SOCKET_IFNAME");
  setenv("LOOM_SOCKET_FAMILY", "AF_UNIX", 1);
  EXPECT_EQ(chooseListenAddress(&address), loomInvalidArgument);
  EXPECT_NE(std::string(loomGetLastError(nullptr)).find("LOOM_SOCKET_FAMILY"), std::string::npos);
  unsetenv("LOOM_SOCKET_FAMILY");
}

TEST(Bootstrap, CommHashDiffersBetweenIds) {
  std::vector<uint64_t> hashes;
  for (int i = 0; i < 2; ++i) {
    loomUniqueId id;
    ASSERT_EQ(createUniqueId(&id), loomSuccess);
    std::vector<loomResult_t> results;
    auto boots = createAll(id, 1, &results);
    ASSERT_EQ(results[0], loomSuccess) << threadLastError();
    hashes.push_back(boots[0]->commHash());
  }
  EXPECT_NE(hashes[0], hashes[1]);
}

TEST(Bootstrap, StartRootOnHostName) {
  // torchrun and Slurm name rank 0 by host name: the root listens on every interface at the port, and ranks
  // that reach it over loopback listen on a routable interface instead (127.0.0.1 only when there is none).
  // The port is one the system just gave out and took back: something else may take it meanwhile (an outgoing
  // connection's own port), so a bind that finds it in use tries another.
  SocketAddress loopback;
  ASSERT_EQ(resolveAddress("127.0.0.1:0", &loopback), loomSuccess);
  UniqueIdInfo info;
  std::memset(info.secret, 0x5c, kSecretBytes);
  loomResult_t started = loomInternalError;
  for (int attempt = 0; attempt < 5 && started != loomSuccess; ++attempt) {
    UniqueFd probe;
    std::string probeAddress;
    ASSERT_EQ(listenOn(loopback, false, &probe, &probeAddress), loomSuccess);
    probe.reset();
    info.rootAddress = "localhost" + probeAddress.substr(probeAddress.rfind(':'));
    started = startRoot(info);
    if (started != loomSuccess && std::string(threadLastError()).find("in use") == std::string::npos) break;
  }
  ASSERT_EQ(started, loomSuccess) << threadLastError();
  loomUniqueId id;
  ASSERT_EQ(packUniqueId(info, &id), loomSuccess);
  std::vector<loomResult_t> results;
  auto boots = createAll(id, 2, &results);
  for (int rank = 0; rank < 2; ++rank) ASSERT_EQ(results[rank], loomSuccess) << "create of rank " << rank;
  runRanks(2, [&](int rank) { exerciseRank(*boots[rank]); });
}

// ---- Bad clients ----

IoWait testWait(int64_t timeoutMs = 3000) { return IoWait{Deadline(timeoutMs), nullptr, "test client"}; }

std::vector<uint8_t> registration(uint32_t rank, uint32_t nranks, const std::string& address) {
  std::vector<uint8_t> out;
  auto put = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  put(static_cast<uint32_t>(12 + address.size()));
  put(1);  // kRegister
  put(rank);
  put(nranks);
  out.insert(out.end(), address.begin(), address.end());
  return out;
}

uint32_t little32(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24; }

// True when the other end closes the connection (after sending at most `slack` bytes) within the wait.
bool closedByPeer(int fd, size_t slack, int64_t timeoutMs = 3000) {
  std::vector<uint8_t> sink(slack + 1);
  return readExact(fd, sink.data(), sink.size(), "the server", testWait(timeoutMs)) == loomRemoteError;
}

UniqueFd connectOrDie(const std::string& address) {
  UniqueFd fd;
  EXPECT_EQ(connectTo(address, false, testWait(), &fd), loomSuccess) << threadLastError();
  return fd;
}

TEST(BootstrapRoot, KeepsServingRealRanksWhileAttacked) {
  const int nranks = 4;
  loomUniqueId id;
  ASSERT_EQ(createUniqueId(&id), loomSuccess);
  UniqueIdInfo info;
  ASSERT_EQ(unpackUniqueId(id, &info), loomSuccess);
  uint8_t wrongSecret[kSecretBytes];
  std::memcpy(wrongSecret, info.secret, kSecretBytes);
  wrongSecret[0] ^= 1;

  // The bad clients connect before any real rank does.
  UniqueFd wrongSecretFd = connectOrDie(info.rootAddress);
  UniqueFd wrongRoleFd = connectOrDie(info.rootAddress);
  UniqueFd garbageFd = connectOrDie(info.rootAddress);
  UniqueFd hugeUnauthFd = connectOrDie(info.rootAddress);
  UniqueFd hugeFd = connectOrDie(info.rootAddress);
  UniqueFd truncatedFd = connectOrDie(info.rootAddress);
  UniqueFd badRankFd = connectOrDie(info.rootAddress);
  UniqueFd silentFd = connectOrDie(info.rootAddress);

  std::atomic<int> attacksRepelled{0};
  std::vector<std::thread> attackers;
  auto attack = [&](const char* name, const std::function<bool()>& body) {
    attackers.emplace_back([&attacksRepelled, name, body] {
      if (body()) {
        ++attacksRepelled;
      } else {
        ADD_FAILURE() << "the root did not drop the " << name << " client";
      }
    });
  };
  // (a) answers the challenge with a wrong secret.
  attack("wrong-secret", [&] {
    return authenticateToAcceptor(wrongSecretFd.get(), wrongSecret, AuthRole::kRoot, "root", testWait()) ==
           loomRemoteError;
  });
  // A tag made for a rank-to-rank connection is not accepted by the root.
  attack("wrong-role", [&] {
    return authenticateToAcceptor(wrongRoleFd.get(), info.secret, AuthRole::kPeer, "root", testWait()) ==
           loomRemoteError;
  });
  // (b) garbage bytes instead of an answer.
  attack("garbage", [&] {
    std::vector<uint8_t> garbage(200);
    for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<uint8_t>(i * 37 + 11);
    writeExact(garbageFd.get(), garbage.data(), garbage.size(), "root", testWait());
    return closedByPeer(garbageFd.get(), kNonceBytes);
  });
  // (c) a header declaring a huge length, first without and then with the handshake.
  attack("huge-unauthenticated", [&] {
    std::vector<uint8_t> header(kAuthAnswerBytes, 0xff);
    writeExact(hugeUnauthFd.get(), header.data(), header.size(), "root", testWait());
    return closedByPeer(hugeUnauthFd.get(), kNonceBytes);
  });
  attack("huge-length", [&] {
    if (authenticateToAcceptor(hugeFd.get(), info.secret, AuthRole::kRoot, "root", testWait()) != loomSuccess) {
      return false;
    }
    std::vector<uint8_t> message = registration(0, nranks, "127.0.0.1:9");
    message[0] = message[1] = message[2] = 0xff, message[3] = 0x7f;
    writeExact(hugeFd.get(), message.data(), message.size(), "root", testWait());
    return closedByPeer(hugeFd.get(), 0);
  });
  // (d) authenticated, then half a registration and a close: the root must not wait for the rest.
  attack("truncated", [&] {
    if (authenticateToAcceptor(truncatedFd.get(), info.secret, AuthRole::kRoot, "root", testWait()) != loomSuccess) {
      return false;
    }
    std::vector<uint8_t> message = registration(1, nranks, "127.0.0.1:9");
    writeExact(truncatedFd.get(), message.data(), kFrameLength + 5, "root", testWait());
    truncatedFd.reset();
    return true;
  });
  // Authenticated, with a rank outside 0..nranks-1: the root answers with a rejection.
  attack("bad-rank", [&] {
    if (authenticateToAcceptor(badRankFd.get(), info.secret, AuthRole::kRoot, "root", testWait()) != loomSuccess) {
      return false;
    }
    std::vector<uint8_t> message = registration(nranks + 3, nranks, "127.0.0.1:9");
    writeExact(badRankFd.get(), message.data(), message.size(), "root", testWait());
    uint8_t reply[8];
    if (readExact(badRankFd.get(), reply, sizeof(reply), "root", testWait()) != loomSuccess) return false;
    return little32(reply + 4) == 3 /* kReject */ && closedByPeer(badRankFd.get(), little32(reply) - 4);
  });

  // The real ranks join while the attacks run, with (e) a silent client holding its connection open. The last
  // rank joins only once the attacks are over: when every rank is in, the root closes the connections that are
  // left, which would hide whether it dropped them for the right reason.
  const auto start = Clock::now();
  std::vector<loomResult_t> results(nranks, loomInternalError);
  std::vector<std::unique_ptr<Bootstrap>> boots(nranks);
  auto join = [&](int rank) {
    results[rank] = Bootstrap::create(id, rank, nranks, Deadline(10000), nullptr, &boots[rank]);
  };
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < nranks - 1; ++rank) ranks.emplace_back(join, rank);
  for (std::thread& attacker : attackers) attacker.join();
  ranks.emplace_back(join, nranks - 1);
  for (std::thread& rank : ranks) rank.join();
  for (int rank = 0; rank < nranks; ++rank) ASSERT_EQ(results[rank], loomSuccess) << "create of rank " << rank;
  runRanks(nranks, [&](int rank) {
    std::vector<int> slots(nranks, -1);
    slots[rank] = rank * 10;
    ASSERT_EQ(boots[rank]->allGather(slots.data(), sizeof(int), kTestTimeoutMs), loomSuccess);
    for (int r = 0; r < nranks; ++r) EXPECT_EQ(slots[r], r * 10) << "rank " << rank << ", slot " << r;
  });
  EXPECT_LT(elapsedMs(start), 4000) << "the real ranks took too long to initialise under attack";
  EXPECT_EQ(attacksRepelled.load(), 7);
  // Once every rank is in, the root closes what is left and exits: the silent client sees its challenge, then
  // the end of the connection.
  EXPECT_TRUE(closedByPeer(silentFd.get(), kNonceBytes)) << "the root kept the silent client's connection";
}

TEST(BootstrapRoot, RejectsDuplicateRankAndMismatchedNranks) {
  loomUniqueId id;
  ASSERT_EQ(createUniqueId(&id), loomSuccess);
  UniqueIdInfo info;
  ASSERT_EQ(unpackUniqueId(id, &info), loomSuccess);
  // A hand-made rank 0 of 2 registers first. Every later client needs a handshake round trip, by which time
  // the root has read this registration.
  UniqueFd fake = connectOrDie(info.rootAddress);
  ASSERT_EQ(authenticateToAcceptor(fake.get(), info.secret, AuthRole::kRoot, "root", testWait()), loomSuccess);
  std::vector<uint8_t> message = registration(0, 2, "127.0.0.1:9");
  ASSERT_EQ(writeExact(fake.get(), message.data(), message.size(), "root", testWait()), loomSuccess);

  std::unique_ptr<Bootstrap> boot;
  const auto start = Clock::now();
  EXPECT_EQ(Bootstrap::create(id, 0, 2, Deadline(kTestTimeoutMs), nullptr, &boot), loomInvalidUsage);
  EXPECT_NE(threadLastError().find("already registered"), std::string::npos) << threadLastError();
  EXPECT_EQ(Bootstrap::create(id, 1, 3, Deadline(kTestTimeoutMs), nullptr, &boot), loomInvalidUsage);
  EXPECT_NE(threadLastError().find("nranks"), std::string::npos) << threadLastError();
  EXPECT_LT(elapsedMs(start), 3000);

  // When the hand-made rank leaves, its slot (and the group size) is free again for the real ranks.
  fake.reset();
  std::vector<loomResult_t> results;
  auto boots = createAll(id, 2, &results);
  EXPECT_EQ(results[0], loomSuccess);
  EXPECT_EQ(results[1], loomSuccess);
}

TEST(BootstrapPeer, RejectsConnectionsWithoutTheSecret) {
  loomUniqueId id;
  ASSERT_EQ(createUniqueId(&id), loomSuccess);
  UniqueIdInfo info;
  ASSERT_EQ(unpackUniqueId(id, &info), loomSuccess);

  // Rank 0 is real. The test plays rank 1 far enough to learn rank 0's listener address from the root. Its own
  // listener never answers, so rank 0 cannot finish its ring and must give up at its deadline.
  std::unique_ptr<Bootstrap> boot;
  loomResult_t rank0Result = loomInternalError;
  std::thread rank0([&] { rank0Result = Bootstrap::create(id, 0, 2, Deadline(2500), nullptr, &boot); });

  SocketAddress loopback;
  ASSERT_EQ(resolveAddress("127.0.0.1:0", &loopback), loomSuccess);
  UniqueFd mute;
  std::string muteAddress;
  ASSERT_EQ(listenOn(loopback, false, &mute, &muteAddress), loomSuccess);
  UniqueFd root = connectOrDie(info.rootAddress);
  ASSERT_EQ(authenticateToAcceptor(root.get(), info.secret, AuthRole::kRoot, "root", testWait()), loomSuccess);
  std::vector<uint8_t> message = registration(1, 2, muteAddress);
  ASSERT_EQ(writeExact(root.get(), message.data(), message.size(), "root", testWait()), loomSuccess);
  uint8_t length[4];
  ASSERT_EQ(readExact(root.get(), length, sizeof(length), "root", testWait()), loomSuccess);
  std::vector<uint8_t> table(little32(length));
  ASSERT_EQ(readExact(root.get(), table.data(), table.size(), "root", testWait()), loomSuccess);
  ASSERT_GE(table.size(), 10u);
  ASSERT_EQ(little32(table.data()), 2u);  // kTable
  const size_t rank0Length = table[8] | table[9] << 8;
  ASSERT_GE(table.size(), 10 + rank0Length);
  const std::string rank0Address(reinterpret_cast<const char*>(table.data() + 10), rank0Length);

  uint8_t wrongSecret[kSecretBytes];
  std::memcpy(wrongSecret, info.secret, kSecretBytes);
  wrongSecret[15] ^= 0x80;
  UniqueFd wrong = connectOrDie(rank0Address);
  EXPECT_EQ(authenticateToAcceptor(wrong.get(), wrongSecret, AuthRole::kPeer, "rank 0", testWait()), loomRemoteError);
  // A tag made for the root is not accepted by a rank either.
  UniqueFd wrongRole = connectOrDie(rank0Address);
  EXPECT_EQ(authenticateToAcceptor(wrongRole.get(), info.secret, AuthRole::kRoot, "rank 0", testWait()),
            loomRemoteError);
  // The listener still serves a client that knows the secret, and proves to it that it knows it too.
  UniqueFd right = connectOrDie(rank0Address);
  EXPECT_EQ(authenticateToAcceptor(right.get(), info.secret, AuthRole::kPeer, "rank 0", testWait()), loomSuccess);

  rank0.join();
  EXPECT_EQ(rank0Result, loomTimeout);
}

// ---- Deadlines, aborts and closed peers ----

TEST(BootstrapTimeout, MissingRankTimesOut) {
  loomUniqueId id;
  ASSERT_EQ(createUniqueId(&id), loomSuccess);
  std::unique_ptr<Bootstrap> boot;
  const auto start = Clock::now();
  EXPECT_EQ(Bootstrap::create(id, 0, 2, Deadline(300), nullptr, &boot), loomTimeout);
  EXPECT_LT(elapsedMs(start), 2000);
  EXPECT_NE(threadLastError().find("timed out"), std::string::npos) << threadLastError();
}

TEST(BootstrapTimeout, UnreachableRootTimesOut) {
  // A listener that is closed again: its port refuses connections, and create retries until the deadline.
  SocketAddress loopback;
  ASSERT_EQ(resolveAddress("127.0.0.1:0", &loopback), loomSuccess);
  UniqueFd listener;
  UniqueIdInfo info;
  ASSERT_EQ(listenOn(loopback, false, &listener, &info.rootAddress), loomSuccess);
  listener.reset();
  std::memset(info.secret, 7, kSecretBytes);
  loomUniqueId id;
  ASSERT_EQ(packUniqueId(info, &id), loomSuccess);
  std::unique_ptr<Bootstrap> boot;
  const auto start = Clock::now();
  EXPECT_EQ(Bootstrap::create(id, 0, 1, Deadline(300), nullptr, &boot), loomTimeout);
  EXPECT_LT(elapsedMs(start), 2000);
}

TEST(BootstrapTimeout, RecvTimeoutAbortAndClosedPeer) {
  loomUniqueId id;
  ASSERT_EQ(createUniqueId(&id), loomSuccess);
  std::vector<loomResult_t> results;
  auto boots = createAll(id, 2, &results);
  ASSERT_EQ(results[0], loomSuccess);
  ASSERT_EQ(results[1], loomSuccess);
  int value = 0;

  auto start = Clock::now();
  EXPECT_EQ(boots[0]->recv(1, 5, &value, sizeof(value), 300), loomTimeout);
  EXPECT_LT(elapsedMs(start), 2000);

  // A message of the wrong size fails the recv and stays queued for a correct one.
  int sent = 42;
  ASSERT_EQ(boots[1]->send(0, 6, &sent, sizeof(sent), kTestTimeoutMs), loomSuccess);
  int64_t tooBig = 0;
  EXPECT_EQ(boots[0]->recv(1, 6, &tooBig, sizeof(tooBig), kTestTimeoutMs), loomInternalError);
  EXPECT_EQ(boots[0]->recv(1, 6, &value, sizeof(value), kTestTimeoutMs), loomSuccess);
  EXPECT_EQ(value, 42);

  // Rank 1 leaves: rank 0 learns it from the closed connections and the closed listener instead of waiting out
  // the deadline.
  boots[1].reset();
  start = Clock::now();
  EXPECT_EQ(boots[0]->recv(1, 7, &value, sizeof(value), kTestTimeoutMs), loomRemoteError);
  EXPECT_EQ(boots[0]->allGather(&value, 1, kTestTimeoutMs), loomRemoteError);
  EXPECT_EQ(boots[0]->send(1, 8, &value, sizeof(value), kTestTimeoutMs), loomRemoteError);
  EXPECT_LT(elapsedMs(start), 2000);
}

TEST(Bootstrap, StartRootOnFixedIpv6Port) {
  // loomCommInitFromEnv's path: rank 0 starts the root on an address and port known in advance. The port is
  // found free first; SO_REUSEADDR lets the root bind it right after.
  SocketAddress any;
  ASSERT_EQ(resolveAddress("[::1]:0", &any), loomSuccess);
  UniqueFd probe;
  UniqueIdInfo info;
  if (listenOn(any, false, &probe, &info.rootAddress) != loomSuccess) GTEST_SKIP() << "no IPv6 loopback here";
  probe.reset();
  for (size_t i = 0; i < kSecretBytes; ++i) info.secret[i] = static_cast<uint8_t>(0xa0 + i);
  loomUniqueId id;
  ASSERT_EQ(packUniqueId(info, &id), loomSuccess);
  // Ranks may start before the root: they retry their connection until it listens.
  std::vector<loomResult_t> results;
  std::vector<std::unique_ptr<Bootstrap>> boots;
  std::thread ranks([&] { boots = createAll(id, 3, &results); });
  std::this_thread::sleep_for(Millis(100));
  ASSERT_EQ(startRoot(info), loomSuccess) << threadLastError();
  ranks.join();
  for (int rank = 0; rank < 3; ++rank) ASSERT_EQ(results[rank], loomSuccess) << "create of rank " << rank;
  runRanks(3, [&](int rank) { exerciseRank(*boots[rank]); });
}

TEST(BootstrapTimeout, AbortFlagStopsWaits) {
  loomUniqueId id;
  ASSERT_EQ(createUniqueId(&id), loomSuccess);
  std::atomic<bool> abortFlag{false};
  std::unique_ptr<Bootstrap> boot;
  std::thread aborter([&] {
    std::this_thread::sleep_for(Millis(200));
    abortFlag = true;
  });
  const auto start = Clock::now();
  // Rank 1 never comes; the abort ends the wait long before the deadline.
  EXPECT_EQ(Bootstrap::create(id, 0, 2, Deadline(kTestTimeoutMs), &abortFlag, &boot), loomRemoteError);
  EXPECT_LT(elapsedMs(start), 2000);
  aborter.join();
}

// ---- Unique ids, addresses and SipHash ----

TEST(BootstrapId, PackUnpackRoundTrip) {
  UniqueIdInfo info;
  info.rootAddress = "[fe80::1%eth0]:29500";
  for (size_t i = 0; i < kSecretBytes; ++i) info.secret[i] = static_cast<uint8_t>(i * 13);
  loomUniqueId id;
  ASSERT_EQ(packUniqueId(info, &id), loomSuccess);
  UniqueIdInfo back;
  ASSERT_EQ(unpackUniqueId(id, &back), loomSuccess);
  EXPECT_EQ(back.rootAddress, info.rootAddress);
  EXPECT_EQ(std::memcmp(back.secret, info.secret, kSecretBytes), 0);

  info.rootAddress = std::string(200, 'a') + ":1";
  EXPECT_EQ(packUniqueId(info, &id), loomInvalidArgument);
}

TEST(BootstrapId, CorruptedIdsAreInvalidArguments) {
  loomUniqueId good;
  ASSERT_EQ(createUniqueId(&good), loomSuccess);
  UniqueIdInfo info;

  loomUniqueId id = good;
  id.internal[0] ^= 0x5a;  // magic
  EXPECT_EQ(unpackUniqueId(id, &info), loomInvalidArgument);
  std::unique_ptr<Bootstrap> boot;
  EXPECT_EQ(Bootstrap::create(id, 0, 1, Deadline(1000), nullptr, &boot), loomInvalidArgument);

  id = good;
  id.internal[4] = 99;  // version
  EXPECT_EQ(unpackUniqueId(id, &info), loomInvalidArgument);

  id = good;
  std::memset(id.internal + 24, 'x', LOOM_UNIQUE_ID_BYTES - 24);  // address without a NUL
  EXPECT_EQ(unpackUniqueId(id, &info), loomInvalidArgument);

  id = good;
  std::memset(id.internal + 24, 0, LOOM_UNIQUE_ID_BYTES - 24);
  std::memcpy(id.internal + 24, "no-port-here", 12);
  EXPECT_EQ(unpackUniqueId(id, &info), loomInvalidArgument);

  loomUniqueId zero{};
  EXPECT_EQ(unpackUniqueId(zero, &info), loomInvalidArgument);
}

TEST(BootstrapId, RankArgumentsAreChecked) {
  loomUniqueId id;
  ASSERT_EQ(createUniqueId(&id), loomSuccess);
  std::unique_ptr<Bootstrap> boot;
  EXPECT_EQ(Bootstrap::create(id, 2, 2, Deadline(1000), nullptr, &boot), loomInvalidArgument);
  EXPECT_EQ(Bootstrap::create(id, -1, 2, Deadline(1000), nullptr, &boot), loomInvalidArgument);
  EXPECT_EQ(Bootstrap::create(id, 0, 0, Deadline(1000), nullptr, &boot), loomInvalidArgument);
}

TEST(Socket, SplitHostPort) {
  std::string host;
  int port = -1;
  EXPECT_TRUE(splitHostPort("10.0.0.1:29500", &host, &port));
  EXPECT_EQ(host, "10.0.0.1");
  EXPECT_EQ(port, 29500);
  EXPECT_TRUE(splitHostPort("[::1]:0", &host, &port));
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 0);
  EXPECT_TRUE(splitHostPort("node-7:65535", &host, &port));
  EXPECT_FALSE(splitHostPort("::1:80", &host, &port));
  EXPECT_FALSE(splitHostPort("host:", &host, &port));
  EXPECT_FALSE(splitHostPort(":80", &host, &port));
  EXPECT_FALSE(splitHostPort("host:65536", &host, &port));
  EXPECT_FALSE(splitHostPort("host:8x", &host, &port));
  EXPECT_FALSE(splitHostPort("[::1]80", &host, &port));
  EXPECT_FALSE(splitHostPort("host", &host, &port));
}

TEST(SipHash, ReferenceVectors) {
  // From the SipHash paper and its reference implementation (vectors.h): key 00..0f, message 00..(n-1).
  uint8_t key[kSipHashKeyBytes];
  uint8_t message[64];
  for (int i = 0; i < 16; ++i) key[i] = static_cast<uint8_t>(i);
  for (int i = 0; i < 64; ++i) message[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(sipHash24(key, message, 15), 0xa129ca6149be45e5ULL);
  EXPECT_EQ(sipHash24(key, message, 0), 0x726fdb47dd0e0e31ULL);
}

TEST(SipHash, TimingSafeEqual) {
  const uint8_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
  EXPECT_TRUE(timingSafeEqual(a, a, 4));
  EXPECT_FALSE(timingSafeEqual(a, b, 4));
  EXPECT_TRUE(timingSafeEqual(a, b, 3));
}

}  // namespace
}  // namespace loom
