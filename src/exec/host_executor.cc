// Host executor (see host_executor.h): lanes as non-blocking state machines over FIFO slots.
#include "src/exec/host_executor.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "src/base/check.h"
#include "src/base/dtype.h"
#include "src/base/integrity.h"
#include "src/base/wait.h"
#include "src/exec/copy.h"
#include "src/exec/lane_walker.h"
#include "src/exec/reduce.h"

namespace loom {
namespace {

// This process's id, read once (getpid is a system call): direct messages carry it on every slice.
pid_t thisProcess() {
  static const pid_t pid = getpid();
  return pid;
}

// Reads a direct message's payload: a memcpy within this process, else process_vm_readv (CMA), which copies
// straight from the peer's memory into ours.
loomResult_t readDirect(const DirectDescriptor& from, void* to, const char* what, int peer) {
  if (from.pid == thisProcess()) {
    std::memcpy(to, reinterpret_cast<const void*>(from.address), from.bytes);
    return loomSuccess;
  }
  size_t done = 0;
  while (done < from.bytes) {
    iovec local{static_cast<std::byte*>(to) + done, from.bytes - done};
    iovec remote{reinterpret_cast<void*>(from.address + done), from.bytes - done};
    ssize_t got = process_vm_readv(from.pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      return LOOM_FAIL(loomRemoteError, SHM, "%s: cannot read %zu bytes from rank %d (pid %d): %m", what,
                       static_cast<size_t>(from.bytes - done), peer, from.pid);
    }
    done += static_cast<size_t>(got);
  }
  return loomSuccess;
}

}  // namespace

// The ends of a lane's channel on the host, as LaneWalker reaches them: the FifoReceiver and FifoSender of each
// peer, which move messages through shared memory or a transport's proxy. Under LOOM_CHECKSUM (`checksum`) a
// message is its payload and then its checksum: the walker sees the payload's size, TaskRun writes and checks the
// checksum (sent, checkSum, moveSummed).
struct HostEnds {
  using In = FifoReceiver;
  using Out = FifoSender;
  Links* links;
  int channel;
  bool checksum;

  FifoReceiver* receiver(int peer) const { return links->receiver(peer, channel); }
  FifoSender* sender(int peer) const { return links->sender(peer, channel); }
  LaneStatus receive(FifoReceiver* in, Protocol protocol, size_t bytes, Arrival* arrival) const {
    (void)bytes;  // the receiver reads the size from the message itself
    arrival->data = in->poll(protocol, &arrival->bytes, &arrival->direct);
    if (arrival->data == nullptr) return LaneStatus::kWaiting;
    // Too short to hold a checksum: a size no slice has, which the walker refuses.
    if (checksum) arrival->bytes = arrival->bytes >= kChecksumBytes ? arrival->bytes - kChecksumBytes : SIZE_MAX;
    return LaneStatus::kRan;
  }
  LaneStatus reserve(FifoSender* out, Protocol protocol, void** slot) const {
    *slot = out->reserve(protocol);
    return *slot != nullptr ? LaneStatus::kRan : LaneStatus::kWaiting;
  }
  void post(FifoSender* out, Protocol protocol, size_t bytes, bool direct) const {
    out->post(protocol, bytes + (checksum ? kChecksumBytes : 0), direct);
  }
  void release(FifoReceiver* in) const { in->release(); }
};

using HostWalker = LaneWalker<Lane, HostEnds>;

struct LaneRun {
  HostEnds ends;
  HostWalker walker;
  bool done() const { return walker.done(); }
  const Step& step() const { return walker.step(); }
};

// Under LOOM_CHECKSUM, the blocks a Simple slice's data moves in, each summed while it is in the L1 cache
// (TaskRun::moveSummed): small enough that a block's operands and result stay there, large enough that the CRC's
// folding and each copy's or reduction's start are a small part of it.
constexpr size_t kSummedBlockBytes = 8192;

// One task in progress. A queue keeps its TaskRun from task to task and from run to run, so that its containers
// keep their capacity: a warm small call allocates nothing here.
class TaskRun {
 public:
  bool active() const { return task_ != nullptr; }

