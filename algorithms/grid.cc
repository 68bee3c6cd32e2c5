// Collectives as rings along one level of a grid at a time (grid.h): the engine of the torus and hierarchical
// algorithms.
//
// Each channel runs two lanes, one per direction (+1 around every ring on channel c, -1 on channel
// c + nChannels), each over half of the data, so both links of every ring edge carry traffic.
//
// AllReduce: a ring reduce-scatter at level 0 over the lane's data cut into size(0) chunks; then one at level 1
// within the chunk that is now this rank's, and so on; then ring all-gathers back in reverse order. After the
// reduce-scatter of level i a rank holds 1 / (size(0) ... size(i)) of the lane's data, reduced over the ranks
// that share its coordinates from level i+1 on. Steps per lane: 2 sum(size(i) - 1); bytes sent per rank:
// 2 (n-1)/n of the data, as in the ring, but the first level moves the most and the later ones little: put the
// fast links first. A large lane goes as a pipeline of pieces (up to 16; see pipelinePieces): phase j runs stage s
// (a level's reduce-scatter or all-gather) of piece j - s for every s, so that while one piece crosses the slow
// level the next is reduced, and the one before gathered, on the fast one. Only the first piece's fast stages
// and the last's stay exposed, where one piece would expose them all.
// ReduceScatter: the same reduce-scatters over the per-rank blocks. At level i chunk q is the blocks of the
// ranks that share this rank's coordinates before level i and have coordinate q at level i; after the last
// level only this rank's block is left. Partial sums live in scratch, laid out like the input, and the last one
// lands in the output.
// AllGather: the mirror, from the last level to the first, starting from this rank's block.
// Broadcast (two levels): the root scatters its data in size(0) chunks over its level-0 ring (chunk q to
// position q); chunk q then runs down a chain along level 1 (the ranks at position q of every level-0 ring,
// starting from the root's), pipelined by slices; last, every level-0 ring all-gathers its chunks. Each level-1
// chain carries 1/size(0) of the data, so all of them (one per NIC, on a rail-optimised network) work at once.
// Steps: size(0) - 1 + size(1) - 1 + size(0) - 1 along the critical path; bytes per rank about 2/size(0) of the
// data on level 0 and 1/size(0) on level 1.
// In both, a lane carries its part of every block, so a chunk of several blocks goes as one message per block,
// and the blocks of a chunk run as rings of their own one after another (piece i of every chunk forms a ring):
// a rank never has more than one message of a ring in flight, so chunks of many blocks cannot fill a FIFO
// before anyone receives. Bytes sent per rank: (n-1)/n of the data.
//
// Each level's rings read what the previous level's wrote, at other offsets: one phase each (plan.h); the
// AllReduce's pipeline puts the stages of different pieces, which touch disjoint data, in one phase.
#include "algorithms/grid.h"

#include <algorithm>
#include <functional>

