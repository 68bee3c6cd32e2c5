// ep_perf: expert dispatch and combine (loom_ep.h) timed in DeepEP's shapes, beside the ceiling and a peer measured
// in the same run.
//
//   loomrun -n 2 build/perf/ep_perf                     loom's two modes
//   mpirun -n 2 --oversubscribe build/perf/ep_perf      the same, plus the same dispatch built from MPI
//                                                       (MPI_Alltoall of the counts, then MPI_Alltoallv)
// Flags (--help): --tokens per rank (128), --hidden (7168), --topk (8), --experts (256, or the largest multiple of
// the rank count up to it), --capacity per expert (0: full), --modes (ll,normal,mpi), --copy-mib each rank copies
// for the copy rate (256); -w warm-up and -n timed iterations (5, 20) as nccl-tests spells them. nccl-tests'
// other letters (-t, -e, -c, -m, -C, ...) are refused by name: they mean something else there.
//
// Each rank routes its tokens to top-k distinct experts drawn uniformly (seeded), in bfloat16. Every iteration is
// barrier, dispatch, barrier, identity experts, combine; a call's time is the slowest rank's. The table gives, per
// mode and phase, the average, fastest and slowest time; DeepEP's bandwidth (bytes counted per selection: tokens x
// chosen experts x hidden x 2, over the time); the bytes the call placed (rows written into recvX on dispatch,
// rows summed into out on combine) and their rate; and that rate as a share of the memory copy rate measured here
// with every rank copying at once. #wrong counts output elements of the last combine that differ from
// x * sum(weights) by more than bfloat16's rounding.
#include <loom/loom.h>
#include <loom/loom_ep.h>
#include <getopt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "perf/cli.h"

#if LOOM_EP_PERF_MPI
#include <mpi.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int tokens = 128, hidden = 7168, topk = 8, experts = 256, capacity = 0, warmup = 5, iterations = 20;
  size_t ceilingBytes = size_t{256} << 20;
  std::string modes = "ll,normal,mpi";
};

[[noreturn]] void die(const char* what, const char* detail) {
  std::fprintf(stderr, "ep_perf: %s: %s\n", what, detail);
  std::exit(1);
}

void check(loomResult_t result, const char* what, loomComm_t comm) {
  if (result != loomSuccess) die(what, loomGetLastError(comm));
}

uint16_t toBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
float fromBf16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct Inputs {
  std::vector<uint16_t> x;
  std::vector<int32_t> idx;
  std::vector<float> w;
  size_t selections = 0;
};

Inputs makeInputs(const Options& o, int rank) {
  std::mt19937 g(12345u + static_cast<uint32_t>(rank));
  Inputs in;
  in.x.resize(static_cast<size_t>(o.tokens) * o.hidden);
  for (uint16_t& v : in.x) v = toBf16(static_cast<float>(static_cast<int>(g() % 65) - 32) / 8.0f);
  in.idx.resize(static_cast<size_t>(o.tokens) * o.topk);
  in.w.resize(in.idx.size());
  for (int t = 0; t < o.tokens; ++t)
    for (int j = 0; j < o.topk; ++j) {
      int32_t* row = in.idx.data() + static_cast<size_t>(t) * o.topk;
      int e;
      do e = static_cast<int>(g() % static_cast<uint32_t>(o.experts));
      while (std::find(row, row + j, e) != row + j);
      row[j] = e;
      in.w[static_cast<size_t>(t) * o.topk + j] = static_cast<float>(1 + g() % 16) / 16.0f;
      ++in.selections;
    }
  return in;
}

// Elements of out that differ from x * sum(weights) by more than bfloat16's rounding allows.
long wrongElements(const Options& o, const Inputs& in, const std::vector<uint16_t>& out) {
  long wrong = 0;
  for (int t = 0; t < o.tokens; ++t) {
    float sum = 0;
    for (int j = 0; j < o.topk; ++j) sum += in.w[static_cast<size_t>(t) * o.topk + j];
    for (int h = 0; h < o.hidden; ++h) {
      size_t i = static_cast<size_t>(t) * o.hidden + h;
      double want = static_cast<double>(fromBf16(in.x[i])) * sum;
      wrong += std::fabs(fromBf16(out[i]) - want) > (std::fabs(want) + 0.125) / 64;
    }
  }
  return wrong;
}