  void start(ExecTask& task) {
    task_ = &task;
    elementBytes_ = dtypeSize(task.datatype);
    // Slices in whole elements, worked out once per task: the divisions cost more than a small step's copy.
    const SliceRule rule = SliceRule::of(elementBytes_, task.llThresholdBytes, task.llSliceBytes,
                                         task.simpleSliceBytes, task.forcedProtocol);
    reduce_ = reduceFunction(task.datatype, task.op);
    // Partial results in scratch wider than the type (RankPlan::wideScratch: fp32 for fp16 and bf16).
    wide_ = task.plan->wideScratch && dtypeHasWiderPartials(task.datatype);
    scratchBytes_ = wide_ ? dtypePartialSize(task.datatype) : elementBytes_;
    wideReduce_ = wide_ ? wideReduceFunction(task.datatype, task.op) : nullptr;
    // Sent messages need a look only for the checksum or the fault hook (read once per task: off the small path).
    marksSent_ = task.checksum || corruptionArmed();
    resends_ = task.checksum && task.checksumResend;
    lanes_.clear();
    awaited_.clear();
    for (const Lane& lane : task.plan->lanes) {
      lanes_.push_back({HostEnds{task.links, lane.channel, task.checksum}, {}});
      lanes_.back().walker.start(lane, rule);
    }
  }

  void stop() { task_ = nullptr; }

  // Done when every lane is, and every peer it awaits has taken the messages this task sent it.
  bool done() const {
    for (const LaneRun& lane : lanes_)
      if (!lane.done()) return false;
    for (const auto& [sender, peer] : awaited_)
      if (!sender->drained()) return false;
    return true;
  }

  // Runs every slice that can run now. Returns an error, or success with *progress set when something moved.
  // A lane goes at most one round per pass, so that lanes interleave: a lane that never waits (a local copy)
  // would otherwise run to its end while the peers wait for this rank to take their messages.
  loomResult_t advance(bool* progress) {
    if (resends_)
      for (const auto& [sender, peer] : awaited_) *progress |= rewriteAsked(sender);
    for (LaneRun& lane : lanes_) {
      for (size_t round = lane.walker.round(); !lane.done() && lane.walker.round() == round;) {
        bool ran = false;
        LOOM_CHECK(runSlice(lane, &ran));
        if (!ran) break;
        *progress = true;
      }
    }
    return loomSuccess;
  }

  void finish() {
    const Region& reduced = task_->plan->reducedOutput;
    if (task_->op == loomAvg && reduced.count > 0)
      divideInPlace(pointer(reduced, 0), reduced.count, task_->datatype, task_->nranks);
  }

  // Marks every connection this task uses as aborted, so that peers stop waiting on it, with the failure its
  // links have noted (this rank's own error when none is).
  void abortLinks() {
    const uint64_t origin =
        task_->links->noteFailure(packOrigin({task_->rank, FailureCause::kError, 0}));
    for (const LaneRun& lane : lanes_) {
      for (const Step& step : lane.walker.lane().steps) {
        if (actionReceives(step.action))
          if (FifoReceiver* in = lane.ends.receiver(step.recvPeer)) in->abort(origin);
        if (actionSends(step.action))
          if (FifoSender* out = lane.ends.sender(step.sendPeer)) out->abort(origin);
      }
    }
  }

  // Why a connection of a lane that is waiting was marked aborted (an AbortCode; 0: none was), whose, and the
  // failure the mark carried (*origin; 0: not known). A receiving FIFO counts only once it is empty: what the
  // peer posted before it closed its end is still good (a lane may be waiting on its send while the message it
  // received sits there).
  uint32_t peerAborted(int* peer, uint64_t* origin) {
    for (const LaneRun& lane : lanes_) {
      if (lane.done()) continue;
      const Step& step = lane.step();
      if (actionReceives(step.action)) {
        const FifoReceiver* in = lane.ends.receiver(step.recvPeer);
        if (uint32_t code = in->abortCode(); code != 0 && in->empty()) {
          *peer = step.recvPeer;
          *origin = in->abortOrigin();
          return code;
        }
      }
      if (actionSends(step.action)) {
        const FifoSender* out = lane.ends.sender(step.sendPeer);
        if (uint32_t code = out->abortCode()) {
          *peer = step.sendPeer;
          *origin = out->abortOrigin();
          return code;
        }
      }
    }
    for (const auto& [sender, rank] : awaited_) {
      if (!sender->drained() && sender->aborted()) {
        *peer = rank;
        *origin = sender->abortOrigin();
        return sender->abortCode();
      }
    }
    return 0;
  }

  const ExecTask& task() const { return *task_; }

  // Whether a lane still to finish waits on `peer` now, or `peer` has yet to read a direct message of this task.
  // Later steps need no look: a peer this rank waits on that needs `peer` finds it gone and aborts its links.
  bool waitsOn(int peer) const {
    for (const LaneRun& lane : lanes_) {
      if (lane.done()) continue;
      const Step& step = lane.step();
      if ((actionReceives(step.action) && step.recvPeer == peer) || (actionSends(step.action) && step.sendPeer == peer))
        return true;
    }
    for (const auto& [sender, rank] : awaited_)
      if (rank == peer && !sender->drained()) return true;
    return false;
  }

