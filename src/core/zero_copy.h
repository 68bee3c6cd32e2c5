// Zero-copy, the communicator's half (zero_copy.cc): which peers may read this process's memory, and which of a
// call's buffers go direct.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "algorithms/plan.h"
#include "loom/loom.h"
#include "src/base/wait.h"
#include "src/core/enqueue.h"
#include "src/exec/host_executor.h"

struct loomComm;

namespace loom {

// What a rank tells its peers at init for the direct-access probe: its process, its host, and the address of a
// word they try to read from it (directProbeAddress()).
struct DirectProbe {
  int pid;
  uint64_t hostHash;
  uint64_t address;
};
uint64_t directProbeAddress();
// Each rank probes which same-host peers' memory it can read, over transports that carry DirectDescriptors
// (LOOM_DIRECT=0: none); the rows are exchanged so that every rank knows which peers it may send them, and which
// peers a proxy of this process sends to from the caller's memory. Sets comm->connections' direct and proxy peers.
loomResult_t exchangeDirectAccess(loomComm* comm, const std::vector<DirectProbe>& probes, const Deadline& deadline);

// Bytes of input / output buffer `index` of a call.
size_t callBufferBytes(const Call& call, const RankPlan* plan, bool input, size_t index);
// Marks the buffers of `task` (the call's, with its protocol settings set) that may go direct, and whether steps
// that forward what they just wrote may: `outputBytes`, the call's output in all.
void markZeroCopy(const Call& call, const RankPlan* plan, size_t outputBytes, ExecTask* task);

}  // namespace loom