// One phase's times over the iterations (each the slowest rank's) and the bytes it placed on this rank.
struct PhaseTimes {
  std::vector<double> us;
  double placedBytes = 0;
};

struct Run {
  std::string mode;
  PhaseTimes dispatch, combine;
  long wrong = 0;
  size_t bufferBytes = 0;  // loom's receive buffers (low-latency mode)
};

// The communicator's collectives that every mode's timing uses, whatever moves the tokens.
struct Ranks {
  loomComm_t comm;
  int rank, nranks;
  void barrier() { check(loomBarrier(comm, nullptr), "barrier", comm); }
  double max(double value) {
    check(loomAllReduce(&value, &value, 1, loomFloat64, loomMax, comm, nullptr), "allreduce", comm);
    return value;
  }
  double sum(double value) {
    check(loomAllReduce(&value, &value, 1, loomFloat64, loomSum, comm, nullptr), "allreduce", comm);
    return value;
  }
};

template <typename Call>
double timed(Ranks& ranks, Call call) {
  ranks.barrier();
  auto start = Clock::now();
  call();
  double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  return ranks.max(us);
}

// Times `o.iterations` dispatch and combine pairs, after `o.warmup` untimed ones, into `run`.
template <typename Dispatch, typename Combine>
void timePairs(const Options& o, Ranks& ranks, Dispatch dispatch, Combine combine, Run* run) {
  for (int i = 0; i < o.warmup + o.iterations; ++i) {
    double d = timed(ranks, dispatch);
    double c = timed(ranks, combine);
    if (i < o.warmup) continue;
    run->dispatch.us.push_back(d);
    run->combine.us.push_back(c);
  }
}

Run runLoom(const Options& o, Ranks& ranks, const Inputs& in, loomEpMode_t mode) {
  loomEpConfig_t config = LOOM_EP_CONFIG_INITIALIZER;
  config.maxTokensPerRank = o.tokens;
  config.hidden = o.hidden;
  config.numExperts = o.experts;
  config.topk = o.topk;
  config.datatype = loomBfloat16;
  config.mode = mode;
  config.expertCapacity = o.capacity;
  loomEp_t ep = nullptr;
  check(loomEpCreate(ranks.comm, &config, &ep), "loomEpCreate", ranks.comm);
  const int local = o.experts / ranks.nranks;
  const size_t capacity =
      o.capacity > 0 ? static_cast<size_t>(o.capacity) : static_cast<size_t>(ranks.nranks) * o.tokens;
  std::vector<uint16_t> recvX(static_cast<size_t>(local) * capacity * o.hidden);
  std::vector<uint16_t> out(static_cast<size_t>(o.tokens) * o.hidden);
  std::vector<int> counts(local);
  Run run;
  run.mode = mode == loomEpLowLatency ? "low-latency" : "normal";
  loomEpHandle_t handle = nullptr;
  auto dispatch = [&] {
    loomEpHandleFree(handle);  // the last iteration's
    check(loomEpDispatch(ep, in.x.data(), o.tokens, in.idx.data(), in.w.data(), recvX.data(), counts.data(), &handle,
                         nullptr),
          "loomEpDispatch", ranks.comm);
  };
  auto combine = [&] {
    check(loomEpCombine(ep, recvX.data(), handle, out.data(), nullptr), "loomEpCombine", ranks.comm);
  };
  timePairs(o, ranks, dispatch, combine, &run);
  loomEpHandleFree(handle);
  long rows = 0;
  for (int n : counts) rows += n;
  run.dispatch.placedBytes = static_cast<double>(rows) * o.hidden * 2;
  run.combine.placedBytes = run.dispatch.placedBytes;  // every placed row is weighted back into its token
  run.wrong = wrongElements(o, in, out);
  loomEpStats_t stats;
  check(loomEpGetStats(ep, &stats), "loomEpGetStats", ranks.comm);
  run.bufferBytes = stats.bufferBytes;
  loomEpDestroy(ep);
  return run;
}

