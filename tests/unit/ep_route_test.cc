// unit suite: the pure parts of expert dispatch (src/ep/route.h, src/ep/ll_words.h): shape checks, routing (one
// record per token and destination, its picks in choice order), records written and read back, where rows land
// (Placement: by source, then token, up to the capacity), and the LL words that tell a whole header from a torn one.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "src/ep/ll_words.h"
#include "src/ep/route.h"

namespace loom::ep {
namespace {

loomEpConfig_t config(int experts, int topk) {
  loomEpConfig_t c = LOOM_EP_CONFIG_INITIALIZER;
  c.maxTokensPerRank = 4;
  c.hidden = 3;
  c.numExperts = experts;
  c.topk = topk;
  c.datatype = loomFloat32;
  return c;
}

TEST(EpShape, ChecksTheConfig) {
  Shape shape;
  std::string why;
  ASSERT_TRUE(makeShape(config(8, 2), 4, 1, &shape, &why)) << why;
  EXPECT_EQ(shape.localExperts, 2);
  EXPECT_EQ(shape.capacity, 16);  // nranks x maxTokensPerRank
  EXPECT_EQ(shape.rowWords(), 3u);
  EXPECT_EQ(shape.metaWords(), kMetaWords + 4);
  EXPECT_FALSE(makeShape(config(6, 2), 4, 1, &shape, &why));
  EXPECT_NE(why.find("multiple of the rank count"), std::string::npos) << why;
  EXPECT_FALSE(makeShape(config(8, 9), 4, 1, &shape, &why));
  loomEpConfig_t c = config(8, 2);
  c.datatype = loomInt8;
  EXPECT_FALSE(makeShape(c, 4, 1, &shape, &why));
  c = config(8, 2);
  c.expertCapacity = -1;
  EXPECT_FALSE(makeShape(c, 4, 1, &shape, &why));
}

TEST(EpRoute, OneRecordPerTokenAndRankWithItsPicks) {
  Shape shape;
  std::string why;
  ASSERT_TRUE(makeShape(config(8, 3), 4, 0, &shape, &why)) << why;
  // Token 0: experts 5, 4 (both rank 2) and 0 (rank 0); token 1: 7 and 1, one masked; token 2: nothing.
  const std::vector<int32_t> idx = {5, 4, 0, 7, -1, 1, -1, -1, -1};
  const std::vector<float> w = {0.5f, 0.25f, 0.125f, 1, 0, 2, 0, 0, 0};
  ASSERT_TRUE(checkRouting(shape, 3, idx.data(), w.data(), &why)) << why;
  std::vector<Outgoing> out;
  route(
      shape, 3, idx.data(), w.data(), 4, [&](int e) { return shape.rankOfExpert(e); }, true, &out);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(out[1].size(), 0u);
  EXPECT_EQ(out[2].tokens, (std::vector<int32_t>{0}));
  EXPECT_EQ(out[3].tokens, (std::vector<int32_t>{1}));
  EXPECT_EQ(out[2].pickStart, (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(out[2].picks[0].expert, 5);
  EXPECT_EQ(out[2].picks[1].expert, 4);
  EXPECT_EQ(out[2].perLocalExpert, (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(out[0].perLocalExpert, (std::vector<int32_t>{1, 1}));
  // A record read back names its source, token, picks and row.
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<uint32_t> words(shape.recordWords());
  encodeRecord(shape, 0, out[2], 0, x.data(), words.data());
  RecordView view;
  ASSERT_TRUE(readRecord(shape, words.data(), &view, &why)) << why;
  EXPECT_EQ(view.source, 0);
  EXPECT_EQ(view.token, 0);
  ASSERT_EQ(view.picks, 2);
  EXPECT_EQ(view.expert(1), 4);
  EXPECT_EQ(view.weight(0), 0.5f);
  EXPECT_EQ(std::memcmp(view.row, x.data(), 3 * sizeof(float)), 0);
  words[2] = 4;  // more picks than top-k
  EXPECT_FALSE(readRecord(shape, words.data(), &view, &why));
}

TEST(EpRoute, RefusesBadChoices) {
  Shape shape;
  std::string why;
  ASSERT_TRUE(makeShape(config(8, 2), 4, 0, &shape, &why)) << why;
  std::vector<float> w(2, 1.0f);
  std::vector<int32_t> idx = {8, 0};
  EXPECT_FALSE(checkRouting(shape, 1, idx.data(), w.data(), &why));
  EXPECT_NE(why.find("topkIdx[0][0] = 8"), std::string::npos) << why;
  idx = {3, 3};
  EXPECT_FALSE(checkRouting(shape, 1, idx.data(), w.data(), &why));
  EXPECT_NE(why.find("twice"), std::string::npos) << why;
  idx = {3, 2};
  w[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(checkRouting(shape, 1, idx.data(), w.data(), &why));
  idx = {3, -1};  // a masked choice's weight is not read
  EXPECT_TRUE(checkRouting(shape, 1, idx.data(), w.data(), &why)) << why;
}

TEST(EpPlacement, RowsBySourceThenTokenUpToTheCapacity) {
  Shape shape;
  std::string why;
  loomEpConfig_t c = config(6, 1);
  c.expertCapacity = 3;
  ASSERT_TRUE(makeShape(c, 3, 0, &shape, &why)) << why;  // 2 local experts
  // counts[source][expert]: expert 0 gets 1 + 2 + 1 = 4 rows (one past the capacity), expert 1 gets 2.
  Placement placement;
  placement.start(shape, {1, 0, 2, 2, 1, 0});
  EXPECT_EQ(placement.next(1, 0), 1);  // after source 0's one row
  EXPECT_EQ(placement.next(0, 0), 0);
  EXPECT_EQ(placement.next(1, 0), 2);
  EXPECT_EQ(placement.next(2, 0), -1);  // the fourth row: past the capacity
  EXPECT_EQ(placement.next(1, 1), 0);
  EXPECT_EQ(placement.overflowRows(), 1);
  EXPECT_EQ(placement.firstOverflowExpert(), 0);
  int counts[2];
  placement.countsOut(counts);
  EXPECT_EQ(counts[0], 3);
  EXPECT_EQ(counts[1], 2);
}

TEST(EpLlWords, AWordWithAnotherFlagMakesTheReadIncomplete) {
  const uint32_t data[5] = {1, 2, 3, 4, 0xffffffffu};
  uint64_t words[5] = {};
  uint32_t back[5] = {};
  EXPECT_FALSE(llGet(back, words, 5, 7));  // zeroed memory never carries a flag
  llPut(words, data, 5, 7);
  EXPECT_TRUE(llLastReady(words, 5, 7));
  ASSERT_TRUE(llGet(back, words, 5, 7));
  EXPECT_EQ(std::memcmp(back, data, sizeof(data)), 0);
  words[2] = (words[2] & 0xffffffffu) | uint64_t{6} << 32;  // one word still from the call before
  EXPECT_FALSE(llGet(back, words, 5, 7));
  EXPECT_FALSE(llGet(back, words, 5, 8));
  uint64_t slot[2] = {42, 0};
  EXPECT_FALSE(slotReady(slot + 1, 3));
  slotPublish(slot + 1, 3);
  EXPECT_TRUE(slotReady(slot + 1, 3));
}

}  // namespace
}  // namespace loom::ep
