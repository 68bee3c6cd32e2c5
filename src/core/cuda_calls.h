// CUDA communicators (config device = loomDeviceCuda): calls take device buffers and a cudaStream_t, enqueue on
// the stream and return at once. This is the staged path, which works over every transport: on the stream, the
// inputs are copied to pinned host memory, a one-thread kernel waits at a gate in mapped host memory while the
// communicator's CUDA worker thread runs the call on the host copies with the host executor, then the outputs
// are copied back. The worker's waits carry the communicator's deadline and abort flag, and it always opens the
// gate (on success, error, timeout or abort), so the stream never waits forever. Where every rank is on one
// machine, LOOM_CUDA_PATH=device runs the collectives as kernels instead (cuda_device.h). docs/DESIGN.md, "CUDA
// communicators", says what runs where.
#pragma once

#include <memory>
#include <vector>

#include "loom/loom.h"
#include "src/core/enqueue.h"

struct loomComm;

namespace loom {

// Makes `comm` a CUDA communicator on device `ordinal`, its calls and GPU executor attached as an extension
// (loomComm::extension) (LOOM_CONFIG_UNDEF_INT: the calling thread's current
// device): checks the device, starts the worker. Fails with a clear message when there is no such device.
loomResult_t cudaCommAttach(loomComm* comm, int ordinal);
// Once `comm` has its peers: starts its GPU executor where LOOM_CUDA_PATH=device asks for one and cuda_ipc reaches
// every peer (cuda_device.h).
loomResult_t cudaCommConnected(loomComm* comm);
// Queues `calls` (one call, or one group's calls of one communicator, all on one stream) on their CUDA stream.
// Checks first that every buffer is memory the device can reach; on an error nothing is queued.
loomResult_t cudaEnqueue(std::vector<Call> calls);
// Records a failure of `comm`'s kernels as its async error (loomCommGetAsyncError).
void cudaCommCheckKernels(loomComm* comm);
// Ends the waits of every call queued on `comm` (loomCommAbort): their streams go on, their outputs undefined.
void cudaCommAbort(loomComm* comm);

}  // namespace loom