#if LOOM_EP_PERF_MPI
// MPI_Alltoallv of items of `itemBytes`: sendItems[p] to each peer p from `send` (peer after peer), recvItems[p]
// from each into `recv` (resized to hold them), peer after peer.
template <typename T>
void alltoallv(const T* send, const std::vector<int>& sendItems, const std::vector<int>& recvItems, size_t itemBytes,
               std::vector<T>* recv) {
  const size_t nranks = sendItems.size();
  std::vector<int> sendBytes(nranks), recvBytes(nranks), sendDispls(nranks), recvDispls(nranks);
  int sendTotal = 0, recvTotal = 0;
  for (size_t p = 0; p < nranks; ++p) {
    sendBytes[p] = sendItems[p] * static_cast<int>(itemBytes);
    recvBytes[p] = recvItems[p] * static_cast<int>(itemBytes);
    sendDispls[p] = sendTotal;
    recvDispls[p] = recvTotal;
    sendTotal += sendBytes[p];
    recvTotal += recvBytes[p];
  }
  recv->resize(static_cast<size_t>(recvTotal) / sizeof(T) + 1);
  MPI_Alltoallv(send, sendBytes.data(), sendDispls.data(), MPI_BYTE, recv->data(), recvBytes.data(), recvDispls.data(),
                MPI_BYTE, MPI_COMM_WORLD);
}

