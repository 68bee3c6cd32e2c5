// perf/peers/peer_harness.h — the harness of the peer perf programs (mpi_perf, gloo_perf): loom's perf programs'
// size sweep, timing loop, exact check and table (perf/common.h), over another library, so that
// tools/compare-peers can set the peers' rows beside loom's. A program wraps its library in a PeerBackend and
// hands it to runPeerTest. Deliberately smaller than loom's harness: one collective (-C), one type and one
// operator per run, blocking out-of-place calls only (the in-place cells print N/A), ranks from a launcher.
// Includes only <loom/loom.h> and perf/ headers: loom names the types and operators and makes the check data.
#ifndef LOOM_PERF_PEERS_PEER_HARNESS_H_
#define LOOM_PERF_PEERS_PEER_HARNESS_H_

#include <loom/loom.h>

#include <cstddef>
#include <string>

#include "perf/common.h"

namespace perf {

// One blocking out-of-place call, as the harness hands it to a backend. The buffers hold sendCount and
// recvCount elements; `count` is what the call takes, the meaning of CallSizes::paramCount (the whole buffer
// for AllReduce and Broadcast, one rank's block for the others).
struct PeerCall {
  Collective collective;
  const void* send;
  void* recv;
  size_t sendCount;
  size_t recvCount;
  size_t count;
  loomDataType_t type;
  loomRedOp_t op;  // AllReduce and ReduceScatter only
  int root;        // Broadcast only
};

// What a library gives the harness. Calls are collective: every rank makes the same ones in the same order.
// A failed call ends the program with a message (the library's own error handling, or the backend's).
class PeerBackend {
 public:
  virtual ~PeerBackend() = default;
  // The library and its version, for the table's header, e.g. "Open MPI v4.1.4, ...".
  virtual std::string description() const = 0;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // Empty when the library can run `collective` on `type` with `op`; otherwise why it cannot.
  virtual std::string unsupported(Collective collective, loomDataType_t type, loomRedOp_t op) const = 0;
  virtual void run(const PeerCall& call) = 0;
  // Called, untimed, with every call a row's timed loop will make, before it: a library whose calls are objects
  // built once and run many times (Gloo's ReduceScatter) builds them here, as its users would.
  virtual void prepare(const PeerCall& /*call*/) {}
  virtual void barrier() = 0;
  // The sum of `value` over all ranks, for the mean time and the count of wrong elements.
  virtual double sumOverRanks(double value) = 0;
  // A row of another size begins: calls of the previous shape will not come again, so a backend that keeps
  // per-call state (Gloo's ReduceScatter objects) may drop it.
  virtual void startRow() {}
};

// Parses the command line, runs the sweep and prints the table on rank 0. Returns the exit code: 0, 1 when an
// element was wrong, 2 for a usage error (printed by rank 0).
int runPeerTest(int argc, char** argv, PeerBackend& backend);

}  // namespace perf

#endif  // LOOM_PERF_PEERS_PEER_HARNESS_H_