namespace loom {

Grid::Grid(std::vector<int> sizes, std::vector<int> coords) : sizes_(std::move(sizes)), coords_(std::move(coords)) {
  size_t points = 1;
  for (int size : sizes_) points *= static_cast<size_t>(size);
  rankTable_.assign(points, -1);
  size_t nranks = sizes_.empty() ? 0 : coords_.size() / sizes_.size();
  for (size_t r = 0; r < nranks; ++r) {
    size_t index = 0;
    for (int level = 0; level < levels(); ++level) index = index * sizes_[level] + coord(static_cast<int>(r), level);
    rankTable_[index] = static_cast<int>(r);
  }
}

int Grid::rankOfCoords(const std::vector<int>& coords) const {
  size_t index = 0;
  for (int level = 0; level < levels(); ++level) index = index * sizes_[level] + coords[level];
  return rankTable_[index];
}

int Grid::rankAt(int rank, int level, int position) const {
  std::vector<int> coords(coords_.begin() + static_cast<ptrdiff_t>(rank) * levels(),
                          coords_.begin() + static_cast<ptrdiff_t>(rank + 1) * levels());
  coords[level] = ((position % sizes_[level]) + sizes_[level]) % sizes_[level];
  return rankOfCoords(coords);
}

std::vector<int> Grid::chunkRanks(int rank, int level, int position) const {
  std::vector<int> coords(coords_.begin() + static_cast<ptrdiff_t>(rank) * levels(),
                          coords_.begin() + static_cast<ptrdiff_t>(rank + 1) * levels());
  coords[level] = ((position % sizes_[level]) + sizes_[level]) % sizes_[level];
  for (int later = level + 1; later < levels(); ++later) coords[later] = 0;
  std::vector<int> ranks;
  for (;;) {
    ranks.push_back(rankOfCoords(coords));
    int later = levels() - 1;
    for (; later > level; --later) {
      if (++coords[later] < sizes_[later]) break;
      coords[later] = 0;
    }
    if (later == level) return ranks;
  }
}

namespace {

// A chunk: the regions (one, or one per block) that one ring message moves.
using Chunk = std::vector<Region>;
using ChunkOf = std::function<Chunk(int position)>;

// One ring of the grid: this rank's level-`level` ring, walked in `direction`.
struct Ring {
  const Grid& grid;
  int rank, level, direction;
  int size() const { return grid.size(level); }
  int position() const { return grid.coord(rank, level); }
  int next() const { return grid.rankAt(rank, level, position() + direction); }
  int prev() const { return grid.rankAt(rank, level, position() - direction); }
};

// Reduce-scatter along one ring: this rank ends with chunk position(), op over the ring, in final(position()).
// local(q) is where this rank's partial of chunk q is.
void ringReduceScatter(const Ring& ring, const ChunkOf& local, const ChunkOf& final, Lane* lane) {
  int n = ring.size(), position = ring.position(), next = ring.next(), prev = ring.prev();
  std::vector<Chunk> chunks(n);  // by steps from this rank's own: chunk position - direction * (j + 1)
  for (int j = 0; j < n; ++j) chunks[j] = local(position - ring.direction * (j + 1));
  Chunk to = final(position);
  for (size_t i = 0; i < to.size(); ++i) {
    lane->steps.push_back(send(next, chunks[0][i]));
    for (int j = 1; j <= n - 2; ++j) lane->steps.push_back(recvReduceSend(prev, chunks[j][i], next));
    lane->steps.push_back(recvReduce(prev, chunks[n - 1][i], to[i]));
  }
}

// All-gather along one ring: this rank holds chunk position() in out(position()) and ends with all of them.
void ringAllGather(const Ring& ring, const ChunkOf& out, Lane* lane) {
  int n = ring.size(), position = ring.position(), next = ring.next(), prev = ring.prev();
  std::vector<Chunk> chunks(n);  // chunk position - direction * j
  for (int j = 0; j < n; ++j) chunks[j] = out(position - ring.direction * j);
  for (size_t i = 0; i < chunks[0].size(); ++i) {
    lane->steps.push_back(send(next, chunks[0][i]));
    for (int j = 1; j <= n - 2; ++j) lane->steps.push_back(recvCopySend(prev, chunks[j][i], next));
    lane->steps.push_back(recv(prev, chunks[n - 1][i]));
  }
}

// The levels that have rings (size > 1), in order.
std::vector<int> ringLevels(const Grid& grid) {
  std::vector<int> levels;
  for (int level = 0; level < grid.levels(); ++level)
    if (grid.size(level) > 1) levels.push_back(level);
  return levels;
}

// Calls build(lane, direction, part, parts) for each lane: two per channel, part = its index among them.
template <class Build>
void forEachLane(const CollArgs& args, RankPlan* plan, Build&& build) {
  int parts = 2 * args.nChannels;
  for (int c = 0; c < args.nChannels; ++c) {
    for (int direction : {+1, -1}) {
      int part = direction > 0 ? 2 * c : 2 * c + 1;
      Lane lane{direction > 0 ? c : c + args.nChannels, {}};
      build(&lane, direction, part, parts);
      if (!lane.steps.empty()) plan->lanes.push_back(std::move(lane));
    }
  }
}

// Part `part` of the blocks of `ranks` in `buffer`: one region per block.
Chunk blocksOf(const CollArgs& args, Buffer buffer, const std::vector<int>& ranks, int parts, int part) {
  Chunk chunk;
  for (int r : ranks) chunk.push_back(blockPart(buffer, args.count, parts, part, r));
  return chunk;
}

// A lane's share of an AllReduce, or a part of it: elements [offset, offset + count).
struct Block {
  size_t offset, count;
};

// Chunk q (mod n) of n of a block.
Block chunkOf(Block b, int n, int q) {
  q = ((q % n) + n) % n;
  return Block{b.offset + partOffset(b.count, n, q), partCount(b.count, n, q)};
}

// Whether a step writes memory that `region` may share: its destination overlaps it, the input and the output
// taken as one buffer (in place they are).
bool writesInto(const Step& step, const Region& region) {
  if (step.action == Action::kSend || step.action == Action::kRecvReduceSend) return false;
  const Region& dst = step.dst;
  bool sameBuffer =
      dst.buffer == region.buffer || (dst.buffer != Buffer::kScratch && region.buffer != Buffer::kScratch);
  return sameBuffer && dst.bufferIndex == region.bufferIndex && dst.offset < region.offset + region.count &&
         region.offset < dst.offset + dst.count;
}

// Appends `phase` to `steps` with each plain send moved as early as it may go: past steps that neither send to
// its peer (each connection keeps its order of messages) nor write what it sends. A lane runs a round's slices
// in step order and waits at the first receive whose message has not come, so the sends of every stage of the
// phase go out before it waits: a pipeline's slow level then carries two stages' messages at once.
void appendSendsFirst(std::vector<Step> phase, std::vector<Step>* steps) {
  std::vector<Step> ordered;
  for (Step& step : phase) {
    size_t at = ordered.size();
    if (step.action == Action::kSend) {
      for (; at > 0; --at) {
        const Step& before = ordered[at - 1];
        if ((actionSends(before.action) && before.sendPeer == step.sendPeer) || writesInto(before, step.src)) break;
      }
    }
    ordered.insert(ordered.begin() + static_cast<ptrdiff_t>(at), std::move(step));
  }
  steps->insert(steps->end(), ordered.begin(), ordered.end());
}

// Pieces an AllReduce lane of `count` elements is pipelined in: with two or more levels, as many as keep the
// smallest chunk (what a rank holds after the last reduce-scatter) at kPieceChunkElements or more, up to
// kMaxPieces. One level has nothing to overlap: one piece.
constexpr size_t kPieceChunkElements = size_t{1} << 16;
constexpr size_t kMaxPieces = 16;
int pipelinePieces(const Grid& grid, const std::vector<int>& levels, size_t count) {
  if (levels.size() < 2) return 1;
  size_t points = 1;
  for (int level : levels) points *= static_cast<size_t>(grid.size(level));
  return static_cast<int>(std::clamp<size_t>(count / (points * kPieceChunkElements), 1, kMaxPieces));
}

}  // namespace

RankPlan gridAllReduce(const CollArgs& args, const Grid& grid, const char* name) {
  RankPlan plan = planShell(args, name);
  std::vector<int> levels = ringLevels(grid);
  forEachLane(args, &plan, [&](Lane* lane, int direction, int part, int parts) {
    Block block{partOffset(args.count, parts, part), partCount(args.count, parts, part)};
    if (block.count == 0) return;
    if (levels.empty()) {
      lane->steps.push_back(copy(input(block.offset, block.count), output(block.offset, block.count)));
      return;
    }
    // Stage s of piece p: stages[p][s]; a stage is one level's reduce-scatter or all-gather.
    int pieces = pipelinePieces(grid, levels, block.count);
    std::vector<std::vector<std::vector<Step>>> stages(pieces);
    for (int p = 0; p < pieces; ++p) {
      Block piece{block.offset + partOffset(block.count, pieces, p), partCount(block.count, pieces, p)};
      std::vector<Block> held{piece};  // the block held after each level's reduce-scatter
      for (int level : levels) {
        Ring ring{grid, args.rank, level, direction};
        Block whole = held.back();
        Buffer from = held.size() == 1 ? Buffer::kInput : Buffer::kOutput;
        Lane stage;
        ringReduceScatter(ring, [&](int q) {
          Block b = chunkOf(whole, ring.size(), q);
          return Chunk{{from, b.offset, b.count}};
        }, [&](int q) {
          Block b = chunkOf(whole, ring.size(), q);
          return Chunk{output(b.offset, b.count)};
        }, &stage);
        stages[p].push_back(std::move(stage.steps));
        held.push_back(chunkOf(whole, ring.size(), ring.position()));
      }
      for (auto level = levels.rbegin(); level != levels.rend(); ++level) {
        Ring ring{grid, args.rank, *level, direction};
        held.pop_back();
        Block whole = held.back();
        Lane stage;
        ringAllGather(ring, [&](int q) {
          Block b = chunkOf(whole, ring.size(), q);
          return Chunk{output(b.offset, b.count)};
        }, &stage);
        stages[p].push_back(std::move(stage.steps));
      }
    }
    // Phase j: stage s of piece j - s, for every s. Each stage reads what the stage before it wrote (at other
    // offsets), a phase earlier; the pieces of one phase touch disjoint data.
    int stageCount = static_cast<int>(stages[0].size());
    for (int j = 0; j < pieces + stageCount - 1; ++j) {
      std::vector<Step> phase;
      for (int s = 0; s < stageCount; ++s) {
        int p = j - s;
        if (p >= 0 && p < pieces) phase.insert(phase.end(), stages[p][s].begin(), stages[p][s].end());
      }
      lane->startPhase();
      appendSendsFirst(std::move(phase), &lane->steps);
    }
  });
  plan.reducedOutput = output(0, args.count);
  return plan;
}

RankPlan gridReduceScatter(const CollArgs& args, const Grid& grid, const char* name) {
  RankPlan plan = planShell(args, name);
  std::vector<int> levels = ringLevels(grid);
  plan.scratchCount = levels.size() > 1 ? static_cast<size_t>(args.nranks) * args.count : 0;
  forEachLane(args, &plan, [&](Lane* lane, int direction, int part, int parts) {
    if (partCount(args.count, parts, part) == 0) return;
    Region out = output(partOffset(args.count, parts, part), partCount(args.count, parts, part));
    if (levels.empty()) {
      lane->steps.push_back(copy(blockPart(Buffer::kInput, args.count, parts, part, 0), out));
      return;
    }
    for (size_t i = 0; i < levels.size(); ++i) {
      Ring ring{grid, args.rank, levels[i], direction};
      bool first = i == 0, last = i + 1 == levels.size();
      auto local = [&](int q) {
        return blocksOf(args, first ? Buffer::kInput : Buffer::kScratch, grid.chunkRanks(args.rank, ring.level, q),
                        parts, part);
      };
      auto final = [&](int q) {
        return last ? Chunk{out}
                    : blocksOf(args, Buffer::kScratch, grid.chunkRanks(args.rank, ring.level, q), parts, part);
      };
      lane->startPhase();
      ringReduceScatter(ring, local, final, lane);
    }
  });
  plan.reducedOutput = output(0, args.count);
  return plan;
}

RankPlan gridAllGather(const CollArgs& args, const Grid& grid, const char* name) {
  RankPlan plan = planShell(args, name);
  std::vector<int> levels = ringLevels(grid);
  forEachLane(args, &plan, [&](Lane* lane, int direction, int part, int parts) {
    if (partCount(args.count, parts, part) == 0) return;
    Region in = input(partOffset(args.count, parts, part), partCount(args.count, parts, part));
    // In place the copy's source and destination coincide; the executor skips it.
    lane->steps.push_back(copy(in, blockPart(Buffer::kOutput, args.count, parts, part, args.rank)));
    for (auto level = levels.rbegin(); level != levels.rend(); ++level) {
      Ring ring{grid, args.rank, *level, direction};
      lane->startPhase();
      ringAllGather(ring, [&](int q) {
        return blocksOf(args, Buffer::kOutput, grid.chunkRanks(args.rank, ring.level, q), parts, part);
      }, lane);
    }
  });
  return plan;
}

RankPlan gridBroadcast(const CollArgs& args, const Grid& grid, const char* name) {
  RankPlan plan = planShell(args, name);
  int rank = args.rank, root = args.root, local = grid.coord(rank, 0);
  int ringSize = grid.size(0), chainSize = grid.size(1);
  bool rootRing = grid.coord(rank, 1) == grid.coord(root, 1);
  int chainPosition = ((grid.coord(rank, 1) - grid.coord(root, 1)) % chainSize + chainSize) % chainSize;
  for (int c = 0; c < args.nChannels; ++c) {
    size_t offset = partOffset(args.count, args.nChannels, c), count = partCount(args.count, args.nChannels, c);
    if (count == 0) continue;
    auto chunk = [&](Buffer buffer, int q) {
      q = ((q % ringSize) + ringSize) % ringSize;
      return Region{buffer, offset + partOffset(count, ringSize, q), partCount(count, ringSize, q)};
    };
    Lane lane{c, {}};
    // Scatter over the root's level-0 ring (in place the root's copy onto itself is skipped by the executor).
    if (rank == root) {
      for (int q = 0; q < ringSize; ++q) {
        if (q == local) {
          lane.steps.push_back(copy(chunk(Buffer::kInput, q), chunk(Buffer::kOutput, q)));
        } else {
          lane.steps.push_back(send(grid.rankAt(root, 0, q), chunk(Buffer::kInput, q)));
        }
      }
    } else if (rootRing) {
      lane.steps.push_back(recv(root, chunk(Buffer::kOutput, local)));
    }
    // This position's chain along level 1, from the root's ring on.
    if (chainSize > 1) {
      int next = grid.rankAt(rank, 1, grid.coord(rank, 1) + 1), prev = grid.rankAt(rank, 1, grid.coord(rank, 1) - 1);
      Region mine = chunk(Buffer::kOutput, local);
      lane.startPhase();
      if (chainPosition == 0) {
        lane.steps.push_back(send(next, rank == root ? chunk(Buffer::kInput, local) : mine));
      } else if (chainPosition < chainSize - 1) {
        lane.steps.push_back(recvCopySend(prev, mine, next));
      } else {
        lane.steps.push_back(recv(prev, mine));
      }
    }
    if (ringSize > 1) {
      lane.startPhase();
      ringAllGather(Ring{grid, rank, 0, +1}, [&](int q) { return Chunk{chunk(Buffer::kOutput, q)}; }, &lane);
    }
    plan.lanes.push_back(std::move(lane));
  }
  return plan;
}

}  // namespace loom