  // What the first unfinished lane waits for, for error messages: "a message from rank 3 on channel 0".
  std::string waitingFor() const {
    for (const LaneRun& lane : lanes_) {
      if (lane.done()) continue;
      const Step& step = lane.step();
      std::string channel = " on channel " + std::to_string(lane.ends.channel);
      if (actionReceives(step.action)) return "a message from rank " + std::to_string(step.recvPeer) + channel;
      if (actionSends(step.action)) return "room to send to rank " + std::to_string(step.sendPeer) + channel;
    }
    return awaited_.empty() ? "nothing" : "peers to take its last messages (zero-copy reads, checksum checks)";
  }

 private:
  std::byte* pointer(const Region& region, size_t lo) const {
    const void* base = region.buffer == Buffer::kInput    ? task_->inputs[region.bufferIndex]
                       : region.buffer == Buffer::kOutput ? task_->outputs[region.bufferIndex]
                                                          : task_->scratch;
    return const_cast<std::byte*>(static_cast<const std::byte*>(base)) +
           (region.offset + lo) * (region.buffer == Buffer::kScratch ? scratchBytes_ : elementBytes_);
  }

  // Whether `region` holds wider partials than the type (wide_: a region of scratch).
  bool wide(const Region& region) const { return wide_ && region.buffer == Buffer::kScratch; }
  bool touchesWide(const Step& step) const {
    return wide(step.dst) || (step.action != Action::kRecv && step.action != Action::kRecvCopySend && wide(step.src)) ||
           (step.action == Action::kReduce && wide(step.src2));
  }

  // Whether writes into `region` should bypass the cache: large call outputs only (see copy.h).
  bool streamTo(const Region& region) const { return task_->streamOutputs && region.buffer == Buffer::kOutput; }

  // Runs the lane's next slice if it can (*ran), moving its data with this host's copies and reductions.
  loomResult_t runSlice(LaneRun& run, bool* ran) {
    HostWalker::Slice slice;
    const LaneStatus status = run.walker.prepare(run.ends, &slice);
    *ran = status == LaneStatus::kRan;
    if (status == LaneStatus::kBadMessage)
      return LOOM_FAIL(loomRemoteError, COLL,
                       "%s: rank %d sent a message of %zu bytes on channel %d where %zu were expected; do the "
                       "ranks' calls (counts, types, order) match?",
                       task_->what, slice.step->recvPeer, slice.arrival.bytes, run.ends.channel, slice.bytes);
    if (!*ran) return loomSuccess;  // waiting (aborts are looked at when nothing moves)
    bool direct = false, again = false;
    uint32_t sum = 0;  // under LOOM_CHECKSUM, the CRC32C of the message out, where move() summed it on the way
    const bool summed = task_->checksum && slice.count() > 0 && summedInBlocks(slice);
    // A slice summed whole is checked before any of its data moves (as LOOM_CHECKSUM=2 needs); a direct
    // message's payload is checked in move(), where it is found.
    if (task_->checksum && slice.in != nullptr && !slice.arrival.direct && !summed)
      LOOM_CHECK(verify(run.ends.channel, slice, crc32c(slice.arrival.data, slice.bytes),
                        carriedSum(slice.arrival.data, slice.bytes), &again));
    if (!again && slice.count() > 0) LOOM_CHECK(move(run.ends.channel, slice, summed, &direct, &again, &sum));
    if (again) {  // asked to be sent again (LOOM_CHECKSUM=2): the slice waits for it, nothing of it done yet
      *ran = false;
      return loomSuccess;
    }
    if (slice.out != nullptr && !direct && marksSent_)
      sent(slice, !task_->checksum ? 0 : summed ? sum : crc32c(slice.slot, slice.bytes));
    run.walker.finish(run.ends, slice, direct);
    return loomSuccess;
  }

  // Under LOOM_CHECKSUM, whether a slice's data moves in blocks, each summed as it passes (move()): a Simple
  // slice of more than a block that takes or sends a message and touches no wider partials, not under
  // LOOM_CHECKSUM=2. Others are summed whole, before and after they move.
  bool summedInBlocks(const HostWalker::Slice& slice) const {
    if (resends_) return false;  // a slice sent again must find its destination as it was: checked before it moves
    if (slice.protocol != Protocol::kSimple || slice.bytes <= kSummedBlockBytes) return false;
    if (slice.in == nullptr && slice.out == nullptr) return false;
    return !touchesWide(*slice.step);
  }

