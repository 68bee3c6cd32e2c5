// Failures that name their root cause. Whoever finds a failure first notes a FailureOrigin (fifo_protocol.h) on
// the communicator's connections (Links::noteFailure); every abort mark and network abort notice this rank sends
// then carries it, and a rank that learns of a failure from a peer's mark notes the origin the mark carried. So
// every survivor's error leads with the same first failure, "rank 3 (pid 4242 on host node1) was killed by signal
// 9 (SIGKILL)", followed by what it saw itself. Past a deadline, a rank asks every peer for its place in the
// sequence of collectives (a status query over the bootstrap), and names those that never entered the call.
#pragma once

#include <cstdint>
#include <string>

#include "loom/loom.h"
#include "transports/fifo_protocol.h"

struct loomComm;

namespace loom {

// "rank 3 (pid 4242 on host node1)"; "a rank" when `rank` is not known.
std::string describeRank(const loomComm* comm, int rank);
// The first failure as a clause: "rank 3 (pid 4242 on host node1) was killed by signal 9 (SIGKILL)".
std::string describeFailure(const loomComm* comm, const FailureOrigin& origin);

// What a failed run on `comm` says before its own `message`: "first failure: <the first failure>; " when the
// first failure noted is another rank's, else "" (also when `message` names that rank as describeRank does: this
// rank found it itself). A rank noted late is asked where it is, so that
// the run in collective #`sequence` (`what`; 0: none) says "rank 2 (...) has not entered AllReduce #12; last
// seen in #11" as the rank that found it does.
std::string failurePrefix(loomComm* comm, const char* what, uint64_t sequence, const std::string& message);

// The failure `peer` has noted (packOrigin), asked over the bootstrap; 0 when it has noted none or does not answer.
uint64_t askFailure(loomComm* comm, int peer);

// Answers peers' status queries from the bootstrap's listener thread for as long as `comm` lives; stop before
// the communicator's state goes.
void startStatusService(loomComm* comm);
void stopStatusService(loomComm* comm);

// Past a deadline in collective #`sequence` of `comm` (0: the run holds no collective): what this rank finds of
// its peers. `text` lists the ranks that have not entered the call, the stopped or ended ones on this machine and
// the ones that did not answer ("AllReduce #12: rank 5 has not entered it (last seen in #11)"; empty when every
// peer is in the call); `origin` points at the likeliest cause (a killed rank, a stopped one, a late one, one that
// exited, one that did not answer; else this rank's own deadline).
struct DeadlineFinding {
  std::string text;
  FailureOrigin origin;
};
DeadlineFinding findLateRanks(loomComm* comm, const char* what, uint64_t sequence);

}  // namespace loom
