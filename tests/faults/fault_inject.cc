// Fault injection: ranks as processes run random collectives until one rank is killed (SIGKILL) or stopped
// (SIGSTOP, a stuck peer) at a random moment. Every survivor must end its call with loomRemoteError or loomTimeout
// within the deadline plus 2 s, never hang or crash, and then abort or destroy its communicator at once; every
// survivor's error must name the victim as loom names a rank ("rank 3 (pid 4242 on host node1)": the first
// failure, whichever neighbour it waited for); after a stop, some survivor's loomTimeout must name the operation
// and the rank it waited for (how often that is the stopped rank itself is counted); nothing may be left in the
// shared-memory directory.
//
// A stopped rank then meets one of three ends, in turn from one stop trial to the next: it is killed once the
// survivors are done; it is resumed (SIGCONT) once they are done, and must then end by itself, as they did, within
// the same bounds; or it is resumed after a pause (drawn) shorter than a third of the deadline, which no rank may
// fail of (the paused rank must still be running 300 ms later, and no survivor may fail before the kill that
// follows, or time out on a wait that began before it), and the trial then goes on as a kill of that rank.
//
//   fault_inject [--trials N] [--seed S] [--transports shm,tcp,ucx,ib] [--min-ranks 2] [--max-ranks 8] [--only T]
//                [--stop-every K] [--timeout-ms T] [--verbose]
//
// Each trial draws a transport among those available, a rank count, a victim, a signal (every K-th trial SIGSTOP,
// else SIGKILL) and a delay; the ranks draw the same sequence of collectives (AllReduce, AllGather, Broadcast,
// ReduceScatter, AllToAll, Barrier) and sizes from the trial's seed. A line per trial, then the totals: trials,
// hangs, crashes, wrong results, and the worst detection time per signal. Exit status 0 when every trial held.
// CI runs a few trials (meson test faults); tests/faults/run-long.sh runs 200 for docs/RELIABILITY.md. --only T runs
// trial T alone, drawn as in a run of the same options (so `--trials 200 --seed 2026 --timeout-ms 3000 --only 149`
// replays the long run's trial 149; the timing is the machine's).
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "tests/common/children.h"
#include "transports/transport.h"