// The same dispatch and combine from MPI: the tokens for each rank (once per rank, with their experts and weights)
// packed, MPI_Alltoall of the counts, MPI_Alltoallv of the records, unpacked into recvX by local expert in source
// order; the combine sends each record's weighted sum back (MPI_Alltoallv) and the source adds them.
Run runMpi(const Options& o, Ranks& ranks, const Inputs& in) {
  const int nranks = ranks.nranks, rank = ranks.rank, local = o.experts / nranks;
  const size_t capacity = o.capacity > 0 ? static_cast<size_t>(o.capacity) : static_cast<size_t>(nranks) * o.tokens;
  const size_t metaBytes = 8 + 8 * static_cast<size_t>(o.topk), rowBytes = static_cast<size_t>(o.hidden) * 2;
  const size_t recordBytes = metaBytes + rowBytes;
  std::vector<uint16_t> recvX(static_cast<size_t>(local) * capacity * o.hidden), out(in.x.size());
  std::vector<int> sendCounts(nranks);
  std::vector<std::vector<int32_t>> tokensTo(nranks);
  std::vector<unsigned char> send, recv;
  std::vector<int32_t> recvLocal, recvRow;  // per received pick: local expert and row
  std::vector<float> recvWeight;
  std::vector<uint32_t> recvPickStart;
  std::vector<int> tokensFrom(nranks);
  auto dispatch = [&] {
    for (auto& list : tokensTo) list.clear();
    for (int t = 0; t < o.tokens; ++t)
      for (int j = 0; j < o.topk; ++j) {
        int dest = in.idx[static_cast<size_t>(t) * o.topk + j] / local;
        if (tokensTo[dest].empty() || tokensTo[dest].back() != t) tokensTo[dest].push_back(t);
      }
    send.clear();
    for (int d = 0; d < nranks; ++d) {
      sendCounts[d] = static_cast<int>(tokensTo[d].size());
      for (int32_t t : tokensTo[d]) {
        size_t at = send.size();
        send.resize(at + recordBytes, 0);
        int32_t picks = 0;
        for (int j = 0; j < o.topk; ++j) {
          int32_t e = in.idx[static_cast<size_t>(t) * o.topk + j];
          if (e / local != d) continue;
          std::memcpy(&send[at + 8 + 8 * picks], &e, 4);
          std::memcpy(&send[at + 12 + 8 * picks], &in.w[static_cast<size_t>(t) * o.topk + j], 4);
          ++picks;
        }
        std::memcpy(&send[at], &t, 4);
        std::memcpy(&send[at + 4], &picks, 4);
        std::memcpy(&send[at + metaBytes], in.x.data() + static_cast<size_t>(t) * o.hidden, rowBytes);
      }
    }
    MPI_Alltoall(sendCounts.data(), 1, MPI_INT, tokensFrom.data(), 1, MPI_INT, MPI_COMM_WORLD);
    alltoallv(send.data(), sendCounts, tokensFrom, recordBytes, &recv);
    std::vector<size_t> next(local, 0);
    recvLocal.clear();
    recvRow.clear();
    recvWeight.clear();
    recvPickStart.assign(1, 0);
    size_t records = 0;
    for (int n : tokensFrom) records += static_cast<size_t>(n);
    for (size_t r = 0; r < records; ++r) {
      const unsigned char* record = recv.data() + r * recordBytes;
      int32_t picks;
      std::memcpy(&picks, record + 4, 4);
      for (int k = 0; k < picks; ++k) {
        int32_t e;
        float w;
        std::memcpy(&e, record + 8 + 8 * k, 4);
        std::memcpy(&w, record + 12 + 8 * k, 4);
        int le = e - rank * local;
        size_t row = next[le]++;
        std::memcpy(recvX.data() + (static_cast<size_t>(le) * capacity + row) * o.hidden, record + metaBytes, rowBytes);
        recvLocal.push_back(le);
        recvRow.push_back(static_cast<int32_t>(row));
        recvWeight.push_back(w);
      }
      recvPickStart.push_back(static_cast<uint32_t>(recvLocal.size()));
    }
  };
  std::vector<float> acc(static_cast<size_t>(o.tokens) * o.hidden);
  auto combine = [&] {
    size_t records = recvPickStart.size() - 1;
    send.assign(records * rowBytes, 0);
    std::vector<float> partial(o.hidden);
    for (size_t r = 0; r < records; ++r) {
      std::fill(partial.begin(), partial.end(), 0.0f);
      for (uint32_t k = recvPickStart[r]; k < recvPickStart[r + 1]; ++k) {
        const uint16_t* row = recvX.data() + (static_cast<size_t>(recvLocal[k]) * capacity + recvRow[k]) * o.hidden;
        for (int h = 0; h < o.hidden; ++h) partial[h] += recvWeight[k] * fromBf16(row[h]);
      }
      uint16_t* dst = reinterpret_cast<uint16_t*>(send.data() + r * rowBytes);
      for (int h = 0; h < o.hidden; ++h) dst[h] = toBf16(partial[h]);
    }
    for (int p = 0; p < nranks; ++p) sendCounts[p] = static_cast<int>(tokensTo[p].size());
    alltoallv(send.data(), tokensFrom, sendCounts, rowBytes, &recv);
    std::fill(acc.begin(), acc.end(), 0.0f);
    const uint16_t* rows = reinterpret_cast<const uint16_t*>(recv.data());
    for (int p = 0; p < nranks; ++p)
      for (int32_t t : tokensTo[p]) {
        for (int h = 0; h < o.hidden; ++h) acc[static_cast<size_t>(t) * o.hidden + h] += fromBf16(rows[h]);
        rows += o.hidden;
      }
    for (size_t i = 0; i < acc.size(); ++i) out[i] = toBf16(acc[i]);
  };
  Run run;
  run.mode = "MPI per rank";
  timePairs(o, ranks, dispatch, combine, &run);
  run.dispatch.placedBytes = run.combine.placedBytes = static_cast<double>(recvLocal.size()) * rowBytes;
  run.wrong = wrongElements(o, in, out);
  return run;
}