  // The data of a slice of summedInBlocks, moved kSummedBlockBytes at a time, each block summed while it is in the
  // cache: an incoming block just before it is used, an outgoing one just after it is written (a slice summed
  // whole reads each slot twice, the second time from further away). A forwarded block (recvCopySend) is the one
  // that came in, so the sum checked is the one sent on. `incoming`: the payload, in the slot or where a direct
  // message's lies; `directOut`: where a direct message out is read from (nullptr: the slot). Returns the sums of
  // what came in and of what goes out.
  std::pair<uint32_t, uint32_t> moveSummed(const HostWalker::Slice& slice, const std::byte* incoming,
                                           const Region* directOut) {
    const Step& step = *slice.step;
    const size_t perBlock = std::max<size_t>(1, kSummedBlockBytes / elementBytes_);
    const bool forwards = step.action == Action::kRecvCopySend;
    uint32_t in = 0, out = 0;
    for (size_t lo = slice.lo; lo < slice.hi; lo += perBlock) {
      const size_t n = std::min(slice.hi - lo, perBlock), at = (lo - slice.lo) * elementBytes_;
      const size_t bytes = n * elementBytes_;
      const std::byte* from = incoming ? incoming + at : nullptr;
      std::byte* slot = slice.out && !directOut ? static_cast<std::byte*>(slice.slot) + at : nullptr;
      if (from) in = crc32c(from, bytes, in);
      moveData(step, lo, n, from, slot, directOut != nullptr);
      if (slice.out && !forwards) out = crc32c(directOut ? pointer(*directOut, lo) : slot, bytes, out);
    }
    return {in, forwards ? in : out};
  }

  // The checksum a message carries `at` bytes into its slot: after the payload, or after a DirectDescriptor.
  static uint32_t carriedSum(const void* slot, size_t at) {
    uint32_t carried = 0;
    std::memcpy(&carried, static_cast<const std::byte*>(slot) + at, kChecksumBytes);
    return carried;
  }

  // The call as errors name it: "AllReduce #3" (the communicator's number of it, where it has one).
  std::string callName() const {
    return task_->sequence > 0 ? std::string(task_->what) + " #" + std::to_string(task_->sequence) : task_->what;
  }

  // LOOM_CHECKSUM, receiving: checkSum's verdict, except that under LOOM_CHECKSUM=2 a first mismatch on a link
  // that sends again (Links::sendsAgain: the sender writes this rank's FIFO itself, or a proxy that resends moves
  // it) asks the sender for the message again (*again) instead of failing. The slice must not have moved any data
  // yet.
  loomResult_t verify(int channel, const HostWalker::Slice& slice, uint32_t computed, uint32_t carried, bool* again) {
    if (computed == carried) return loomSuccess;
    const int sender = slice.step->recvPeer;
    if (resends_ && !slice.in->resent() && task_->links->sendsAgain(sender)) {
      LOOM_WARN(COLL,
                "%s: a message from rank %d to rank %d on channel %d failed its checksum (CRC32C %08x computed, %08x "
                "carried); asking for it again (LOOM_CHECKSUM=2)",
                callName().c_str(), sender, task_->rank, channel, computed, carried);
      slice.in->askResend();
      *again = true;
      return loomSuccess;
    }
    return checkSum(channel, slice, computed, carried);
  }

  // LOOM_CHECKSUM=2, sending: writes a message `out`'s receiver asked for again back into its slot from the copy
  // sent() retained, through the fault hook as when it was first sent. Returns whether there was one.
  // A zero-copy message exposes only its checksum to the hook, as in move().
  static bool rewriteAsked(FifoSender* out) {
    size_t bytes = 0;
    bool direct = false;
    auto* message = static_cast<std::byte*>(out->rewrite(&bytes, &direct));
    if (message == nullptr) return false;
    if (direct) {
      corruptInTransit(message + bytes - kChecksumBytes, kChecksumBytes);
    } else {
      corruptInTransit(message, bytes);
    }
    out->repost();
    return true;
  }