namespace {

using loomtest::ChildPipes;
using loomtest::Children;

struct Options {
  int trials = 20;
  uint64_t seed = 1;
  std::vector<std::string> transports;  // empty: every one available
  int minRanks = 2;
  int maxRanks = 8;
  int stopEvery = 5;
  int timeoutMs = 3000;
  int only = -1;  // >= 0: run only this trial (the draws before it still made, so it replays a long run's trial)
  bool verbose = false;
};

// What becomes of a stopped rank (above).
enum class StopEnd { kKill, kResume, kPause };

struct Trial {
  int index;
  std::string transport;
  int nranks;
  int victim;
  int signal;  // SIGKILL or SIGSTOP
  int delayMs;
  uint64_t seed;
  bool destroy;   // survivors destroy (else abort) their communicator after the error
  int timeoutMs;  // the communicators' deadline
  StopEnd stopEnd;  // for a SIGSTOP
  int pauseMs;      // kPause: how long the rank stays stopped
};

int64_t monotonicNs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

void setTransportEnv(const std::string& transport) {
  setenv("LOOM_TRANSPORTS", transport.c_str(), 1);
  if (transport == "ib") setenv("LOOM_IB_PROVIDER", "softib", 1);
}

// A rank: random collectives until one fails. Tells the parent "R" after the first succeeds, then, on the error,
// "E <code> <ns when it failed> <ns abort or destroy took>|<message>" and exits with the code.
int rankMain(const ChildPipes& pipes, const Trial& trial, int rank, const std::string& shmDir) {
  setenv("LOOM_SHM_DIR", shmDir.c_str(), 1);
  setTransportEnv(trial.transport);
  loomUniqueId id;
  if (!loomtest::receiveId(pipes.fromParent, &id)) return loomtest::kChildCheckFailed;
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.timeoutMs = trial.timeoutMs;
  loomComm_t comm = nullptr;
  loomResult_t result = loomCommInitRankConfig(&comm, trial.nranks, id, rank, &config);
  if (result != loomSuccess) {
    loomtest::tell(pipes.toParent, std::string("init: ") + loomGetLastError(nullptr));
    return loomtest::kInitFailed + result;
  }
  const int n = trial.nranks;
  constexpr size_t kMaxCount = size_t{1} << 18;
  std::vector<float> send(kMaxCount * n, static_cast<float>(rank + 1)), recv(kMaxCount * n, 0.0f);
  std::mt19937_64 draw(trial.seed);  // the same sequence on every rank
  for (long call = 0;; ++call) {
    size_t count = 1 + draw() % kMaxCount;
    int kind = static_cast<int>(draw() % 6);
    int root = static_cast<int>(draw() % n);
    switch (kind) {
      case 0:
        result = loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm, nullptr);
        break;
      case 1:
        result = loomAllGather(send.data(), recv.data(), count, loomFloat32, comm, nullptr);
        break;
      case 2:
        result = loomBroadcast(send.data(), recv.data(), count, loomFloat32, root, comm, nullptr);
        break;
      case 3:
        result = loomReduceScatter(send.data(), recv.data(), count, loomFloat32, loomSum, comm, nullptr);
        break;
      case 4:
        result = loomAllToAll(send.data(), recv.data(), count, loomFloat32, comm, nullptr);
        break;
      default:
        result = loomBarrier(comm, nullptr);
        break;
    }
    if (result != loomSuccess) break;
    if (call == 0) loomtest::tell(pipes.toParent, "R");
  }
  const int64_t failedAt = monotonicNs();
  std::string message = loomGetLastError(comm);
  const int64_t closeStart = monotonicNs();
  if (trial.destroy) {
    loomCommDestroy(comm);
  } else {
    loomCommAbort(comm);
  }
  const int64_t closeNs = monotonicNs() - closeStart;
  std::ostringstream said;
  said << "E " << static_cast<int>(result) << " " << failedAt << " " << closeNs << "|" << message;
  loomtest::tell(pipes.toParent, said.str());
  return result;
}

struct Totals {
  int trials = 0, failedTrials = 0, hangs = 0, crashes = 0, wrongCodes = 0, late = 0, slowClose = 0;
  int unnamedStops = 0, unnamedVictims = 0, leftovers = 0, setupFailures = 0;
  int resumed = 0, resumedEnded = 0;  // stopped ranks resumed after the survivors ended, and those that then ended
  int pauses = 0, failedInPause = 0;  // stops shorter than the deadline, and ranks that failed of one
  int stopTrials = 0, stoppedRankNamed = 0;  // stop trials, and those where a loomTimeout named the stopped rank
  double worstKillMs = 0, worstStopMs = 0, worstCloseMs = 0;
  std::map<std::string, int> perTransport;
};

