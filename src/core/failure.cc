// Failures that name their root cause (failure.h).
#include "src/core/failure.h"

#include <sys/socket.h>

#include <cstring>
#include <vector>

#include "src/base/bootstrap.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/base/socket.h"
#include "src/core/comm.h"

namespace loom {
namespace {

constexpr uint32_t kStatusKind = 0x6c737471;  // "lstq": a handoff connection that asks for this rank's status
constexpr size_t kAnswerBytes = 32;           // collectives entered, runs started, runs finished, failure noted
constexpr int64_t kQueryTimeoutMs = 1000;     // per peer; a live peer's listener answers within milliseconds

void putAnswerWord(uint8_t* out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}
uint64_t getAnswerWord(const uint8_t* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

struct PeerStatus {
  uint64_t collectives = 0;
  uint64_t started = 0;
  uint64_t finished = 0;
  uint64_t failure = 0;
};

// Asks `peer` for its status; false when it does not answer within kQueryTimeoutMs. The query's own failure is
// no error of the run: its message is put back.
bool queryStatus(loomComm* comm, int peer, PeerStatus* status) {
  const std::string saved = threadLastError();
  QuietFailures quiet;
  uint8_t hello[kHandoffHelloBytes] = {};
  for (int i = 0; i < 4; ++i) hello[i] = static_cast<uint8_t>(kStatusKind >> (8 * i));
  UniqueFd fd;
  uint8_t answer[kAnswerBytes];
  IoWait wait{Deadline(kQueryTimeoutMs), nullptr, "status query of rank " + std::to_string(comm->rank)};
  bool answered = comm->bootstrap->connectHandoff(peer, hello, kQueryTimeoutMs, &fd) == loomSuccess &&
                  readExact(fd.get(), answer, sizeof(answer), "rank " + std::to_string(peer), wait) == loomSuccess;
  setThreadLastError(saved);
  if (!answered) return false;
  status->collectives = getAnswerWord(answer);
  status->started = getAnswerWord(answer + 8);
  status->finished = getAnswerWord(answer + 16);
  status->failure = getAnswerWord(answer + 24);
  return true;
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += i + 1 == ranks.size() ? " and " : ", ";
    text += std::to_string(ranks[i]);
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + text;
}

}  // namespace

std::string describeRank(const loomComm* comm, int rank) {
  if (rank < 0 || rank >= static_cast<int>(comm->peers.size())) return "a rank";
  std::string text = "rank " + std::to_string(rank) + " (pid " + std::to_string(comm->peers[rank].pid);
  if (rank < static_cast<int>(comm->hostNames.size())) text += " on host " + comm->hostNames[rank];
  return text + ")";
}

std::string describeFailure(const loomComm* comm, const FailureOrigin& origin) {
  const std::string who = describeRank(comm, origin.rank);
  switch (origin.cause) {
    case FailureCause::kExited:
      return who + " exited with status " + std::to_string(origin.detail);
    case FailureCause::kKilled: {
      const char* name = sigabbrev_np(origin.detail);
      return who + " was killed by signal " + std::to_string(origin.detail) +
             (name != nullptr ? std::string(" (SIG") + name + ")" : std::string());
    }
    case FailureCause::kGone:
      return who + " has ended (it exited or was killed)";
    case FailureCause::kStopped:
      return who + " is stopped (SIGSTOP or a debugger) and does not move";
    case FailureCause::kConnectionLost:
      return "the connection to " + who + " was lost (it ended, closed its communicator, or the network failed)";
    case FailureCause::kDeadline:
      return who + " waited past its deadline (LOOM_TIMEOUT_MS) with every peer in the call";
    case FailureCause::kUserAbort:
      return who + " had its communicator aborted (loomCommAbort, loomCommRevoke, or its framework's abort)";
    case FailureCause::kLate:
      return who + " had not entered the collective the others waited in when their deadline passed";
    case FailureCause::kNoAnswer:
      return who + " did not answer past the deadline (stopped, hung, or unreachable)";
    case FailureCause::kError:
      return who + " failed of an error of its own (its log says which)";
    case FailureCause::kCorrupted:
      return who + " received a message from " +
             (origin.detail > 0 ? "rank " + std::to_string(origin.detail - 1) : std::string("a peer")) +
             " that failed its checksum (LOOM_CHECKSUM: corrupted on its way; that rank's error names the link)";
    case FailureCause::kUnknown:
      break;
  }
  return who + " gave up on an operation and did not say why";
}

std::string failurePrefix(loomComm* comm, const char* what, uint64_t sequence, const std::string& message) {
  const uint64_t packed = comm->connections.failure();
  if (packed == 0) return {};
  const FailureOrigin origin = unpackOrigin(packed);
  // This rank found it itself and said so (a stopped or late rank at its deadline).
  if (message.find(describeRank(comm, origin.rank)) != std::string::npos) return {};
  if (origin.rank == comm->rank) {
    // What the others found of this rank, which its own message cannot say.
    if (origin.cause == FailureCause::kLate)
      return "first failure: this rank's peers waited past their deadline for it to enter the collective; ";
    if (origin.cause == FailureCause::kNoAnswer)
      return "first failure: this rank did not answer its peers' status query past their deadline; ";
    return {};
  }
  PeerStatus status;
  if (origin.cause == FailureCause::kLate && sequence > 0 && origin.rank >= 0 && origin.rank < comm->nranks &&
      queryStatus(comm, origin.rank, &status) && status.collectives < sequence) {
    return "first failure: " + describeRank(comm, origin.rank) + " has not entered " + what + " #" +
           std::to_string(sequence) + "; last seen in " +
           (status.collectives == 0 ? std::string("none") : "#" + std::to_string(status.collectives)) + "; ";
  }
  return "first failure: " + describeFailure(comm, origin) + "; ";
}

uint64_t askFailure(loomComm* comm, int peer) {
  PeerStatus status;
  if (peer == comm->rank || peer < 0 || peer >= comm->nranks || !queryStatus(comm, peer, &status)) return 0;
  return status.failure;
}

void startStatusService(loomComm* comm) {
  comm->bootstrap->setHandoffHandler(kStatusKind, [comm](int, const uint8_t*, UniqueFd fd) {
    uint8_t answer[kAnswerBytes];
    putAnswerWord(answer, comm->status.collectives());
    putAnswerWord(answer + 8, comm->status.started());
    putAnswerWord(answer + 16, comm->status.finished());
    putAnswerWord(answer + 24, comm->connections.failure());
    // The socket is fresh and its buffer empty: the answer goes at once or not at all (the asker then hears
    // nothing and says so). Closing the descriptor ends the connection.
    if (::send(fd.get(), answer, sizeof(answer), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
    }
  });
}

void stopStatusService(loomComm* comm) {
  if (comm->bootstrap != nullptr) comm->bootstrap->setHandoffHandler(kStatusKind, nullptr);
}

DeadlineFinding findLateRanks(loomComm* comm, const char* what, uint64_t sequence) {
  std::vector<int> late, stopped, ended, silent;
  std::vector<uint64_t> lastSeen;
  FailureOrigin endedOrigin;
  for (int peer = 0; peer < comm->nranks; ++peer) {
    if (peer == comm->rank) continue;
    int detail = 0;
    PeerWatch::State state = comm->peerWatch.state(peer, &detail);
    if (state == PeerWatch::State::kStopped) {
      stopped.push_back(peer);
      continue;
    }
    if (state != PeerWatch::State::kRunning) {
      if (ended.empty() || (state == PeerWatch::State::kKilled && endedOrigin.cause != FailureCause::kKilled)) {
        endedOrigin.rank = peer;
        endedOrigin.cause = state == PeerWatch::State::kKilled   ? FailureCause::kKilled
                            : state == PeerWatch::State::kExited ? FailureCause::kExited
                                                                 : FailureCause::kGone;
        endedOrigin.detail = static_cast<uint8_t>(detail);
      }
      ended.push_back(peer);
      continue;
    }
    PeerStatus status;
    if (!queryStatus(comm, peer, &status)) {
      // It may have ended meanwhile (a peer that failed first and left).
      const PeerWatch::State now = comm->peerWatch.state(peer, &detail);
      (now == PeerWatch::State::kRunning || now == PeerWatch::State::kStopped ? silent : ended).push_back(peer);
      continue;
    }
    if (sequence > 0 && status.collectives < sequence) {
      late.push_back(peer);
      lastSeen.push_back(status.collectives);
    }
  }
  DeadlineFinding finding;
  std::vector<std::string> parts;
  if (!late.empty()) {
    std::string seen;
    for (size_t i = 0; i < lastSeen.size(); ++i) {
      if (i > 0 && lastSeen[i] == lastSeen[i - 1]) continue;
      seen += std::string(seen.empty() ? "" : ", ") + (lastSeen[i] == 0 ? "none" : "#" + std::to_string(lastSeen[i]));
    }
    const std::string who = late.size() == 1 ? describeRank(comm, late.front()) : joinRanks(late);
    parts.push_back(std::string(what) + " #" + std::to_string(sequence) + ": " + who +
                    (late.size() == 1 ? " has" : " have") + " not entered it; last seen in " + seen);
  }
  for (int peer : stopped) parts.push_back(describeRank(comm, peer) + " is stopped (SIGSTOP or a debugger)");
  if (!ended.empty()) parts.push_back(joinRanks(ended) + (ended.size() == 1 ? " has" : " have") + " ended");
  if (!silent.empty())
    parts.push_back(joinRanks(silent) + (silent.size() == 1 ? " does" : " do") +
                    " not answer a status query (stopped, hung, or unreachable)");
  for (const std::string& part : parts) finding.text += (finding.text.empty() ? "" : "; ") + part;
  // A rank that was killed is the likeliest cause, then a stopped one, then one that has not entered the call; one
  // that exited by itself may have failed of the others (its own deadline) and left.
  if (!ended.empty() && endedOrigin.cause == FailureCause::kKilled) {
    finding.origin = endedOrigin;
  } else if (!stopped.empty()) {
    finding.origin = {stopped.front(), FailureCause::kStopped, 0};
  } else if (!late.empty()) {
    finding.origin = {late.front(), FailureCause::kLate, 0};
  } else if (!ended.empty()) {
    finding.origin = endedOrigin;
  } else if (!silent.empty()) {
    finding.origin = {silent.front(), FailureCause::kNoAnswer, 0};
  } else {
    finding.origin = {comm->rank, FailureCause::kDeadline, 0};
  }
  return finding;
}

}  // namespace loom
