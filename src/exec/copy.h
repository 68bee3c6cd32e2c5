// The executor's copy into a call's output. Large outputs are written with non-temporal (streaming) stores:
// a plain store first reads the destination line into the cache (a third memory transfer per byte copied) and
// then evicts whatever the cache held, while a streaming store writes the line straight to memory. For data
// that will not be read again soon (an output larger than the caches) that is a third less memory traffic.
// Copies into FIFO slots stay plain: the peer reads them at once, from the cache.
#pragma once

#include <cstddef>

namespace loom {

// dst and src must not overlap. With `streaming`, dst is written with non-temporal stores where the CPU has
// them, and the stores are fenced before returning, so a flag published afterwards orders after the data.
void copyOut(void* dst, const void* src, size_t bytes, bool streaming);

}  // namespace loom
