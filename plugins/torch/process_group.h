// ProcessGroupLoom, the process group of the backend "loom" (loom_torch.cc describes it): its collectives in
// collectives.cc, its point-to-point messages in p2p.cc, its set-up, queues and shutdown in process_group.cc.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "plugins/torch/helpers.h"
#include "plugins/torch/work.h"

namespace loom_torch {

class ProcessGroupLoom : public Base {
 public:
  ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout);
  ~ProcessGroupLoom() override { close(); }

  const std::string getBackendName() const override { return "loom"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions&) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override;
#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions&) override;
#endif
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
#endif
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions&) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override;

#if TORCH_VERSION_MAJOR >= 2
  void abort() override;
  // Runs what was queued, then frees the communicators; later calls fail.
  void shutdown() override { close(); }

  c10::intrusive_ptr<Options> getBackendOptions() override { return c10::make_intrusive<Options>("loom", timeout_); }

  // A subgroup of this one's ranks: a communicator of its own, joined through the store torch hands it.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<Base> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                 const c10::intrusive_ptr<Options>& opts) override;
#endif

 private:
  // What the calls of one loom group need after they are queued: tensors that must live until its end (scaled
  // copies, gathered buffers), and what to do with the results once it has ended (folds, copies out).
  struct Keep {
    const at::Tensor& hold(at::Tensor tensor) {
      held.push_back(std::move(tensor));
      return held.back();
    }
    std::deque<at::Tensor> held;  // a deque: hold's references stay valid
    std::vector<std::function<void()>> after;
  };

  // One direction of messages between this rank and a peer: a two-rank communicator and the thread that runs them.
  // A receiving link also holds the header of a message it has received but not yet delivered.
  struct Link {
    loomComm_t comm = nullptr;
    int peer = 0;  // the other rank's rank in comm
    int from = 0;  // the sending rank, in the group
    std::unique_ptr<Worker> worker;
    bool hasHeader = false;  // on the worker's thread only
    uint64_t header = 0;
    std::atomic<bool> revoked{false};  // by reap, a receive past its deadline in the middle of its message
  };

  // A receive not yet completed: from `source` (-1: any peer), into `tensor`, by `deadline`. The first of a link
  // (its message arrived) and reap (its deadline passed) to claim it completes it.
  struct Posted {
    int source = -1;
    Staging staging;
    at::Tensor tensor;  // the caller's, or its host copy (staging)
    c10::intrusive_ptr<LoomWork> work;
    std::chrono::steady_clock::time_point deadline;
    std::atomic<bool> claimed{false};
    std::atomic<Link*> receiving{nullptr};  // the link moving its message, once claimed by one
    std::atomic<int> failedLinks{0};
  };

  // The collectives' loom calls and checks (collectives.cc).
#if TORCH_VERSION_MAJOR >= 2
  void checkPairs(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs, const char* what);
  // The coalesced forms over (input, output) pairs: `each(in, out, i, keep)` queues pair i's calls, all of them
  // in one loom group.
  using PairFn = std::function<void(const at::Tensor&, const at::Tensor&, size_t, Keep&)>;
  c10::intrusive_ptr<c10d::Work> pairwise(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const char* what, PairFn each);
#endif
  void grouped(const std::vector<std::function<void(Keep&)>>& calls, const char* what);
  void allReduce(const at::Tensor& t, const Reduction& r, Keep& keep);
  void reduceScatter(const at::Tensor& in, const at::Tensor& out, const Reduction& r, Keep& keep);
  void allGatherList(const at::Tensor& in, const std::vector<at::Tensor>& out, Keep& keep);
  void allGatherInto(const at::Tensor& in, const at::Tensor& out);
  void allToAll(const at::Tensor& in, const std::vector<size_t>& sendCounts, const at::Tensor& out,
                const std::vector<size_t>& receiveCounts);
  int checkRoot(int64_t root, const char* what) const;
  void checkGatherList(const std::vector<at::Tensor>& list, const at::Tensor& one, const char* what) const;
  void checkGatherInto(const at::Tensor& whole, const at::Tensor& part, const char* what) const;

  // Point-to-point messages (p2p.cc).
  int srcOf(const Link& link) const { return link.from; }
  std::shared_ptr<Posted> post(const at::Tensor& tensor, int source, c10d::OpType type);
  static void finish(Posted& posted, std::exception_ptr error);
  void take(Link& link, int peer, const std::shared_ptr<Posted>& posted);
  void reap();
  void checkPeer(int peer, const char* what) const;
  Link& linkTo(int peer, bool sending);

  // The group's loom calls, queues and shutdown (process_group.cc).
  void call(loomResult_t result, loomComm_t comm, const char* what) const;
  void revokeAll();
  void close();
  c10::intrusive_ptr<c10d::Work> queue(Worker& worker, c10d::OpType type, std::vector<at::Tensor> outputs,
                                       std::function<void()> run, Staging staging = {});
  c10::intrusive_ptr<c10d::Work> collective(c10d::OpType type, std::vector<at::Tensor> outputs,
                                            std::function<void()> run, Staging staging = {});

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> aborted_{false}, closed_{false};
  std::atomic<bool> stopping_{false};  // closed or aborted: what waits without a deadline gives up
  std::mutex closeMutex_;
  std::mutex postedMutex_;
  std::condition_variable reapWake_;
  std::vector<std::shared_ptr<Posted>> posted_;
  std::thread reaper_;
  loomComm_t comm_ = nullptr;
  std::unique_ptr<Worker> collectives_ = std::make_unique<Worker>();
  std::mutex linksMutex_;
  std::map<std::pair<int, int>, std::unique_ptr<Link>> links_;
};

}  // namespace loom_torch