// The dispatch as MoE layers commonly build it from MPI (Megatron's all-to-all token dispatcher): each token
// copied once per chosen expert into expert order (the permutation), MPI_Alltoall of the counts per expert, one
// MPI_Alltoallv of the rows, and the chunks regrouped from source-major to expert-major into recvX. The combine
// goes back the same way: chunks regrouped to source-major, MPI_Alltoallv, and each token's rows weighted and
// summed (the unpermutation).
Run runMpiPerExpert(const Options& o, Ranks& ranks, const Inputs& in) {
  const int nranks = ranks.nranks, local = o.experts / nranks;
  const size_t capacity = o.capacity > 0 ? static_cast<size_t>(o.capacity) : static_cast<size_t>(nranks) * o.tokens;
  const size_t rowBytes = static_cast<size_t>(o.hidden) * 2;
  std::vector<uint16_t> recvX(static_cast<size_t>(local) * capacity * o.hidden), out(in.x.size());
  std::vector<uint32_t> order;  // (token, choice) pairs in expert order
  std::vector<int> perExpert(o.experts), fromPeers(static_cast<size_t>(nranks) * local);
  std::vector<uint16_t> permuted, received;
  std::vector<int> rowsTo(nranks), rowsFrom(nranks);
  auto dispatch = [&] {
    order.clear();
    for (uint32_t i = 0; i < in.idx.size(); ++i) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return in.idx[a] < in.idx[b]; });
    permuted.resize(order.size() * o.hidden);
    std::fill(perExpert.begin(), perExpert.end(), 0);
    for (size_t r = 0; r < order.size(); ++r) {
      ++perExpert[in.idx[order[r]]];
      std::memcpy(permuted.data() + r * o.hidden, in.x.data() + static_cast<size_t>(order[r] / o.topk) * o.hidden,
                  rowBytes);
    }
    MPI_Alltoall(perExpert.data(), local, MPI_INT, fromPeers.data(), local, MPI_INT, MPI_COMM_WORLD);
    for (int p = 0; p < nranks; ++p) {
      rowsTo[p] = rowsFrom[p] = 0;
      for (int e = 0; e < local; ++e) {
        rowsTo[p] += perExpert[p * local + e];
        rowsFrom[p] += fromPeers[static_cast<size_t>(p) * local + e];
      }
    }
    alltoallv(permuted.data(), rowsTo, rowsFrom, rowBytes, &received);
    // Source-major chunks to expert-major rows.
    const uint16_t* chunk = received.data();
    std::vector<size_t> next(local, 0);
    for (int p = 0; p < nranks; ++p)
      for (int e = 0; e < local; ++e) {
        size_t rows = static_cast<size_t>(fromPeers[static_cast<size_t>(p) * local + e]);
        std::memcpy(recvX.data() + (static_cast<size_t>(e) * capacity + next[e]) * o.hidden, chunk, rows * rowBytes);
        next[e] += rows;
        chunk += rows * o.hidden;
      }
  };
  auto combine = [&] {
    // Expert-major rows back to source-major chunks (identity experts: recvX is the experts' output).
    std::vector<size_t> next(local, 0);
    uint16_t* chunk = received.data();
    for (int p = 0; p < nranks; ++p)
      for (int e = 0; e < local; ++e) {
        size_t rows = static_cast<size_t>(fromPeers[static_cast<size_t>(p) * local + e]);
        std::memcpy(chunk, recvX.data() + (static_cast<size_t>(e) * capacity + next[e]) * o.hidden, rows * rowBytes);
        next[e] += rows;
        chunk += rows * o.hidden;
      }
    std::vector<uint16_t> send(received.begin(), received.end());
    alltoallv(send.data(), rowsFrom, rowsTo, rowBytes, &permuted);
    std::vector<float> acc(static_cast<size_t>(o.tokens) * o.hidden, 0.0f);
    for (size_t r = 0; r < order.size(); ++r) {
      float w = in.w[order[r]];
      float* dst = acc.data() + static_cast<size_t>(order[r] / o.topk) * o.hidden;
      const uint16_t* row = permuted.data() + r * o.hidden;
      for (int h = 0; h < o.hidden; ++h) dst[h] += w * fromBf16(row[h]);
    }
    for (size_t i = 0; i < acc.size(); ++i) out[i] = toBf16(acc[i]);
  };
  Run run;
  run.mode = "MPI per expert";
  timePairs(o, ranks, dispatch, combine, &run);
  long rows = 0;
  for (int r : rowsFrom) rows += r;
  run.dispatch.placedBytes = run.combine.placedBytes = static_cast<double>(rows) * rowBytes;
  run.wrong = wrongElements(o, in, out);
  return run;
}
#endif

// The memory copy rate with every rank copying `bytes` at once (the best of five), in bytes per second per rank:
// memcpy_ceiling's measure (buffers far larger than the caches, every copier at once), in the same run.
double copyRate(Ranks& ranks, size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    double us = timed(ranks, [&] { std::memcpy(b.data(), a.data(), bytes); });
    best = std::min(best, us);
  }
  return bytes / (best * 1e-6);
}