  // LOOM_CHECKSUM, receiving: the CRC32C computed of the slice's payload (in the slot, or where a direct message's
  // lies) against the one the message carries. A mismatch fails the call naming the link and the bytes, and notes
  // the failure as corrupted data from the sender, which the abort marks carry to every rank.
  loomResult_t checkSum(int channel, const HostWalker::Slice& slice, uint32_t computed, uint32_t carried) {
    if (computed == carried) return loomSuccess;
    const Step& step = *slice.step;
    const int sender = step.recvPeer;
    task_->links->noteFailure(corruptedOrigin(task_->rank, sender));
    const std::string call = callName();
    // Where its data was going: a region of a buffer, or (recvReduceSend) straight into the message on.
    std::string bound;
    if (step.action == Action::kRecvReduceSend) {
      bound = "combined into the message on to rank " + std::to_string(step.sendPeer);
    } else {
      const char* buffer = step.dst.buffer == Buffer::kInput    ? "input"
                           : step.dst.buffer == Buffer::kOutput ? "output"
                                                                : "scratch";
      const size_t width = step.dst.buffer == Buffer::kScratch ? scratchBytes_ : elementBytes_;
      const size_t at = (step.dst.offset + slice.lo) * width;
      bound = "bound for bytes " + std::to_string(at) + ".." + std::to_string(at + slice.count() * width) + " of the " +
              buffer;
    }
    return LOOM_FAIL(loomRemoteError, COLL,
                     "%s: a message from rank %d to rank %d on channel %d failed its checksum (LOOM_CHECKSUM): "
                     "%zu bytes at byte offset %zu of the step's %zu, %s (a %s message; CRC32C %08x computed, %08x "
                     "carried): the data was corrupted on its way%s",
                     call.c_str(), sender, task_->rank, channel, slice.bytes, slice.lo * elementBytes_,
                     step.count() * elementBytes_, bound.c_str(),
                     slice.arrival.direct ? "zero-copy" : protocolName(slice.protocol), computed, carried,
                     !resends_                                  ? ""
                     : slice.in->resent()                       ? ", and again when it was sent a second time"
                     : !task_->links->sendsAgain(sender)        ? " (not sent again: LOOM_CHECKSUM=2 resends only over "
                                                                  "shared memory and tcp, not through the ucx or ib "
                                                                  "proxy)"
                                                                : "");
  }

  // A message written into its slot, before it is posted. Under LOOM_CHECKSUM: `sum`, the CRC32C of the payload,
  // after it. Where this rank writes the receiver's FIFO itself, the fault hook (LOOM_FAULT_CORRUPT) may then
  // corrupt the message as it lands (a proxy's receiving end does it for the network transports), and under
  // LOOM_CHECKSUM the task ends only once the receiver has checked it.
  void sent(const HostWalker::Slice& slice, uint32_t sum) {
    auto* slot = static_cast<std::byte*>(slice.slot);
    if (task_->checksum) std::memcpy(slot + slice.bytes, &sum, kChecksumBytes);
    const int peer = slice.step->sendPeer;
    if (task_->links->movesByProxy(peer)) return;
    if (resends_) slice.out->retain(slice.protocol, slice.bytes + kChecksumBytes);
    corruptInTransit(slot, slice.bytes + (task_->checksum ? kChecksumBytes : 0));
    if (task_->checksum) await(slice.out, peer);
  }

  // Waits, at the task's end, for `peer` to have taken every message sent it on `out`.
  void await(FifoSender* out, int peer) {
    auto known = [&](const std::pair<FifoSender*, int>& entry) { return entry.first == out; };
    if (std::none_of(awaited_.begin(), awaited_.end(), known)) awaited_.emplace_back(out, peer);
  }

