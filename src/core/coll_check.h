// LOOM_CHECK_COLL=1: before a call runs, the ranks of its communicator compare what they are calling, so that a
// rank calling something else (another collective, count, datatype, operator or root, or one call more or fewer)
// is an error naming every rank's call, rather than a hang or wrong data.
#pragma once

#include <span>

#include "loom/loom.h"
#include "src/core/enqueue.h"

struct loomComm;

namespace loom {

// Exchanges the fingerprint of `calls`, one communicator's (one call, or its share of a group), with every rank
// of `comm` over the bootstrap: the calls' sequence number, their count and a hash of each call's collective,
// count, datatype, operator and root, the first few in full for the message. Send and Recv take no part (they are
// point to point). loomInvalidUsage on every rank when any rank's fingerprint differs; the communicator stays
// usable. Nothing is exchanged when `calls` holds no collective.
loomResult_t checkSameCalls(loomComm* comm, std::span<const Call> calls);

}  // namespace loom
