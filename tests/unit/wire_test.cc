// Formats read from outside the process: plan files (algorithms/plan_text.h), the bootstrap's messages
// (src/base/bootstrap_wire.h) and UCX's description of an endpoint's lanes (transports/ucx/lanes.h). What loom
// writes reads back the same; bad input is refused with a message naming what, and where. tools/fuzz runs the same
// parsers on random input.
#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "algorithms/builders.h"
#include "algorithms/plan_text.h"
#include "algorithms/verifier.h"
#include "src/base/bootstrap_wire.h"
#include "transports/ucx/lanes.h"

namespace {

using namespace loom;

const Collective kUniform[] = {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                               Collective::kBroadcast, Collective::kReduce,        Collective::kGather,
                               Collective::kScatter,   Collective::kAllToAll,      Collective::kBarrier};

PlanFile buildFile(Collective collective, const std::string& algorithm, int nranks, size_t count) {
  PlanFile file;
  file.collective = collective;
  file.nranks = nranks;
  file.count = count;
  file.root = nranks / 2;
  file.nChannels = 2;
  file.algorithm = algorithm;
  file.plans.resize(nranks);
  for (int r = 0; r < nranks; ++r) EXPECT_TRUE(buildPlan(file.argsFor(r), algorithm, &file.plans[r]));
  return file;
}

// Every algorithm's plans, written and read back, give the same text and are proven by the verifier.
TEST(PlanFile, EveryAlgorithmRoundTripsAndIsProven) {
  for (Collective collective : kUniform) {
    for (const std::string& algorithm : algorithmsFor(collective)) {
      for (int nranks : {1, 3, 4, 8}) {
        SCOPED_TRACE(std::string(collectiveName(collective)) + " " + algorithm + " at " + std::to_string(nranks));
        PlanFile file = buildFile(collective, algorithm, nranks, 37);
        const std::string text = formatPlanFile(file);
        PlanFile read;
        std::string error;
        ASSERT_TRUE(parsePlanFile(text, &read, &error)) << error << "\n" << text;
        EXPECT_EQ(formatPlanFile(read), text);
        std::vector<CollArgs> perRank;
        for (int r = 0; r < nranks; ++r) perRank.push_back(read.argsFor(r));
        EXPECT_EQ(verifyPlan(perRank, [&read](const CollArgs& args) { return read.plans[args.rank]; }, {}), "");
      }
    }
  }
}

TEST(PlanFile, CommentsAndBlankLinesAreSkippedAndFieldsMayComeInAnyOrder) {
  const std::string text =
      "# two ranks swap halves\n\nloom-plan 1\n"
      "call AllGather ranks 2 count 2 root 0 channels 1 algorithm hand-made   # a comment\n"
      "rank 0 input 2 output 4 scratch 0 reduced out[0+0]\n"
      "lane channel 0\n  copy dst out[0+2] src in[0+2]\n  send src out[0+2] to 1\n  recv dst out[2+2] from 1\n"
      "rank 1 input 2 output 4 scratch 0 reduced out[0+0]\n"
      "lane channel 0\n  copy src in[0+2] dst out[2+2]\n  recv from 0 dst out[0+2]\n  send to 0 src out[2+2]\n";
  PlanFile file;
  std::string error;
  ASSERT_TRUE(parsePlanFile(text, &file, &error)) << error;
  std::vector<CollArgs> perRank = {file.argsFor(0), file.argsFor(1)};
  EXPECT_EQ(verifyPlan(perRank, [&file](const CollArgs& args) { return file.plans[args.rank]; }, {}), "");
  EXPECT_EQ(file.algorithm, "hand-made");
}

TEST(PlanFile, RefusesBadFilesNamingTheLine) {
  const std::string head = "loom-plan 1\ncall AllReduce ranks 2 count 8 root 0 channels 1 algorithm x\n";
  const std::string rank0 = "rank 0 input 8 output 8 scratch 0 reduced out[0+8]\nlane channel 0\n";
  const std::string rank1 = "rank 1 input 8 output 8 scratch 0 reduced out[0+8]\n";
  const std::pair<std::string, std::string> cases[] = {
      {"", "the end of the file: the file does not start with \"loom-plan 1\""},
      {"loom-plan 2\n", "line 1: format version 2"},
      {"loom-plan 1\ncall AllToAllv ranks 2 count 8 root 0 channels 1 algorithm x\n", "line 2: AllToAllv has counts"},
      {"loom-plan 1\ncall AllReduce ranks 0 count 8 root 0 channels 1 algorithm x\n", "line 2: expected \"ranks N\""},
      {head + "rank 1 input 8", "line 3: rank 1 where rank 0 is due"},
      {head + "rank 0 input 9 output 8 scratch 0 reduced out[0+8]\n", "line 3: expected \"input N\", at most"},
      {head + rank0 + "send to 2 src in[0+8]\n", "line 5: \"2\" is not a number from 0 to 1"},
      {head + rank0 + "send to 1 src in[4+5]\n", "line 5: region in[4+5] does not lie inside the 8 elements"},
      {head + rank0 + "send to 1 src in[18446744073709551615+2]\n", "line 5: region"},
      {head + rank0 + "recvReduce from 1 src in[0+4] dst out[0+3]\n", "line 5: the regions of a step differ"},
      {head + rank0 + "recv from 1\n", "line 5: recv needs from dst"},
      {head + rank0 + "send to 1 to 1 src in[0+1]\n", "line 5: \"to\" given twice"},
      {head + rank0 + "copy src in[0+1] dst out[0+1] to 1\n", "line 5: copy has no \"to\""},
      {head + rank0 + "teleport to 1\n", "line 5: unknown step \"teleport\""},
      {head + "rank 0 input 8 output 8 scratch 0 reduced out[0+8]\nlane channel 2\n", "line 4: \"2\" is not a number"},
      {head + rank0, "the end of the file: expected the line of rank 1"},
      {head + rank0 + rank1 + "rank 2\n", "line 6: text after the last rank's plan"},
  };
  for (const auto& [text, expected] : cases) {
    PlanFile file;
    file.algorithm = "untouched";
    std::string error;
    EXPECT_FALSE(parsePlanFile(text, &file, &error)) << text;
    EXPECT_EQ(error.rfind(expected, 0), 0u) << "got: " << error << "\nexpected: " << expected;
    EXPECT_EQ(file.algorithm, "untouched");
  }
}

// ---- The bootstrap's messages ----

std::vector<uint8_t> bodyOf(const std::vector<uint8_t>& message) { return {message.begin() + 4, message.end()}; }

TEST(BootstrapWire, MessagesRoundTrip) {
  bootwire::Registration registration{3, 8, "10.1.2.3:4567"}, parsed;
  bool kindOk = false;
  EXPECT_EQ(bootwire::parseRegistration(bodyOf(bootwire::encodeRegistration(registration)), &parsed, &kindOk), "");
  EXPECT_TRUE(kindOk);
  EXPECT_EQ(parsed.rank, 3);
  EXPECT_EQ(parsed.nranks, 8);
  EXPECT_EQ(parsed.address, "10.1.2.3:4567");

  const std::vector<std::string> addresses = {"10.0.0.1:1000", "[fd00::1]:2000", "node-7:3000"};
  bootwire::RootReply reply;
  EXPECT_EQ(bootwire::parseRootReply(bodyOf(bootwire::encodeTable(addresses)), 3, &reply), "");
  EXPECT_FALSE(reply.rejected);
  EXPECT_EQ(reply.addresses, addresses);
  EXPECT_EQ(bootwire::parseRootReply(bodyOf(bootwire::encodeReject("no\x01room")), 3, &reply), "");
  EXPECT_TRUE(reply.rejected);
  EXPECT_EQ(reply.reason, "no?room");

  uint32_t kind = 0;
  int from = -1;
  std::vector<uint8_t> hello = bootwire::encodeHello(bootwire::kP2pConn, 2);
  EXPECT_EQ(bootwire::parseHello(std::span<const uint8_t, 8>(hello.data(), 8), 0, 4, &kind, &from), "");
  EXPECT_EQ(kind, bootwire::kP2pConn);
  EXPECT_EQ(from, 2);

  int tag = 0;
  uint64_t bytes = 0;
  std::vector<uint8_t> header = bootwire::encodeFrameHeader(-5, 1234);
  EXPECT_EQ(bootwire::parseFrameHeader(std::span<const uint8_t, 16>(header.data(), 16), &tag, &bytes), "");
  EXPECT_EQ(tag, -5);
  EXPECT_EQ(bytes, 1234u);

  UniqueIdInfo info{}, back{};
  info.rootAddress = "127.0.0.1:29500";
  for (size_t i = 0; i < kSecretBytes; ++i) info.secret[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> id = bootwire::encodeUniqueId(info);
  ASSERT_EQ(id.size(), size_t{LOOM_UNIQUE_ID_BYTES});
  EXPECT_EQ(bootwire::parseUniqueId(std::span<const uint8_t, LOOM_UNIQUE_ID_BYTES>(id.data(), id.size()), &back), "");
  EXPECT_EQ(back.rootAddress, info.rootAddress);
  EXPECT_EQ(std::memcmp(back.secret, info.secret, kSecretBytes), 0);
}

TEST(BootstrapWire, RefusesBadMessagesSayingWhy) {
  auto contains = [](const std::string& error, const char* expected) {
    EXPECT_NE(error.find(expected), std::string::npos) << error;
  };
  bootwire::Registration registration;
  bool kindOk = true;
  std::vector<uint8_t> message = bodyOf(bootwire::encodeRegistration({0, 2, "10.0.0.1:1"}));
  message[0] = 9;
  contains(bootwire::parseRegistration(message, &registration, &kindOk), "message kind 9");
  EXPECT_FALSE(kindOk);
  contains(
      bootwire::parseRegistration(bodyOf(bootwire::encodeRegistration({5, 2, "10.0.0.1:1"})), &registration, &kindOk),
      "rank 5 is outside 0..1");
  EXPECT_TRUE(kindOk);
  contains(bootwire::parseRegistration(bodyOf(bootwire::encodeRegistration({0, 2, "no port"})), &registration, &kindOk),
           "not a printable host:port");
  std::vector<uint8_t> shortOne = {1, 0, 0, 0, 0};
  contains(bootwire::parseRegistration(shortOne, &registration, &kindOk), "too short");

  bootwire::RootReply reply;
  std::vector<uint8_t> table = bodyOf(bootwire::encodeTable({"10.0.0.1:1", "10.0.0.2:2"}));
  contains(bootwire::parseRootReply(table, 3, &reply), "expected a table (2) of 3");
  table.push_back(0);
  contains(bootwire::parseRootReply(table, 2, &reply), "1 bytes after its last address");
  table.resize(table.size() - 4);
  contains(bootwire::parseRootReply(table, 2, &reply), "no valid address for rank 1");

  uint32_t kind = 0;
  int from = 0;
  std::vector<uint8_t> hello = bootwire::encodeHello(bootwire::kRingConn, 3);
  contains(bootwire::parseHello(std::span<const uint8_t, 8>(hello.data(), 8), 3, 4, &kind, &from), "invalid rank 3");
  hello = bootwire::encodeHello(static_cast<bootwire::ConnKind>(7), 1);
  contains(bootwire::parseHello(std::span<const uint8_t, 8>(hello.data(), 8), 0, 4, &kind, &from), "unknown kind 7");

  int tag = 0;
  uint64_t bytes = 0;
  std::vector<uint8_t> header = bootwire::encodeFrameHeader(1, bootwire::kMaxP2pBytes + 1);
  contains(bootwire::parseFrameHeader(std::span<const uint8_t, 16>(header.data(), 16), &tag, &bytes), "-byte message");
  header = bootwire::encodeFrameHeader(1, 1);
  header[4] = 1;
  contains(bootwire::parseFrameHeader(std::span<const uint8_t, 16>(header.data(), 16), &tag, &bytes), "reserved word");

  UniqueIdInfo info{};
  info.rootAddress = "127.0.0.1:29500";
  std::vector<uint8_t> id = bootwire::encodeUniqueId(info);
  id[0] ^= 1;
  contains(bootwire::parseUniqueId(std::span<const uint8_t, LOOM_UNIQUE_ID_BYTES>(id.data(), id.size()), &info),
           "is not from loomGetUniqueId");
}

// ucp_ep_print_info's lanes, as UCX 1.13.1 prints them: an endpoint with peer error handling between processes of
// one host (tcp only: RMA emulated), one without (shared memory, CMA for RMA), and tcp given an RMA role of its own.
TEST(UcxLanes, NativeRmaIsALaneWithAnRmaRoleOtherThanTcp) {
  const char* tcpOnly =
      "#\n# UCP endpoint \n#\n#               peer: <no debug data>\n"
      "#                 lane[0]:  2:tcp/lo.0 md[1]                -> md[1]/tcp/sysdev[255] am am_bw#0 keepalive "
      "wireup\n"
      "#\n#                tag_send: 0..<egr/short>..8185..<egr/zcopy>..20553..<rndv>..(inf)\n"
      "#                  rma_bw: mds rndv_rkey_size 9\n";
  const char* sharedMemory =
      "#                 lane[0]:  0:self/memory0.0 md[0]          -> md[0]/self/sysdev[255]\n"
      "#                 lane[1]:  3:sysv/memory.0 md[2]           -> md[2]/sysv/sysdev[255] am am_bw#0\n"
      "#                 lane[3]:  5:cma/memory.0 md[4]            -> md[4]/cma/sysdev[255] rma_bw#0\n"
      "#                  put[0]: 0..<short>..4294967296..<bcopy>..(inf)\n";
  const char* tcpWithPut =
      "#                 lane[0]:  1:tcp/ib0.0 md[1]     -> md[1]/tcp/sysdev[255] rma_bw#0 am am_bw#0\n";
  const char* infiniBand =
      "#                 lane[0]:  4:rc_mlx5/mlx5_0:1.0 md[2] -> md[2]/ib/sysdev[255] rma#0 amo am am_bw#0\n";
  EXPECT_FALSE(loom::lanesHaveNativeRma(tcpOnly));
  EXPECT_TRUE(loom::lanesHaveNativeRma(sharedMemory));
  EXPECT_FALSE(loom::lanesHaveNativeRma(tcpWithPut));
  EXPECT_TRUE(loom::lanesHaveNativeRma(infiniBand));
  EXPECT_FALSE(loom::lanesHaveNativeRma(""));
  EXPECT_FALSE(loom::lanesHaveNativeRma("#                 lane[0]:"));
}

}  // namespace
