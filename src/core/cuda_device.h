// The device path of CUDA communicators (LOOM_CUDA_PATH=device): the communicator's side of the GPU executor
// (src/exec/cuda/device_executor.h: plans, connections and calls in; kernels out). A call runs as kernels on the
// caller's stream,
// over connections whose FIFOs and mailboxes lie in device memory that peers map (transports/cuda_ipc), with no
// host thread in the way. Small and medium AllReduce push into peers' mailboxes (one-shot, two-shot:
// src/exec/peer_allreduce.h); every other call, and larger AllReduce, runs the tuner's plan with one CTA per
// lane (src/exec/lane_runner.h). Calls it does not take (Send/Recv and AllToAllv groups, several calls in a group,
// ranks on several machines) go the staged path (cuda_calls.h). Built only where the build has CUDA.
#pragma once

#include <memory>

#include "loom/loom.h"
#include "src/core/enqueue.h"

struct loomComm;

namespace loom {

class DevicePath;
struct DevicePathDeleter {
  void operator()(DevicePath* path) const;
};
using DevicePathPtr = std::unique_ptr<DevicePath, DevicePathDeleter>;

// A GPU executor for `comm` on `device` when LOOM_CUDA_PATH asks for one and cuda_ipc connects every pair of its
// ranks (*out null otherwise, with the reason logged). `abortFlag`: the device's view of a mapped word that turns
// non-zero when the communicator is aborted. Called once the communicator has its peers.
loomResult_t devicePathCreate(loomComm* comm, int device, const uint32_t* abortFlag, DevicePathPtr* out);
// Whether `path` runs `call` (a single call of a collective it knows).
bool devicePathTakes(const DevicePath& path, const Call& call);
// Enqueues `call` on its stream: the kernels, and for loomAvg the divide. Returns at once.
loomResult_t devicePathEnqueue(DevicePath& path, const Call& call);
// A kernel's failure as the communicator's error (loomSuccess while none has failed).
loomResult_t devicePathError(DevicePath& path);

}  // namespace loom