  // The data of a slice that runs: copies, reductions, and the direct (zero-copy) messages it takes or sends
  // (*direct: the message it sends is a DirectDescriptor). *again: a direct message it takes failed its checksum
  // and was asked for again (verify); the slice stops there, having at most stored the payload it read. Under
  // LOOM_CHECKSUM, a slice of summedInBlocks (`summed`) is summed as it moves (moveSummed) and checked before the
  // walker posts anything or releases the slot, so that one that fails goes no further; *outSum is then the sum of
  // its message out. Others are summed whole: a direct payload here before it moves.
  loomResult_t move(int channel, const HostWalker::Slice& slice, bool summed, bool* direct, bool* again,
                    uint32_t* outSum) {
    const Step& step = *slice.step;
    const size_t lo = slice.lo, bytes = slice.bytes, n = slice.count();
    FifoSender* out = slice.out;
    const void* incoming = slice.arrival.data;
    void* slot = slice.slot;
    const DirectDescriptor* message = slice.arrival.direct ? static_cast<const DirectDescriptor*>(incoming) : nullptr;
    if (message) incoming = task_->links->mapDirect(*message);  // the payload where it lies, when mapped here
    if (message && incoming == nullptr) {
      // Not mapped: pull the payload now with CMA, straight into the destination when the step only stores it.
      bool stores = (step.action == Action::kRecv || step.action == Action::kRecvCopySend) && !wide(step.dst);
      if (!stores) staging_.resize(bytes);
      void* target = stores ? pointer(step.dst, lo) : staging_.data();
      LOOM_CHECK(readDirect(*message, target, task_->what, step.recvPeer));
      incoming = target;
    }
    const uint32_t carried =
        task_->checksum && slice.in ? carriedSum(message ? static_cast<const void*>(message) : slice.arrival.data,
                                                 message ? sizeof(DirectDescriptor) : bytes)
                                    : 0;
    if (message && task_->checksum && !summed) {
      LOOM_CHECK(verify(channel, slice, crc32c(incoming, bytes), carried, again));
      if (*again) return loomSuccess;
    }
    const DirectBuffer* directBuffer = nullptr;
    const Region* directSource = out ? directSourceOf(step, slice.protocol, &directBuffer) : nullptr;
    *direct = directSource != nullptr;
    if (touchesWide(step)) return moveWide(step, lo, n, incoming, slot);
    if (summed) {
      const auto [in, leaving] = moveSummed(slice, static_cast<const std::byte*>(incoming), directSource);
      if (slice.in != nullptr) LOOM_CHECK(checkSum(channel, slice, in, carried));
      *outSum = leaving;
    } else {
      moveData(step, lo, n, incoming, slot, *direct);
    }
    if (directSource) {
      // The payload stays where it is; the peer reads it, and this task ends only when it has. Under LOOM_CHECKSUM
      // its checksum follows the descriptor, and is all of it the fault hook can corrupt: a flip of a bit of the
      // payload would be one of the caller's own buffer.
      *static_cast<DirectDescriptor*>(slot) = {reinterpret_cast<uint64_t>(pointer(*directSource, lo)), bytes,
                                               static_cast<int32_t>(thisProcess()), directBuffer->region};
      if (task_->checksum) {
        std::byte* sum = static_cast<std::byte*>(slot) + sizeof(DirectDescriptor);
        const uint32_t value = summed ? *outSum : crc32c(pointer(*directSource, lo), bytes);
        std::memcpy(sum, &value, kChecksumBytes);
        // Through a proxy the message lands at the receiving proxy, which runs the fault hook, and the proxy keeps
        // the message itself where it resends (tcp): nothing to retain here.
        if (!task_->links->movesByProxy(step.sendPeer)) {
          if (resends_) out->retain(Protocol::kSimple, sizeof(DirectDescriptor) + kChecksumBytes);
          corruptInTransit(sum, kChecksumBytes);
        }
      }
      await(out, step.sendPeer);
      if (task_->directMessages) ++*task_->directMessages;
    }
    return loomSuccess;
  }

  // The copies and reductions of a slice's elements [lo, lo + n) of `step`: from `incoming` (what arrived) and
  // into `slot` (the message out), where the step has them; `direct`: the message out is a DirectDescriptor.
  void moveData(const Step& step, size_t lo, size_t n, const void* incoming, void* slot, bool direct) {
    const size_t bytes = n * elementBytes_;
    switch (step.action) {
      case Action::kSend:
        if (!direct) std::memcpy(slot, pointer(step.src, lo), bytes);
        break;
      case Action::kRecv:
        if (incoming != pointer(step.dst, lo)) copyOut(pointer(step.dst, lo), incoming, bytes, streamTo(step.dst));
        break;
      case Action::kRecvReduce:
        reduce_(pointer(step.dst, lo), pointer(step.src, lo), incoming, n);
        break;
      case Action::kRecvReduceSend:
        reduce_(slot, pointer(step.src, lo), incoming, n);
        break;
      case Action::kRecvReduceCopySend:
        reduce_(pointer(step.dst, lo), pointer(step.src, lo), incoming, n);
        if (!direct) std::memcpy(slot, pointer(step.dst, lo), bytes);
        break;
      case Action::kRecvCopySend:
        if (incoming != pointer(step.dst, lo)) copyOut(pointer(step.dst, lo), incoming, bytes, streamTo(step.dst));
        if (!direct) std::memcpy(slot, incoming, bytes);
        break;
      case Action::kCopy:
        // In-place layouts make some copies onto themselves.
        if (pointer(step.dst, lo) != pointer(step.src, lo)) {
          std::byte *to = pointer(step.dst, lo), *from = pointer(step.src, lo);
          bool overlap = to < from + bytes && from < to + bytes;
          if (overlap) {
            std::memmove(to, from, bytes);
          } else {
            copyOut(to, from, bytes, streamTo(step.dst));
          }
        }
        break;
      case Action::kReduce:
        reduce_(pointer(step.dst, lo), pointer(step.src, lo), pointer(step.src2, lo), n);
        break;
    }
  }

