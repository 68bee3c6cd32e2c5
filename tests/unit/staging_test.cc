// The layout of a CUDA communicator's staged calls (src/core/staging.h): which bytes of which buffers each
// collective touches, in-place buffers merged so the staged call sees the same overlap, what is copied in and out.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "src/core/staging.h"

namespace loom {
namespace {

// Addresses in a pretend device buffer: only their arithmetic is used.
char* at(size_t offset) { return reinterpret_cast<char*>(uintptr_t{1} << 40) + offset; }

Call callOf(Collective collective, size_t count, const void* in, void* out) {
  Call call;
  call.collective = collective;
  call.count = count;
  call.datatype = loomFloat32;
  call.inputs = {in};
  call.outputs = {out};
  return call;
}

std::vector<StagedSpan> layout(const std::vector<Call>& calls, int nranks, size_t* total) {
  std::vector<BufferExtent> extents;
  for (const Call& call : calls) extentsOf(call, nranks, &extents);
  return spansOf(extents, total);
}

// Every byte of [pointer, pointer + bytes) lands in one contiguous range of the staging memory.
void expectContiguous(const std::vector<StagedSpan>& spans, const void* pointer, size_t bytes) {
  char* host = at(0) + (uintptr_t{1} << 36);
  char* first = stagedPointer(spans, host, pointer);
  ASSERT_NE(first, nullptr);
  for (size_t i = 0; i < bytes; i += 37)
    ASSERT_EQ(stagedPointer(spans, host, static_cast<const char*>(pointer) + i), first + i) << "byte " << i;
  ASSERT_EQ(stagedPointer(spans, host, static_cast<const char*>(pointer) + bytes - 1), first + bytes - 1);
}

TEST(Staging, OutOfPlaceCopiesTheInputInAndTheOutputOut) {
  size_t total = 0;
  auto spans = layout({callOf(Collective::kAllReduce, 100, at(0), at(1000))}, 4, &total);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].base, at(0));
  EXPECT_EQ(spans[0].bytes, 400u);
  EXPECT_TRUE(spans[0].copyIn);
  EXPECT_FALSE(spans[0].copyOut);
  EXPECT_EQ(spans[1].base, at(1000));
  EXPECT_FALSE(spans[1].copyIn);
  EXPECT_TRUE(spans[1].copyOut);
  EXPECT_EQ(spans[1].offset, 512u);  // 400 bytes rounded up to kStagingAlign
  EXPECT_EQ(total, 1024u);
}

TEST(Staging, InPlaceBuffersShareOneSpan) {
  size_t total = 0;
  // AllReduce in place: one buffer, read and written.
  auto spans = layout({callOf(Collective::kAllReduce, 100, at(0), at(0))}, 4, &total);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_TRUE(spans[0].copyIn && spans[0].copyOut);
  EXPECT_EQ(total, 512u);
  // AllGather in place, rank 2 of 4: the input is the output's third block.
  const size_t block = 25 * 4;
  spans = layout({callOf(Collective::kAllGather, 25, at(2 * block), at(0))}, 4, &total);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].bytes, 4 * block);
  char* host = at(1 << 20);
  EXPECT_EQ(stagedPointer(spans, host, at(2 * block)), host + 2 * block);
  expectContiguous(spans, at(0), 4 * block);
  // ReduceScatter in place, rank 3 of 4: the output is the input's last block.
  spans = layout({callOf(Collective::kReduceScatter, 25, at(0), at(3 * block))}, 4, &total);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].bytes, 4 * block);
  EXPECT_TRUE(spans[0].copyIn && spans[0].copyOut);
}

TEST(Staging, AdjacentBuffersKeepTheirOwnSpans) {
  size_t total = 0;
  // The input ends where the output starts: not merged, and the output's first byte is in its own span.
  auto spans = layout({callOf(Collective::kAllReduce, 25, at(0), at(100))}, 2, &total);
  ASSERT_EQ(spans.size(), 2u);
  char* host = at(1 << 20);
  EXPECT_EQ(stagedPointer(spans, host, at(100)), host + kStagingAlign);
  EXPECT_EQ(stagedPointer(spans, host, at(99)), host + 99);
  expectContiguous(spans, at(100), 100);
}

TEST(Staging, AllToAllvCopiesItsOutputInToKeepTheGaps) {
  Call call = callOf(Collective::kAllToAllv, 0, at(0), at(4096));
  call.sendCounts = {3, 0, 5};
  call.sendDispls = {0, 100, 10};  // a zero count's displacement does not count
  call.recvCounts = {2, 4, 0};
  call.recvDispls = {20, 0, 500};
  size_t total = 0;
  auto spans = layout({call}, 3, &total);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].bytes, 15u * 4);  // up to sdispls[2] + sendcounts[2]
  EXPECT_EQ(spans[1].bytes, 22u * 4);  // up to rdispls[0] + recvcounts[0]
  EXPECT_TRUE(spans[1].copyIn);        // the gaps come back unchanged
  EXPECT_TRUE(spans[1].copyOut);
}

TEST(Staging, SendRecvGroupsAndRootOnlyBuffers) {
  // A merged Send/Recv call: send 10 from a, receive 10 into b, a send of nothing from c.
  Call call;
  call.collective = Collective::kSendRecv;
  call.datatype = loomFloat32;
  call.inputs = {at(0), nullptr, at(5000)};
  call.outputs = {nullptr, at(1000), nullptr};
  call.p2p = {{true, 1, 10}, {false, 1, 10}, {true, 2, 0}};
  size_t total = 0;
  auto spans = layout({call}, 3, &total);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_TRUE(spans[0].copyIn && !spans[0].copyOut);
  EXPECT_TRUE(!spans[1].copyIn && spans[1].copyOut);
  EXPECT_EQ(stagedPointer(spans, at(1 << 20), at(5000)), nullptr);  // nothing reads a buffer of no bytes
  // Gather off the root: no output at all. Barrier: nothing.
  spans = layout({callOf(Collective::kGather, 10, at(0), nullptr)}, 4, &total);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].bytes, 40u);
  spans = layout({callOf(Collective::kBarrier, 1, nullptr, nullptr)}, 4, &total);
  EXPECT_TRUE(spans.empty());
  EXPECT_EQ(total, 0u);
}

TEST(Staging, CallsOfOneGroupThatShareABufferShareItsSpan) {
  size_t total = 0;
  // Three calls read the same input; two write overlapping outputs.
  auto spans = layout({callOf(Collective::kAllReduce, 10, at(0), at(40)),
                       callOf(Collective::kBroadcast, 10, at(0), at(60)),
                       callOf(Collective::kBroadcast, 10, at(0), at(2000))},
                      2, &total);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].bytes, 40u);  // [0, 40), read by all three
  EXPECT_TRUE(spans[0].copyIn && !spans[0].copyOut);
  EXPECT_EQ(spans[1].bytes, 60u);  // [40, 80) and [60, 100), written
  EXPECT_TRUE(!spans[1].copyIn && spans[1].copyOut);
  expectContiguous(spans, at(40), 40);
  expectContiguous(spans, at(60), 40);
  EXPECT_EQ(spans[2].offset, 2 * kStagingAlign);
}

}  // namespace
}  // namespace loom