const char kUsage[] =
    "usage: ep_perf [--tokens N] [--hidden H] [--topk K] [--experts E] [--capacity C] [--modes ll,normal,mpi]\n"
    "               [--copy-mib M] [-n iters] [-w warmup_iters] [-h]\n"
    "  --tokens N      tokens per rank (128)\n"
    "  --hidden H      hidden size, bfloat16 elements per token (7168)\n"
    "  --topk K        experts each token goes to, distinct (8); at most --experts\n"
    "  --experts E     experts in all, a multiple of the rank count (256, or the largest multiple up to it)\n"
    "  --capacity C    rows each expert takes (0: every token of every rank)\n"
    "  --modes LIST    a comma list of ll, normal and mpi (mpi under mpirun only)\n"
    "  --copy-mib M    MiB each rank copies for the copy ceiling (256)\n"
    "  -n, --iters N   timed iterations (20); -w, --warmup_iters N: warm-up iterations (5), as nccl-tests\n";

// A command line ep_perf refuses: said by rank 0 (every rank reads the same one), then exit status 2.
[[noreturn]] void usageError(const std::string& message) {
  perf::exitOnce("ep_perf", message + " (see --help)");
}

int intValue(const char* text, const char* flag, int min, int max) {
  try {
    return perf::parseIntArg(text, flag, min, max);
  } catch (const perf::UsageError& error) {
    usageError(error.what());
  }
}

Options parse(int argc, char** argv) {
  Options o;
  bool expertsGiven = false;
  enum { kTokens = 1000, kHidden, kTopk, kExperts, kCapacity, kModes, kCopyMib };
  static const option longOptions[] = {{"tokens", required_argument, nullptr, kTokens},
                                       {"hidden", required_argument, nullptr, kHidden},
                                       {"topk", required_argument, nullptr, kTopk},
                                       {"experts", required_argument, nullptr, kExperts},
                                       {"capacity", required_argument, nullptr, kCapacity},
                                       {"modes", required_argument, nullptr, kModes},
                                       {"copy-mib", required_argument, nullptr, kCopyMib},
                                       {"iters", required_argument, nullptr, 'n'},
                                       {"warmup_iters", required_argument, nullptr, 'w'},
                                       {"help", no_argument, nullptr, 'h'},
                                       {nullptr, 0, nullptr, 0}};
  // Letters that nccl-tests gives other meanings, which ep_perf once used for its shape: named, not guessed.
  const std::pair<char, const char*> renamed[] = {{'t', "--tokens"}, {'H', "--hidden"},  {'k', "--topk"},
                                                  {'e', "--experts"}, {'c', "--capacity"}, {'m', "--modes"},
                                                  {'C', "--copy-mib"}};
  opterr = 0;
  for (int c; (c = getopt_long(argc, argv, ":hn:w:t:H:k:e:c:m:C:", longOptions, nullptr)) != -1;) {
    constexpr int kBig = 1 << 30;
    switch (c) {
      case kTokens: o.tokens = intValue(optarg, "--tokens", 1, 1 << 24); break;
      case kHidden: o.hidden = intValue(optarg, "--hidden", 1, 1 << 20); break;
      case kTopk: o.topk = intValue(optarg, "--topk", 1, 1024); break;
      case kExperts: o.experts = intValue(optarg, "--experts", 1, 1 << 20), expertsGiven = true; break;
      case kCapacity: o.capacity = intValue(optarg, "--capacity", 0, kBig); break;
      case kCopyMib: o.ceilingBytes = static_cast<size_t>(intValue(optarg, "--copy-mib", 1, 1 << 16)) << 20; break;
      case 'n': o.iterations = intValue(optarg, "-n", 1, kBig); break;
      case 'w': o.warmup = intValue(optarg, "-w", 0, kBig); break;
      case kModes: {
        o.modes = optarg;
        std::string word;
        for (size_t i = 0; i <= o.modes.size(); ++i) {
          if (i < o.modes.size() && o.modes[i] != ',') {
            word += o.modes[i];
            continue;
          }
          if (word != "ll" && word != "normal" && word != "mpi")
            usageError("--modes " + o.modes + ": \"" + word + "\" is none of ll, normal and mpi");
          word.clear();
        }
        break;
      }
      case 'h':
        if (perf::launcherRank() == 0) std::fputs(kUsage, stdout);
        std::exit(0);
      case ':':
        usageError(std::string("option ") + (optopt != 0 ? std::string("-") + static_cast<char>(optopt) : argv[optind - 1]) +
                   " needs a value");
      case '?':
        usageError(std::string("unknown option ") +
                   (optopt != 0 ? std::string("-") + static_cast<char>(optopt) : std::string(argv[optind - 1])));
      default:
        for (const auto& [letter, name] : renamed)
          if (c == letter)
            usageError(std::string("-") + letter + " is nccl-tests' flag for something else; ep_perf's is " + name);
        usageError("unknown option");
    }
  }
  if (optind < argc) usageError(std::string("unexpected argument ") + argv[optind]);
  if (expertsGiven && o.topk > o.experts)
    usageError("--topk " + std::to_string(o.topk) + " is more than the " + std::to_string(o.experts) +
               " experts: each token goes to distinct experts");
  if (!expertsGiven) o.experts = -o.experts;  // 256 scaled to the rank count once it is known
  return o;
}

