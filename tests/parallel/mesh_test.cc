// The rank grid (parallel/mesh) against worked examples (Megatron's order and numbering), its errors, the expert
// mesh's folding, and the communicators of each group with ranks as threads.
#include "parallel/mesh/mesh.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "parallel/check.h"

namespace loom::parallel {
namespace {

Mesh megatronExample() {  // tp=2, dp=3, pp=4: 24 ranks
  Mesh mesh;
  std::string error;
  EXPECT_TRUE(Mesh::make("tp-cp-ep-dp-pp", {{"tp", 2}, {"dp", 3}, {"pp", 4}}, 24, &mesh, &error)) << error;
  return mesh;
}

TEST(Mesh, MegatronWorkedExample) {
  const Mesh mesh = megatronExample();
  const auto dp = mesh.groups("dp");
  ASSERT_EQ(dp.size(), 8u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(dp[7], (std::vector<int>{19, 21, 23}));
  const auto tp = mesh.groups("tp");
  ASSERT_EQ(tp.size(), 12u);
  EXPECT_EQ(tp[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(tp[11], (std::vector<int>{22, 23}));
  const auto pp = mesh.groups("pp");
  ASSERT_EQ(pp.size(), 6u);
  EXPECT_EQ(pp[0], (std::vector<int>{0, 6, 12, 18}));
  EXPECT_EQ(pp[5], (std::vector<int>{5, 11, 17, 23}));
  EXPECT_EQ(mesh.group("tp-dp", 13), (std::vector<int>{12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(mesh.coordinate(19, "tp"), 1);
  EXPECT_EQ(mesh.coordinate(19, "dp"), 0);
  EXPECT_EQ(mesh.coordinate(19, "pp"), 3);
  EXPECT_EQ(mesh.groupIndex("dp", 21), 7);
}

TEST(Mesh, GroupsPartitionTheWorld) {
  const Mesh mesh = megatronExample();
  for (const std::string dims : {"tp", "dp", "pp", "tp-dp", "dp-pp", "tp-pp", "tp-dp-pp"}) {
    std::set<int> seen;
    for (const auto& group : mesh.groups(dims)) {
      for (int rank : group) EXPECT_TRUE(seen.insert(rank).second) << dims << ": rank " << rank << " twice";
      for (int rank : group) EXPECT_EQ(mesh.group(dims, rank), group) << dims;
    }
    EXPECT_EQ(seen.size(), 24u) << dims;
  }
}

TEST(Mesh, BadLayoutsAreRefusedByName) {
  Mesh mesh;
  std::string error;
  EXPECT_FALSE(Mesh::make("tp-dp-pp", {{"tp", 2}, {"dp", 3}}, 8, &mesh, &error));
  EXPECT_NE(error.find("not the world's 8"), std::string::npos) << error;
  EXPECT_FALSE(Mesh::make("tp-dp-pp", {{"xp", 2}}, 2, &mesh, &error));
  EXPECT_NE(error.find("\"xp\""), std::string::npos) << error;
  EXPECT_FALSE(Mesh::make("tp-tp", {}, 1, &mesh, &error));
  EXPECT_NE(error.find("repeated"), std::string::npos) << error;
  EXPECT_FALSE(Mesh::make("tp-dp", {{"tp", 0}}, 1, &mesh, &error));
  EXPECT_NE(error.find("below 1"), std::string::npos) << error;
  ParallelMeshes meshes;
  EXPECT_FALSE(ParallelMeshes::make(ParallelSizes{2, 1, 2, 2, 3, 0, "tp-cp-ep-dp-pp"}, 8, &meshes, &error));
  EXPECT_NE(error.find("does not divide"), std::string::npos) << error;
}

// Megatron's parallel folding: attention on tp=2 x dp=4 per stage, experts on ep=4 x edp=2 of the same ranks, the
// pipeline groups shared.
TEST(Mesh, ExpertMeshFoldsTheSameStages) {
  ParallelMeshes meshes;
  std::string error;
  ParallelSizes sizes;
  sizes.tp = 2, sizes.dp = 4, sizes.pp = 2, sizes.ep = 4, sizes.etp = 1;
  ASSERT_TRUE(ParallelMeshes::make(sizes, 16, &meshes, &error)) << error;
  EXPECT_EQ(meshes.expert.size("dp"), 2);
  EXPECT_EQ(meshes.expert.groups("pp"), meshes.dense.groups("pp"));
  EXPECT_EQ(meshes.expert.group("ep", 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(meshes.expert.group("dp", 0), (std::vector<int>{0, 4}));
  ParallelSizes dense;  // cp and ep of size 1 may be left out of the order
  dense.tp = 2, dense.dp = 4, dense.pp = 2, dense.order = "tp-dp-pp";
  ParallelMeshes denseOnly;
  EXPECT_TRUE(ParallelMeshes::make(dense, 16, &denseOnly, &error)) << error;
  for (int rank = 0; rank < 16; ++rank)  // an expert group never leaves its stage
    for (int member : meshes.expert.group("ep-dp", rank))
      EXPECT_EQ(meshes.dense.coordinate(member, "pp"), meshes.dense.coordinate(rank, "pp"));
}

// Each rank splits its groups' communicators and sums its world rank over each: the sum of the group's ranks.
TEST(MeshComms, EveryGroupCommunicatesWithinItself) {
  constexpr int kWorld = 8;
  Mesh mesh;
  std::string error;
  ASSERT_TRUE(Mesh::make("tp-dp-pp", {{"tp", 2}, {"dp", 2}, {"pp", 2}}, kWorld, &mesh, &error)) << error;
  const std::vector<std::string> sets = {"tp", "dp", "pp", "tp-dp"};
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  std::vector<std::vector<int>> sums(kWorld), sizes(kWorld);
  auto rankMain = [&](int rank) {
    loomComm_t world = nullptr;
    LOOM_PAR_CHECK(world, loomCommInitRank(&world, kWorld, id, rank));
    {
      MeshComms comms(world, mesh, sets);
      for (const std::string& dims : sets) {
        int value = rank, count = 0;
        LOOM_PAR_CHECK(world, loomAllReduce(&value, &value, 1, loomInt32, loomSum, comms.get(dims), nullptr));
        loomCommCount(comms.get(dims), &count);
        sums[rank].push_back(value);
        sizes[rank].push_back(count);
      }
      EXPECT_EQ(comms.get("cp"), nullptr);
    }
    loomCommDestroy(world);
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) threads.emplace_back(rankMain, rank);
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < kWorld; ++rank)
    for (size_t i = 0; i < sets.size(); ++i) {
      const std::vector<int> group = mesh.group(sets[i], rank);
      EXPECT_EQ(sums[rank][i], std::accumulate(group.begin(), group.end(), 0)) << sets[i] << " rank " << rank;
      EXPECT_EQ(sizes[rank][i], static_cast<int>(group.size())) << sets[i] << " rank " << rank;
    }
}

}  // namespace
}  // namespace loom::parallel