  // A slice of a step that reads or writes wider partials (wide_): combined in fp32, rounded to the type only as
  // it leaves scratch. Messages carry the type, so a plan sends no partial (the verifier holds builders to it).
  loomResult_t moveWide(const Step& step, size_t lo, size_t n, const void* incoming, void* slot) {
    const loomDataType_t type = task_->datatype;
    switch (step.action) {
      case Action::kRecv:
        convertPartials(type, pointer(step.dst, lo), true, incoming, false, n);
        return loomSuccess;
      case Action::kRecvCopySend:
        convertPartials(type, pointer(step.dst, lo), true, incoming, false, n);
        std::memcpy(slot, incoming, n * elementBytes_);
        return loomSuccess;
      case Action::kRecvReduce:
        wideReduce_(pointer(step.dst, lo), wide(step.dst), pointer(step.src, lo), wide(step.src), incoming, false, n);
        return loomSuccess;
      case Action::kCopy:
        convertPartials(type, pointer(step.dst, lo), wide(step.dst), pointer(step.src, lo), wide(step.src), n);
        return loomSuccess;
      case Action::kReduce:
        wideReduce_(pointer(step.dst, lo), wide(step.dst), pointer(step.src, lo), wide(step.src),
                    pointer(step.src2, lo), wide(step.src2), n);
        return loomSuccess;
      default:
        return LOOM_FAIL(loomInternalError, COLL, "%s: the %s plan's step \"%s\" sends wider partials from scratch",
                         task_->what, task_->plan->algorithm, describeStep(step).c_str());
    }
  }

  // The region a step sends, when it may go out as a DirectDescriptor: Simple protocol, a peer that can read
  // our memory, and data that sits in a buffer the task marked direct (the input for send; the destination,
  // written just before, for the forwarding steps).
  // For a peer whose messages this process's proxy moves, the proxy reads the data itself: any buffer the call
  // does not write meanwhile will do, and forwarding steps always send from the output.
  const Region* directSourceOf(const Step& step, Protocol protocol, const DirectBuffer** buffer) const {
    if (protocol != Protocol::kSimple) return nullptr;
    bool proxied = task_->links->proxySends(step.sendPeer);
    if (!proxied && !task_->links->directTo(step.sendPeer)) return nullptr;
    auto marked = [&](const std::vector<DirectBuffer>& buffers, uint32_t index) {
      if (index >= buffers.size() || !(proxied ? buffers[index].unwritten : buffers[index].direct)) return false;
      *buffer = &buffers[index];
      return true;
    };
    if (step.action == Action::kSend && step.src.buffer == Buffer::kInput &&
        marked(task_->directInputs, step.src.bufferIndex))
      return &step.src;
    bool forwards = step.action == Action::kRecvCopySend || step.action == Action::kRecvReduceCopySend;
    if (forwards && (task_->directForwards || proxied) && step.dst.buffer == Buffer::kOutput &&
        marked(task_->directOutputs, step.dst.bufferIndex))
      return &step.dst;
    return nullptr;
  }

