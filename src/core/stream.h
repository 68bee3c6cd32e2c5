// Host streams: in-order asynchronous queues of calls, each run by its own worker thread. A call queued on a
// stream returns at once; loomStreamSynchronize waits for the queue to drain and returns its first error.
#pragma once

#include <vector>

#include "loom/loom.h"
#include "src/core/enqueue.h"

namespace loom {

// Whether `stream` is a live stream made by loomStreamCreate.
bool isHostStream(loomStream_t stream);
// Queues `calls` (one call, or a whole group) to run together on `stream`.
loomResult_t streamEnqueue(loomStream_t stream, std::vector<Call> calls);
loomResult_t streamCreate(loomStream_t* stream);
loomResult_t streamSynchronize(loomStream_t stream);
loomResult_t streamDestroy(loomStream_t stream);

}  // namespace loom