void print(const Options& o, const Run& run, const PhaseTimes& phase, const char* name, double selectionsBytes,
           double rate) {
  std::vector<double> us = phase.us;
  double avg = 0;
  for (double v : us) avg += v;
  avg /= static_cast<double>(us.size());
  double placedRate = phase.placedBytes / (avg * 1e-6);
  std::printf("  %-14s %-9s %9.1f %9.1f %9.1f %12.2f %10.2f %11.2f %9.0f%% %7ld\n", run.mode.c_str(), name, avg,
              *std::min_element(us.begin(), us.end()), *std::max_element(us.begin(), us.end()),
              selectionsBytes / (avg * 1e-6) / 1e9, phase.placedBytes / 1e6, placedRate / 1e9,
              100.0 * placedRate / rate, name[0] == 'c' ? run.wrong : 0L);
  (void)o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  loomComm_t comm = nullptr;
  bool mpi = false;
#if LOOM_EP_PERF_MPI
  mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
  if (mpi) {
    MPI_Init(&argc, &argv);
    int rank = 0, nranks = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    loomUniqueId id;
    if (rank == 0) check(loomGetUniqueId(&id), "loomGetUniqueId", nullptr);
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    check(loomCommInitRank(&comm, nranks, id, rank), "loomCommInitRank", nullptr);
  }
#endif
  if (!mpi) check(loomCommInitFromEnv(&comm), "loomCommInitFromEnv", nullptr);
  Ranks ranks{comm, 0, 0};
  loomCommUserRank(comm, &ranks.rank);
  loomCommCount(comm, &ranks.nranks);
  if (o.experts < 0) o.experts = std::max(ranks.nranks, -o.experts / ranks.nranks * ranks.nranks);
  // Known only once the ranks are counted; every rank finds the same, and rank 0 says it.
  if (o.experts % ranks.nranks != 0)
    usageError("--experts " + std::to_string(o.experts) + " does not split over " + std::to_string(ranks.nranks) +
               " ranks: give a multiple of the rank count");
  if (o.topk > o.experts)
    usageError("--topk " + std::to_string(o.topk) + " is more than the " + std::to_string(o.experts) +
               " experts: each token goes to distinct experts");
  Inputs in = makeInputs(o, ranks.rank);
  std::vector<Run> runs;
  if (o.modes.find("ll") != std::string::npos) runs.push_back(runLoom(o, ranks, in, loomEpLowLatency));
  if (o.modes.find("normal") != std::string::npos) runs.push_back(runLoom(o, ranks, in, loomEpNormal));
  std::string mpiNote = "not run: launch with mpirun to set MPI beside loom";
#if LOOM_EP_PERF_MPI
  if (mpi && o.modes.find("mpi") != std::string::npos) {
    runs.push_back(runMpiPerExpert(o, ranks, in));
    runs.push_back(runMpi(o, ranks, in));
    mpiNote.clear();
  }
#else
  mpiNote = "not built (meson found no MPI)";
#endif
  double rate = copyRate(ranks, o.ceilingBytes);
  rate = ranks.sum(rate) / ranks.nranks;
  double selectionBytes = static_cast<double>(in.selections) * o.hidden * 2;
  selectionBytes = ranks.sum(selectionBytes) / ranks.nranks;
  for (Run& run : runs) {
    run.dispatch.placedBytes = ranks.sum(run.dispatch.placedBytes) / ranks.nranks;
    run.combine.placedBytes = ranks.sum(run.combine.placedBytes) / ranks.nranks;
    run.wrong = static_cast<long>(ranks.sum(static_cast<double>(run.wrong)));
  }
  if (ranks.rank == 0) {
    int version = 0;
    loomGetVersion(&version);
    std::printf(
        "# ep_perf: loom %d, %d ranks (%s), %d tokens per rank, hidden %d, top-%d, %d experts (%d per rank), "
        "bf16, capacity %d per expert\n",
        version, ranks.nranks, mpi ? "mpirun" : "loomrun", o.tokens, o.hidden, o.topk, o.experts,
        o.experts / ranks.nranks, o.capacity > 0 ? o.capacity : ranks.nranks * o.tokens);
    std::printf("# %d warm-up and %d timed iterations; times are the slowest rank's, in us\n", o.warmup, o.iterations);
    std::printf("# memory copy rate, every rank copying %.0f MB at once: %.2f GB/s per rank (the ceiling: of_copy)\n",
                o.ceilingBytes / 1e6, rate / 1e9);
    if (!mpiNote.empty()) std::printf("# MPI Alltoallv: %s\n", mpiNote.c_str());
    for (const Run& run : runs)
      if (run.bufferBytes > 0)
        std::printf("# %s receive windows: %.1f MB per rank\n", run.mode.c_str(), run.bufferBytes / 1e6);
    std::printf("#\n#  %-14s %-9s %9s %9s %9s %12s %10s %11s %10s %7s\n", "mode", "phase", "avg_us", "min_us", "max_us",
                "DeepEP_GB/s", "placed_MB", "placed_GB/s", "of_copy", "#wrong");
    for (const Run& run : runs) {
      print(o, run, run.dispatch, "dispatch", selectionBytes, rate);
      print(o, run, run.combine, "combine", selectionBytes, rate);
    }
    auto average = [](const std::vector<double>& us) {
      double sum = 0;
      for (double v : us) sum += v;
      return sum / static_cast<double>(us.size());
    };
    // DeepEP's README form: latency and the bandwidth of the bytes it counts (per selection), per mode.
    std::printf("#\n# | mode | Dispatch #EP | Latency | Bandwidth | Combine #EP | Latency | Bandwidth |\n");
    std::printf("# |---|---|---|---|---|---|---|\n");
    for (const Run& run : runs) {
      double d = average(run.dispatch.us), c = average(run.combine.us);
      std::printf("# | %s | %d | %.0f us | %.2f GB/s | %d | %.0f us | %.2f GB/s |\n", run.mode.c_str(), ranks.nranks, d,
                  selectionBytes / (d * 1e-6) / 1e9, ranks.nranks, c, selectionBytes / (c * 1e-6) / 1e9);
    }
    const Run* ll = nullptr;
    for (const Run& run : runs)
      if (run.mode == "low-latency") ll = &run;
    for (const Run& peer : runs)
      if (ll != nullptr && peer.mode.rfind("MPI", 0) == 0)
        std::printf("# low-latency vs %s: dispatch %.2fx as fast, combine %.2fx\n", peer.mode.c_str(),
                    average(peer.dispatch.us) / average(ll->dispatch.us),
                    average(peer.combine.us) / average(ll->combine.us));
  }
  long wrong = 0;
  for (const Run& run : runs) wrong += run.wrong;
  loomCommDestroy(comm);
#if LOOM_EP_PERF_MPI
  if (mpi) MPI_Finalize();
#endif
  return wrong == 0 ? 0 : 1;
}
