// ProcessGroupLoom's point-to-point messages (process_group.h): a link per peer and direction, joined on first use, and
// the receives the reaper fails past their deadlines.
#include "plugins/torch/process_group.h"

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "plugins/torch/store.h"

namespace loom_torch {

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::send(std::vector<at::Tensor>& tensors, int dstRank, int) {
  checkSingle(tensors, "send");
  checkPeer(dstRank, "send");
  Staging stage;
  at::Tensor t = stage.in(tensors[0]);
  Link& link = linkTo(dstRank, true);
  return queue(*link.worker, c10d::OpType::SEND, tensors, [this, t, &link] {
    link.worker->rethrowFailure();
    const uint64_t bytes = bytesOf(t);  // the message's header: its size, by which the receiver matches it
    call(loomSend(&bytes, sizeof(bytes), loomUint8, link.peer, link.comm, nullptr), link.comm, "loomSend");
    call(loomSend(t.data_ptr(), bytes, loomUint8, link.peer, link.comm, nullptr), link.comm, "loomSend");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::recv(std::vector<at::Tensor>& tensors, int srcRank, int) {
  checkSingle(tensors, "recv");
  checkPeer(srcRank, "recv");
  auto posted = post(tensors[0], srcRank, c10d::OpType::RECV);
  Link& link = linkTo(srcRank, false);
  link.worker->queue([this, &link, posted] { take(link, srcOf(link), posted); }, c10::intrusive_ptr<LoomWork>());
  return posted->work;
}

// The next message of any peer: every peer's receiving link listens for a header while the receive is open,
// and the first header claims it. A link whose header came too late keeps it for its next receive.
c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::recvAnysource(std::vector<at::Tensor>& tensors, int) {
  checkSingle(tensors, "recvAnysource");
  if (size_ < 2) fail("recvAnysource: a group of one rank has no one to receive from");
  auto posted = post(tensors[0], -1, c10d::OpType::RECVANYSOURCE);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Link& link = linkTo(peer, false);
    link.worker->queue([this, &link, peer, posted] { take(link, peer, posted); }, c10::intrusive_ptr<LoomWork>());
  }
  return posted->work;
}

// A receive into `tensor` from `source` (-1: any), its Work, and its place among the receives reap watches.
std::shared_ptr<ProcessGroupLoom::Posted> ProcessGroupLoom::post(const at::Tensor& tensor, int source,
                                                                 c10d::OpType type) {
  auto posted = std::make_shared<Posted>();
  posted->source = source;
  posted->tensor = posted->staging.out(tensor);
  posted->work = c10::make_intrusive<LoomWork>(rank_, type, std::vector<at::Tensor>{tensor});
  posted->deadline = std::chrono::steady_clock::now() + timeout_;
  std::lock_guard<std::mutex> lock(postedMutex_);
  if (closed_.load()) fail("the group was shut down (shutdown()): no more calls run on it");
  posted_.push_back(posted);
  if (!reaper_.joinable()) reaper_ = std::thread([this] { reap(); });
  return posted;
}

void ProcessGroupLoom::finish(Posted& posted, std::exception_ptr error) { posted.work->complete(error); }

// On `link`'s worker (messages from `peer`): receives the next message's header unless the link holds one, and
// delivers that message into `posted` if no one has claimed it; else the header waits for the link's next
// receive.
void ProcessGroupLoom::take(Link& link, int peer, const std::shared_ptr<Posted>& posted) {
  if (posted->claimed.load()) return;  // taken from another link, or past its deadline: nothing to listen for
  try {
    link.worker->rethrowFailure();
    if (aborted_.load()) fail("the group was aborted (abort()): no more calls run on it");
    if (!link.hasHeader) {
      call(loomRecv(&link.header, sizeof(link.header), loomUint8, link.peer, link.comm, nullptr), link.comm,
           "loomRecv");
      link.hasHeader = true;
    }
  } catch (...) {
    // A link that cannot receive fails a receive from its peer; a receive from any peer only once every link has.
    if (posted->source >= 0 || posted->failedLinks.fetch_add(1) + 2 == size_) {
      if (!posted->claimed.exchange(true)) finish(*posted, std::current_exception());
    }
    return;
  }
  if (posted->claimed.exchange(true)) return;  // the header stays for the link's next receive
  posted->receiving.store(&link);
  link.hasHeader = false;
  const uint64_t bytes = link.header, wanted = bytesOf(posted->tensor);
  std::exception_ptr error;
  try {
    if (bytes != wanted) {  // the message is taken off the link all the same, then the receive fails
      std::vector<uint8_t> sink(bytes);
      call(loomRecv(sink.data(), bytes, loomUint8, link.peer, link.comm, nullptr), link.comm, "loomRecv");
      fail("recv: rank " + std::to_string(peer) + " sent " + std::to_string(bytes) + " bytes; this receive takes " +
           std::to_string(wanted) + " (" + std::to_string(posted->tensor.numel()) + " of " +
           c10::toString(posted->tensor.scalar_type()) + ")");
    }
    call(loomRecv(posted->tensor.data_ptr(), bytes, loomUint8, link.peer, link.comm, nullptr), link.comm,
         "loomRecv");
    posted->staging.finish();
    posted->work->setSource(peer);
  } catch (...) {
    error = std::current_exception();
    if (link.revoked.load())
      error = std::make_exception_ptr(std::runtime_error(
          "loom: recv from rank " + std::to_string(peer) + ": its message did not arrive within the group's timeout (" +
          std::to_string(timeout_.count()) + " ms)"));
  }
  posted->receiving.store(nullptr);
  finish(*posted, error);
}

// The receives' deadlines: one not claimed by then fails; one whose message is still arriving then ends its
// link (revoked: the peer's later messages fail too, as a timed-out loom call's would). Works are completed
// outside the lock: their futures' callbacks may post receives.
void ProcessGroupLoom::reap() {
  std::unique_lock<std::mutex> lock(postedMutex_);
  for (;;) {
    const bool closing = closed_.load();
    std::vector<std::pair<std::shared_ptr<Posted>, std::string>> failing;
    const auto now = std::chrono::steady_clock::now();
    for (auto it = posted_.begin(); it != posted_.end();) {
      Posted& posted = **it;
      if (posted.work->isCompleted()) {
        it = posted_.erase(it);
        continue;
      }
      if (closing || now > posted.deadline) {
        if (!posted.claimed.exchange(true)) {
          const std::string from = posted.source < 0 ? "any rank" : "rank " + std::to_string(posted.source);
          failing.emplace_back(*it, closing ? "loom: recv from " + from + ": the group was shut down or aborted"
                                            : "loom: recv from " + from + ": no message within the group's timeout (" +
                                                  std::to_string(timeout_.count()) + " ms)");
          it = posted_.erase(it);
          continue;
        }
        if (Link* link = posted.receiving.load(); link != nullptr && !link->revoked.exchange(true))
          loomCommRevoke(link->comm);
      }
      ++it;
    }
    lock.unlock();
    for (auto& [posted, message] : failing) finish(*posted, std::make_exception_ptr(std::runtime_error(message)));
    lock.lock();
    if (closing) return;
    reapWake_.wait_for(lock, std::chrono::milliseconds(20));
  }
}

void ProcessGroupLoom::checkPeer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_ || peer == rank_)
    fail(std::string(what) + ": rank " + std::to_string(peer) + " is not another rank of this group of " +
         std::to_string(size_));
}

// The link for messages to (`sending`) or from `peer`, joined on first use by its worker, ahead of its first
// message (so that two ranks each sending first to the other do not wait for each other's join): the sender is
// rank 0 of its communicator, and draws its id into the store under a key naming both ranks and the direction.
ProcessGroupLoom::Link& ProcessGroupLoom::linkTo(int peer, bool sending) {
  const int from = sending ? rank_ : peer, to = sending ? peer : rank_;
  const std::pair<int, int> key{from, to};
  std::lock_guard<std::mutex> lock(linksMutex_);
  if (closed_.load()) fail("the group was shut down (shutdown()): no more calls run on it");
  auto found = links_.find(key);
  if (found != links_.end()) return *found->second;
  auto link = std::make_unique<Link>();
  link->peer = sending ? 1 : 0;
  link->from = from;
  link->worker = std::make_unique<Worker>();
  Link& made = *link;
  const std::string storeKey = "loom/p2p/" + std::to_string(from) + "-" + std::to_string(to);
  // The sender publishes the id at once, from the caller's thread; the receiver's worker waits for it.
  loomUniqueId id{};
  if (sending) id = publishId(*store_, storeKey);
  made.worker->queue(
      [this, &made, storeKey, sending, id] {
        // A receiving link waits for its sender without a deadline of its own (the peer may never send; each
        // receive has the group's), until the group closes.
        loomComm_t comm = sending ? join(id, 0, 2, timeout_, "torch p2p")
                                  : joinListening(readId(*store_, storeKey, std::chrono::milliseconds(0), &stopping_),
                                                  timeout_, stopping_);
        std::lock_guard<std::mutex> lock(linksMutex_);  // revokeAll and close read it
        made.comm = comm;
        if (aborted_.load() || (!sending && stopping_.load() && !made.revoked.exchange(true))) loomCommRevoke(comm);
      },
      c10::intrusive_ptr<LoomWork>());
  return *links_.emplace(key, std::move(link)).first->second;
}

}  // namespace loom_torch
