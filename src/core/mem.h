// Which memory peers may read in place: allocations of loomMemAlloc (shared with every communicator) and
// regions registered on a communicator with loomCommRegister.
#pragma once

#include <cstddef>

struct loomComm;

namespace loom {

// Whether [ptr, ptr+bytes) lies inside one loomMemAlloc allocation or one registration of `comm`.
bool isRegistered(loomComm* comm, const void* ptr, size_t bytes);

}  // namespace loom
