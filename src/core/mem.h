// Which memory peers may read in place: allocations of loomMemAlloc (shared with every communicator) and
// regions registered on a communicator with loomCommRegister.
#pragma once

#include <cstddef>

#include "transports/fifo.h"

struct loomComm;

namespace loom {

// Whether [ptr, ptr+bytes) lies inside one loomMemAlloc allocation or one registration of `comm`.
bool isRegistered(loomComm* comm, const void* ptr, size_t bytes);

// The memfd behind the loomMemAlloc allocation that holds [ptr, ptr+bytes), for peers to map: base 0 when the
// range is not inside one allocation, fd < 0 when the allocation cannot be shared (its inode is unknown).
SharedRegion sharedRegionOf(const void* ptr, size_t bytes);

}  // namespace loom