  ExecTask* task_ = nullptr;
  size_t elementBytes_ = 1;
  size_t scratchBytes_ = 1;  // bytes of an element of scratch: elementBytes_, or its partial's where wide_
  bool wide_ = false;
  bool marksSent_ = false;  // sent() has work: LOOM_CHECKSUM, or the fault hook armed
  bool resends_ = false;    // LOOM_CHECKSUM=2: a message that fails its check is sent again once
  ReduceFn reduce_ = nullptr;
  WideReduceFn wideReduce_ = nullptr;
  std::vector<LaneRun> lanes_;
  std::vector<std::byte> staging_;                          // a direct payload on its way into a reduction
  // Connections (and their peer) whose receiver must take every message before the task ends, each once: those
  // that carried direct messages, and under LOOM_CHECKSUM those whose receiver this rank reaches itself.
  std::vector<std::pair<FifoSender*, int>> awaited_;
};

HostExecutor::HostExecutor() = default;
HostExecutor::~HostExecutor() = default;

loomResult_t HostExecutor::run(std::vector<std::vector<ExecTask>>& queues, const WatchFn& watch, int64_t spinPolls) {
  loomResult_t result = runQueues(queues, watch, spinPolls);
  for (Links* links : driving_) links->endNetworkProgress();
  driving_.clear();
  return result;
}

// Moves the network connections of the tasks in progress from this thread, where their transport allows it.
bool HostExecutor::progressNetwork(std::span<std::unique_ptr<TaskRun>> runs) {
  for (auto& run : runs) {
    if (!run->active()) continue;
    Links* links = run->task().links;
    if (std::find(driving_.begin(), driving_.end(), links) != driving_.end()) continue;
    if (links->beginNetworkProgress()) driving_.push_back(links);
  }
  bool moved = false;
  for (Links* links : driving_) moved |= links->progressNetwork();
  return moved;
}

loomResult_t HostExecutor::runQueues(std::vector<std::vector<ExecTask>>& queues, const WatchFn& watch,
                                     int64_t spinPolls) {
  next_.assign(queues.size(), 0);
  while (runs_.size() < queues.size()) runs_.push_back(std::make_unique<TaskRun>());
  std::span<std::unique_ptr<TaskRun>> current(runs_.data(), queues.size());
  Backoff backoff(spinPolls);
  NeedsPeerFn needsPeer = [&](size_t queue, int peer) {
    return queue < current.size() && current[queue]->active() && current[queue]->waitsOn(peer);
  };
  WaitingForFn waitingFor = [&](size_t queue) {
    return queue < current.size() && current[queue]->active() ? current[queue]->waitingFor() : std::string();
  };
  // A connection lost without a word, since when (waiting a moment for a mark that says why).
  bool lossSeen = false;
  Clock::time_point lossSeenAt;
  auto stopAll = [&](loomResult_t result) {
    for (auto& run : current) {
      if (run->active()) run->abortLinks();
      run->stop();
    }
    return result;
  };
  for (;;) {
    bool allDone = true, progress = false;
    for (size_t q = 0; q < queues.size(); ++q) {
      TaskRun& run = *current[q];
      while (next_[q] < queues[q].size() || run.active()) {
        if (!run.active()) run.start(queues[q][next_[q]++]);
        loomResult_t result = run.advance(&progress);
        if (result != loomSuccess) return stopAll(result);
        if (!run.done()) break;
        run.finish();
        run.stop();
      }
      if (run.active()) allDone = false;
    }
    if (allDone) return loomSuccess;
    // The network costs system calls: while spinning, every 64th pass looks at it (as at aborts, below).
    if (!progress && (!backoff.spinning() || backoff.polls() % 64 == 63)) progress = progressNetwork(current);
    if (progress) {
      backoff.reset();
      if (loomResult_t result = watch(true, needsPeer, waitingFor); result != loomSuccess)
        return stopAll(result);  // abort
      continue;
    }
    // While spinning, poll tight and look at aborts, deadline and peers every 64th pass only (a clock read and a
    // flag or two each time); every pass once waits are long.
    if (backoff.spinning() && backoff.polls() % 64 != 63) {
      backoff.pause();
      continue;
    }
    for (auto& run : current) {
      int peer = -1;
      uint64_t origin = 0;
      uint32_t code = run->active() ? run->peerAborted(&peer, &origin) : 0;
      if (code != 0) {
        if (origin == 0) {
          // Another mark may say why, or soon will (Links::kMarkGraceMs).
          bool mayCome = false;
          origin = run->task().links->marksAfterLoss(peer, &mayCome);
          if (origin == 0 && mayCome) {
            const Clock::time_point now = Clock::now();
            if (!lossSeen) {
              lossSeen = true;
              lossSeenAt = now;
            }
            if (now - lossSeenAt < std::chrono::milliseconds(Links::kMarkGraceMs)) continue;
          }
        }
        // What the mark carried, else what this rank saw of the peer (noteFailure may tell more).
        FailureCause seen = code == kConnectionLost ? FailureCause::kConnectionLost : FailureCause::kUnknown;
        run->task().links->noteFailure(origin != 0 ? origin : packOrigin({peer, seen, 0}));
      }
      if (code == kConnectionLost) {
        // What the transport saw of it; else, a connection of this rank that failed before (it names its peer).
        std::string why = run->task().links->whyLost(peer);
        const char* lead = "; ";
        if (why.empty()) {
          why = run->task().links->whyLost(-1);
          lead = "; this rank lost a connection before: ";
        }
        return stopAll(LOOM_FAIL(loomRemoteError, COLL,
                                 "%s: the connection to rank %d was lost (it exited, closed its communicator, or the "
                                 "network failed)%s%s",
                                 run->task().what, peer, why.empty() ? "" : lead, why.c_str()));
      }
      if (code != 0) {
        // A connection of this rank that failed may be why: its peer gave up first, and the others followed.
        std::string why = run->task().links->whyLost(-1);
        return stopAll(LOOM_FAIL(
            loomRemoteError, COLL, "%s: rank %d gave up on the operation (it failed or was aborted)%s%s",
            run->task().what, peer, why.empty() ? "" : "; this rank lost a connection before: ", why.c_str()));
      }
    }
    loomResult_t result = watch(false, needsPeer, waitingFor);
    if (result != loomSuccess) {
      // Name what this rank was waiting for: the peer at fault, most of the time.
      std::string message = threadLastError();
      for (auto& run : current)
        if (run->active()) message += "; waiting for " + run->waitingFor();
      return stopAll(LOOM_FAIL(result, COLL, "%s", message.c_str()));
    }
    backoff.pause();
  }
}

}  // namespace loom
