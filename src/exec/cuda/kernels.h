// The CUDA reduction and copy kernels the GPU executor runs on device buffers, as host functions that enqueue
// them on a stream. Same semantics as the host kernels (exec/reduce.h, element_ops.h). Declared without CUDA
// headers: a stream is passed as the cudaStream_t it is, cast to void*. Built only when CUDA is (meson option
// `cuda`).
#pragma once

#include <cstddef>
#include <cstdint>

#include "algorithms/flat_plan.h"
#include "loom/loom.h"
#include "src/exec/lane_runner.h"
#include "src/exec/peer_allreduce.h"

namespace loom::device {

// dst[i] = a[i] op b[i] for i < count, on `stream`. dst may be exactly a or b. loomAvg reduces as loomSum (its
// divide is enqueueDivide). loomInvalidArgument for a type or op outside its enum; loomUnhandledCudaError when the
// launch fails, with CUDA's message recorded.
loomResult_t enqueueReduce(void* dst, const void* a, const void* b, size_t count, loomDataType_t type,
                           loomRedOp_t op, void* stream);
// data[i] = data[i] / divisor (avg's last step); a divisor below 2 enqueues nothing.
loomResult_t enqueueDivide(void* data, size_t count, loomDataType_t type, int divisor, void* stream);
// bytes from src to dst, which do not overlap, on `stream`: 16-byte loads and stores where both are aligned to 16.
loomResult_t enqueueCopy(void* dst, const void* src, size_t bytes, void* stream);

// Where a stream waits for the host (src/core/cuda_calls.h): pinned host memory mapped into the device. The host
// writes `done` after the work of every sequence number up to it is finished (or has failed), and `abort` to end
// every wait at once.
struct StreamGate {
  uint64_t done;
  uint32_t abort;
  uint32_t unused;
};
// A one-thread kernel on `stream` that returns once gate->done >= sequence or gate->abort is set, polling with
// growing sleeps (up to 4 us). `gate` is the device's view of the mapped gate.
loomResult_t enqueueGateWait(const StreamGate* gate, uint64_t sequence, void* stream);

// Walks lane `lane` of a flat plan whose arrays are in device memory, with slices of `sliceElems` elements, in
// one device thread: writes each (step, round) it visits to `visits` (two words each, at most `capacity` pairs)
// and the number of pairs to *count. The gpu suite holds it to the host's walk: the device's half of the plan
// logic that flat_plan_test checks on the host.
loomResult_t enqueuePlanWalk(FlatPlanView plan, uint32_t lane, size_t sliceElems, uint32_t* visits, size_t capacity,
                             unsigned long long* count, void* stream);

// One rank's share of a call, run by the GPU executor's kernel: every lane of `plan` (its arrays in device
// memory) in a CTA of its own, whose first thread drives the lane and whose threads all move each slice's data,
// over FIFOs in fifo.h's layout that peers (other kernels, processes or the host) read and write. `recvEnds` and
// `sendEnds` (device memory, channel * nranks + peer) keep each connection's counters from call to call; no two
// lanes may share an end (unit/flat_plan_test.cc holds every plan to it). A lane stops at a peer's abort, a
// wrong-sized message, *abortFlag (mapped memory, or null) turning non-zero, or `timeoutNs` without progress, and
// writes the first such cause to *status (a LaneFailure; the caller zeroes it and reads it once the stream has
// passed the kernel); while *status is already set, the kernel returns at once (the communicator has failed).
// loomAvg runs as loomSum; its divide is enqueueDivide.
loomResult_t enqueueLanes(const FlatPlanView& plan, const LaneCall& call, const FifoWords& words,
                          PortableEnd* recvEnds, PortableEnd* sendEnds, int nranks, loomDataType_t type,
                          loomRedOp_t op, const uint32_t* abortFlag, uint64_t timeoutNs, uint32_t* status,
                          size_t llSlotBytes, void* stream);

// AllReduce by pushing into peers' mailboxes (src/exec/peer_allreduce.h), for small and medium messages. One-shot:
// one kernel of one CTA that pushes, meets every peer at barrier call.epoch and reduces. Two-shot: five kernels
// (scatter, barrier call.epoch, reduce and push, barrier call.epoch + 1, gather), the stream ordering their
// grids. A barrier stops at a peer's aborted mailbox, *abortFlag or `timeoutNs` without the last flag, writing
// the cause to *status as enqueueLanes does; every kernel returns at once while *status is set. loomAvg reduces as
// loomSum.
loomResult_t enqueueOneShot(const PeerCall& call, loomDataType_t type, loomRedOp_t op, const uint32_t* abortFlag,
                            uint64_t timeoutNs, uint32_t* status, void* stream);
loomResult_t enqueueTwoShot(const PeerCall& call, loomDataType_t type, loomRedOp_t op, const uint32_t* abortFlag,
                            uint64_t timeoutNs, uint32_t* status, void* stream);

}  // namespace loom::device