// Runs one trial; prints its line; adds to the totals. False when something the header promises did not hold.
bool runTrial(const Trial& trial, const Options& options, Totals* totals) {
  loomtest::ShmDir shm;
  if (shm.path().empty()) {
    std::printf("trial %d: mkdtemp in /dev/shm: %s\n", trial.index, strerror(errno));
    ++totals->setupFailures;
    return false;
  }
  std::vector<std::string> problems;
  std::vector<std::string> messages;  // every survivor's error, "rank 3: ..."
  std::string end;  // what became of a stopped rank, for the trial's line
  double worstMs = 0, worstCloseMs = 0;
  {
    Children children;
    for (int rank = 0; rank < trial.nranks; ++rank)
      if (!children.spawn([&, rank](const ChildPipes& pipes) { return rankMain(pipes, trial, rank, shm.path()); })) {
        std::printf("trial %d: fork: %s\n", trial.index, strerror(errno));
        ++totals->setupFailures;
        return false;
      }
    loomUniqueId id;
    if (loomGetUniqueId(&id) != loomSuccess || !children.sendToAll(&id, sizeof(id)) || !children.waitReady(60)) {
      children.waitAll(5);
      std::printf("trial %d: the ranks did not start:%s\n", trial.index, children.report().c_str());
      ++totals->setupFailures;
      return false;
    }
    usleep(static_cast<useconds_t>(trial.delayMs) * 1000);
    // A pause: stopped and resumed well within the deadline, then killed; checked as a kill from then on.
    const bool pause = trial.signal == SIGSTOP && trial.stopEnd == StopEnd::kPause;
    if (pause) {
      children.signal(trial.victim, SIGSTOP);
      usleep(static_cast<useconds_t>(trial.pauseMs) * 1000);
      children.signal(trial.victim, SIGCONT);
      usleep(300 * 1000);
      ++totals->pauses;
      if (!children.running(trial.victim)) {
        problems.push_back("rank " + std::to_string(trial.victim) + " (paused) ended during its pause: " +
                           loomtest::describeStatus(children[trial.victim].status) + ": " +
                           children[trial.victim].said);
        ++totals->failedInPause;
      }
    }
    const int signal = pause ? SIGKILL : trial.signal;
    const int64_t signalledAt = monotonicNs();
    children.signal(trial.victim, signal);
    // Survivors must be done within the deadline plus 2 s; allow 10 s more before calling it a hang.
    const double boundMs = options.timeoutMs + 2000.0;
    bool allDone = children.waitAll(boundMs / 1000 + 10, signal == SIGSTOP ? trial.victim : -1);
    if (pause)
      end = " (resumed after " + std::to_string(trial.pauseMs) + " ms, then killed)";
    else if (trial.signal == SIGSTOP)
      end = trial.stopEnd == StopEnd::kKill ? " (then killed)"
            : allDone                       ? " (then resumed)"
                                            : " (not resumed: survivors hung)";
    if (signal == SIGSTOP && trial.stopEnd == StopEnd::kResume && allDone) {
      // Resumed, the stopped rank finds its peers gone: it must end as they did, within the same bounds.
      ++totals->resumed;
      const int64_t resumedAt = monotonicNs();
      children.signal(trial.victim, SIGCONT);
      children.waitAll(boundMs / 1000 + 10);
      const auto& victim = children[trial.victim];
      const std::string who = "rank " + std::to_string(trial.victim) + " (resumed)";
      long long failedAt = 0, closeNs = 0;
      int reported = 0;
      const size_t at = victim.said.find("E ");
      if (WIFSIGNALED(victim.status)) {
        problems.push_back(who + " " + (WTERMSIG(victim.status) == SIGKILL ? "hung" : "crashed: ") +
                           (WTERMSIG(victim.status) == SIGKILL ? "" : loomtest::describeStatus(victim.status)));
        ++(WTERMSIG(victim.status) == SIGKILL ? totals->hangs : totals->crashes);
      } else if (int code = WEXITSTATUS(victim.status); code != loomRemoteError && code != loomTimeout) {
        problems.push_back(who + " ended with " + loomtest::describeStatus(victim.status) + ": " + victim.said);
        ++totals->wrongCodes;
      } else if (at == std::string::npos ||
                 std::sscanf(victim.said.c_str() + at, "E %d %lld %lld", &reported, &failedAt, &closeNs) != 3) {
        problems.push_back(who + " said nothing of its error: " + victim.said);
        ++totals->wrongCodes;
      } else {
        ++totals->resumedEnded;
        if ((failedAt - resumedAt) / 1e6 > boundMs) {
          problems.push_back(who + " took " + std::to_string(static_cast<int>((failedAt - resumedAt) / 1e6)) + " ms");
          ++totals->late;
        }
        if (closeNs / 1e6 > 2000) {
          problems.push_back(who + (trial.destroy ? " destroy" : " abort") + " took " +
                             std::to_string(static_cast<int>(closeNs / 1e6)) + " ms");
          ++totals->slowClose;
        }
        if (options.verbose)
          std::printf("    %s: %d after %.0f ms: %s\n", who.c_str(), reported, (failedAt - resumedAt) / 1e6,
                      victim.said.substr(victim.said.find('|', at) + 1).c_str());
      }
    }
    children.signal(trial.victim, SIGKILL);
    children.waitAll(10);
    bool timeoutNamed = false, stopNamed = false, hung = false;
    for (int rank = 0; rank < trial.nranks; ++rank) {
      if (rank == trial.victim) continue;
      const auto& child = children[rank];
      std::string who = "rank " + std::to_string(rank);
      if (!allDone && !(WIFEXITED(child.status))) {
        problems.push_back(who + " hung");
        ++totals->hangs;
        hung = true;
        continue;
      }
      if (WIFSIGNALED(child.status)) {
        problems.push_back(who + " crashed: " + loomtest::describeStatus(child.status));
        ++totals->crashes;
        continue;
      }
      int code = WEXITSTATUS(child.status);
      if (code != loomRemoteError && code != loomTimeout) {
        problems.push_back(who + " ended with " + loomtest::describeStatus(child.status) + ": " + child.said);
        ++totals->wrongCodes;
        continue;
      }
      size_t at = child.said.find("E ");
      long long failedAt = 0, closeNs = 0;
      int reported = 0;
      if (at == std::string::npos ||
          std::sscanf(child.said.c_str() + at, "E %d %lld %lld", &reported, &failedAt, &closeNs) != 3) {
        problems.push_back(who + " said nothing of its error: " + child.said);
        ++totals->wrongCodes;
        continue;
      }
      std::string message = child.said.substr(child.said.find('|', at) + 1);
      messages.push_back(who + ": " + message);
      double detectMs = (failedAt - signalledAt) / 1e6, closeMs = closeNs / 1e6;
      // A wait that timed out began options.timeoutMs before it failed: before the kill (100 ms of slack), it was
      // a wait through the pause.
      if (pause && (detectMs < 0 || (code == loomTimeout && detectMs < options.timeoutMs - 100))) {
        problems.push_back(who + " failed of a pause of " + std::to_string(trial.pauseMs) + " ms (" +
                           std::to_string(static_cast<int>(detectMs)) + " ms from the kill that followed)");
        ++totals->failedInPause;
      }
      worstMs = std::max(worstMs, detectMs);
      worstCloseMs = std::max(worstCloseMs, closeMs);
      if (detectMs > boundMs) {
        problems.push_back(who + " took " + std::to_string(static_cast<int>(detectMs)) + " ms");
        ++totals->late;
      }
      if (closeMs > 2000) {
        problems.push_back(who + (trial.destroy ? " destroy" : " abort") + " took " +
                           std::to_string(static_cast<int>(closeMs)) + " ms");
        ++totals->slowClose;
      }
      // Every survivor leads with the first failure: the victim, as loom names a rank.
      const std::string victimName =
          "rank " + std::to_string(trial.victim) + " (pid " + std::to_string(children[trial.victim].pid) + " on host ";
      if (message.find(victimName) == std::string::npos) {
        problems.push_back(who + " does not name the " + (signal == SIGKILL ? "killed" : "stopped") + " rank (\"" +
                           victimName + "...\"): " + message);
        ++totals->unnamedVictims;
      }
      const bool namesOperation =
          message.find("AllReduce") != std::string::npos || message.find("AllGather") != std::string::npos ||
          message.find("Broadcast") != std::string::npos || message.find("ReduceScatter") != std::string::npos ||
          message.find("AllToAll") != std::string::npos || message.find("Barrier") != std::string::npos;
      if (signal == SIGSTOP && code == loomTimeout && namesOperation &&
          message.find("waiting for ") != std::string::npos && message.find(" rank ") != std::string::npos) {
        timeoutNamed = true;
        stopNamed |= message.find("rank " + std::to_string(trial.victim) + " ") != std::string::npos;
      }
      if (options.verbose) std::printf("    %s: %d after %.0f ms: %s\n", who.c_str(), code, detectMs, message.c_str());
    }
    if (signal == SIGSTOP && !timeoutNamed && !hung) {
      problems.push_back("no survivor's loomTimeout named the operation and the rank it waited for");
      ++totals->unnamedStops;
    }
    if (signal == SIGSTOP) {
      ++totals->stopTrials;
      if (stopNamed) ++totals->stoppedRankNamed;
    }
  }
  std::vector<std::string> left = shm.entries();
  if (!left.empty()) {
    problems.push_back("left in the shared-memory directory:" + loomtest::joined(left));
    ++totals->leftovers;
  }
  const bool ok = problems.empty();
  const std::string what = (trial.signal == SIGKILL ? "SIGKILL" : "SIGSTOP") + end;
  std::printf("trial %3d: %-4s %d ranks, %s rank %d after %3d ms, %s: worst detection %6.1f ms, %s %5.1f ms: %s\n",
              trial.index, trial.transport.c_str(), trial.nranks, what.c_str(), trial.victim, trial.delayMs,
              trial.destroy ? "destroy" : "abort  ", worstMs, trial.destroy ? "destroy" : "abort", worstCloseMs,
              ok ? "ok" : "FAILED");
  for (const std::string& problem : problems) std::printf("    %s\n", problem.c_str());
  if (!ok && !options.verbose)  // what every survivor said, to tell the first failure from what followed
    for (const std::string& message : messages) std::printf("      said by %s\n", message.c_str());
  std::fflush(stdout);
  ++totals->trials;
  ++totals->perTransport[trial.transport];
  if (!ok) ++totals->failedTrials;
  const bool killed = trial.signal == SIGKILL || trial.stopEnd == StopEnd::kPause;
  double& worst = killed ? totals->worstKillMs : totals->worstStopMs;
  worst = std::max(worst, worstMs);
  totals->worstCloseMs = std::max(totals->worstCloseMs, worstCloseMs);
  return ok;
}

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

