// Zero-copy, the communicator's half: which peers may read this process's memory (probed at init), and which
// buffers of a call may travel as DirectDescriptors instead of through FIFO slots. The data path's half is the
// executor's (host_executor.cc sends and resolves descriptors; peer_memory.h maps peers' shared regions); which
// memory is registered is mem.h's.
#include "src/core/zero_copy.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "src/base/check.h"
#include "src/base/dtype.h"
#include "src/base/params.h"
#include "src/core/comm.h"
#include "src/core/mem.h"
#include "transports/fifo_protocol.h"

namespace loom {
namespace {

// A word at a known address that peers read to find out whether they can read this process's memory.
const uint64_t kProbeWord = 0x6c6f6f6d2d636d61;  // "loom-cma"

// Whether this process can read `pid`'s memory with process_vm_readv (Yama or a container may forbid it).
bool canReadProcess(int pid, uint64_t probeAddress) {
  if (pid == getpid()) return true;
  uint64_t word = 0;
  iovec local{&word, sizeof(word)}, remote{reinterpret_cast<void*>(probeAddress), sizeof(word)};
  return process_vm_readv(pid, &local, 1, &remote, 1, 0) == sizeof(word) && word == kProbeWord;
}

// A buffer is direct when it is registered and, for inputs, overlaps no output: a peer reads it later than
// the step that posted it, so the call must not write it meanwhile. A proxy of this process (tcp) needs no
// registration: only that the call does not write the buffer meanwhile.
void markDirectBuffers(const Call& call, const RankPlan* plan, ExecTask* task) {
  auto span = [&](bool input, size_t i) {
    auto base = reinterpret_cast<uintptr_t>(input ? call.inputs[i] : call.outputs[i]);
    return std::pair<uintptr_t, uintptr_t>{base, base + callBufferBytes(call, plan, input, i)};
  };
  const bool proxied = call.comm->connections.anyProxySends();
  auto directBuffer = [&](bool input, size_t i) {
    const void* base = input ? call.inputs[i] : call.outputs[i];
    size_t bytes = callBufferBytes(call, plan, input, i);
    return DirectBuffer{isRegistered(call.comm, base, bytes), proxied, sharedRegionOf(base, bytes)};
  };
  task->directOutputs.assign(call.outputs.size(), {});
  for (size_t i = 0; i < call.outputs.size(); ++i) task->directOutputs[i] = directBuffer(false, i);
  task->directInputs.assign(call.inputs.size(), {});
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    DirectBuffer input = directBuffer(true, i);
    if (!input.direct && !input.unwritten) continue;
    bool overlaps = false;
    auto [inLo, inHi] = span(true, i);
    for (size_t o = 0; o < call.outputs.size(); ++o) {
      auto [outLo, outHi] = span(false, o);
      overlaps |= call.outputs[o] != nullptr && inLo < outHi && outLo < inHi;
    }
    if (!overlaps) task->directInputs[i] = input;
  }
}

}  // namespace

uint64_t directProbeAddress() { return reinterpret_cast<uint64_t>(&kProbeWord); }

// Bytes of input / output buffer `index` of a call.
size_t callBufferBytes(const Call& call, const RankPlan* plan, bool input, size_t index) {
  size_t count = input ? plan->inputCount : plan->outputCount;
  if (call.collective == Collective::kSendRecv) count = call.p2p[index].count;
  return count * dtypeSize(call.datatype);
}

// Each rank probes which same-host peers' memory it can read, over transports that carry DirectDescriptors;
// the rows are exchanged so that every rank knows which peers may be sent them.
loomResult_t exchangeDirectAccess(loomComm* comm, const std::vector<DirectProbe>& probes, const Deadline& deadline) {
  int n = comm->nranks;
  std::vector<uint8_t> canRead(static_cast<size_t>(n) * n, 0);
  bool enabled = params::direct() != 0;
  for (int p = 0; p < n && enabled; ++p) {
    canRead[comm->rank * n + p] = comm->traitsTo[p].carriesDirect &&
                                  probes[p].hostHash == probes[comm->rank].hostHash &&
                                  canReadProcess(probes[p].pid, probes[p].address);
  }
  LOOM_CHECK(comm->bootstrap->allGather(canRead.data(), n, deadline.remainingMs()));
  std::vector<bool> directTo(n), proxyTo(n);
  for (int p = 0; p < n; ++p) {
    directTo[p] = p != comm->rank && canRead[p * n + comm->rank];
    // Under LOOM_CHECKSUM a message carries its checksum after the payload: a proxy that cannot send it behind the
    // caller's memory (ProxyConn::trailer) takes the message through the FIFO's slot instead.
    const TransportTraits& traits = comm->traitsTo[p];
    proxyTo[p] = enabled && traits.proxySendsFromCallerMemory &&
                 (!comm->settings.checksum || traits.proxySendsChecksumAfterCallerMemory);
  }
  comm->connections.setDirectPeers(std::move(directTo));
  comm->connections.setProxyPeers(std::move(proxyTo));
  return loomSuccess;
}

void markZeroCopy(const Call& call, const RankPlan* plan, size_t outputBytes, ExecTask* task) {
  loomComm* comm = call.comm;
  // Only Simple messages go direct; a call whose every step fits the LL threshold skips the buffer lookups.
  size_t largest = 0;
  for (size_t i = 0; i < call.inputs.size(); ++i) largest = std::max(largest, callBufferBytes(call, plan, true, i));
  for (size_t i = 0; i < call.outputs.size(); ++i) largest = std::max(largest, callBufferBytes(call, plan, false, i));
  if (fifo::protocolFor(largest, task->llThresholdBytes, task->forcedProtocol) == Protocol::kSimple)
    markDirectBuffers(call, plan, task);
  // Below LOOM_DIRECT_FORWARD_BYTES of output a step that forwards what it just wrote (a ring's reduce and pass
  // on) copies it into the FIFO slot: the lines are still in the forwarding core's cache, and the peer pulling
  // them from there is slower than that core's own copy (docs/PERFORMANCE.md).
  task->directForwards = outputBytes >= comm->settings.directForwardBytes;
  task->directMessages = &comm->directMessages;
}

}  // namespace loom