int usage(const char* why) {
  std::fprintf(stderr,
               "fault_inject: %s\nusage: fault_inject [--trials N] [--seed S] [--transports shm,tcp,ucx,ib] "
               "[--min-ranks N] [--max-ranks N] [--stop-every K] [--timeout-ms T] [--only T] [--verbose]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (arg == "--verbose") {
      options.verbose = true;
    } else if ((arg == "--trials" || arg == "--seed" || arg == "--transports" || arg == "--min-ranks" ||
                arg == "--max-ranks" || arg == "--stop-every" || arg == "--timeout-ms" || arg == "--only") &&
               (v = value()) != nullptr) {
      if (arg == "--transports") {
        options.transports = splitList(v);
        continue;
      }
      char* end = nullptr;
      long long number = std::strtoll(v, &end, 10);
      if (*end != '\0' || number < 0) return usage(("bad value for " + arg + ": " + v).c_str());
      if (arg == "--trials") options.trials = static_cast<int>(number);
      if (arg == "--seed") options.seed = static_cast<uint64_t>(number);
      if (arg == "--min-ranks") options.minRanks = static_cast<int>(number);
      if (arg == "--max-ranks") options.maxRanks = static_cast<int>(number);
      if (arg == "--stop-every") options.stopEvery = static_cast<int>(number);
      if (arg == "--timeout-ms") options.timeoutMs = static_cast<int>(number);
      if (arg == "--only") options.only = static_cast<int>(number);
    } else {
      return usage(("unknown or incomplete argument " + arg).c_str());
    }
  }
  if (options.minRanks < 2 || options.maxRanks < options.minRanks)
    return usage("ranks: need 2 <= --min-ranks <= --max-ranks");
  if (options.timeoutMs < 300) return usage("--timeout-ms must be at least 300");
  // The ranks' errors are expected: their messages are checked here, not logged (the settings are read once).
  if (!options.verbose) setenv("LOOM_DEBUG", "NONE", 1);
  // The transports this build and machine have (ib on the software device).
  std::vector<std::string> wanted =
      options.transports.empty() ? std::vector<std::string>{"shm", "tcp", "ucx", "ib"} : options.transports;
  std::vector<std::string> transports;
  for (const std::string& name : wanted) {
    std::string why;
    if (name == "ib") setenv("LOOM_IB_PROVIDER", "softib", 1);
    if (loom::transportAvailable(name, &why)) {
      transports.push_back(name);
    } else if (!options.transports.empty()) {
      return usage((name + " is not available: " + why).c_str());
    } else {
      std::printf("# %s: not available (%s)\n", name.c_str(), why.c_str());
    }
  }
  if (transports.empty()) return usage("no transport available");
  std::printf("# fault_inject --trials %d --seed %llu --min-ranks %d --max-ranks %d --stop-every %d --timeout-ms %d\n",
              options.trials, (unsigned long long)options.seed, options.minRanks, options.maxRanks, options.stopEvery,
              options.timeoutMs);
  std::mt19937_64 draw(options.seed);
  Totals totals;
  for (int t = 0; t < options.trials; ++t) {
    Trial trial;
    trial.index = t;
    trial.transport = transports[draw() % transports.size()];
    trial.nranks = options.minRanks + static_cast<int>(draw() % (options.maxRanks - options.minRanks + 1));
    trial.victim = static_cast<int>(draw() % trial.nranks);
    trial.signal = options.stopEvery > 0 && t % options.stopEvery == options.stopEvery - 1 ? SIGSTOP : SIGKILL;
    trial.delayMs = static_cast<int>(draw() % 400);
    trial.seed = draw();
    trial.destroy = draw() % 2 == 0;
    trial.timeoutMs = options.timeoutMs;
    trial.stopEnd = static_cast<StopEnd>(options.stopEvery > 0 ? t / options.stopEvery % 3 : 0);
    trial.pauseMs = 50 + static_cast<int>(draw() % static_cast<uint64_t>(options.timeoutMs / 3 - 50));
    if (options.only < 0 || options.only == t) runTrial(trial, options, &totals);
  }
  std::printf("# %d trials (", totals.trials);
  bool first = true;
  for (const auto& [name, count] : totals.perTransport) {
    std::printf("%s%s %d", first ? "" : ", ", name.c_str(), count);
    first = false;
  }
  std::printf(
      "): %d failed; hangs %d, crashes %d, wrong results %d, late %d, slow abort/destroy %d, timeouts naming no peer "
      "%d, survivors not naming the victim %d, shared memory left %d, setup failures %d\n",
      totals.failedTrials, totals.hangs, totals.crashes, totals.wrongCodes, totals.late, totals.slowClose,
      totals.unnamedStops, totals.unnamedVictims, totals.leftovers, totals.setupFailures);
  std::printf(
      "# the stopped rank itself was named by a survivor's loomTimeout in %d of %d stop trials (elsewhere the first "
      "to time out named the neighbour it waited for)\n",
      totals.stoppedRankNamed, totals.stopTrials);
  std::printf(
      "# stopped ranks resumed after the survivors ended: %d, of which %d ended by themselves; pauses shorter than the "
      "deadline: %d, ranks that failed of one: %d\n",
      totals.resumed, totals.resumedEnded, totals.pauses, totals.failedInPause);
  std::printf(
      "# worst detection: %.1f ms after SIGKILL, %.1f ms after SIGSTOP (deadline %d ms); worst abort or "
      "destroy %.1f ms\n",
      totals.worstKillMs, totals.worstStopMs, options.timeoutMs, totals.worstCloseMs);
  return totals.failedTrials == 0 && totals.setupFailures == 0 ? 0 : 1;
}
