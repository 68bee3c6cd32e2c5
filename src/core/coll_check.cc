// LOOM_CHECK_COLL (coll_check.h).
#include "src/core/coll_check.h"

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "src/base/check.h"
#include "src/base/dtype.h"
#include "src/core/comm.h"

namespace loom {
namespace {

constexpr int kShownCalls = 4;  // calls of a group described in full in the message

// One call as the ranks compare it: only what every rank must pass alike (AllToAllv's counts, for one, differ).
struct CallPrint {
  uint8_t collective;
  uint8_t datatype;
  uint8_t op;  // reductions only
  uint8_t unused;
  int32_t root;    // rooted collectives only; -1 otherwise
  uint64_t count;  // 0 for AllToAllv
};

struct Fingerprint {
  uint64_t sequence;  // this communicator's checked submissions so far, this one included
  uint32_t calls;
  uint32_t unused;
  uint64_t hash;  // FNV-1a over every call's print
  CallPrint shown[kShownCalls];
};

CallPrint printOf(const Call& call) {
  CallPrint print;
  std::memset(&print, 0, sizeof(print));
  print.collective = static_cast<uint8_t>(call.collective);
  print.datatype = static_cast<uint8_t>(call.datatype);
  print.op = reduces(call.collective) ? static_cast<uint8_t>(call.op) : 0;
  print.root = rooted(call.collective) ? call.root : -1;
  print.count = call.collective == Collective::kAllToAllv ? 0 : call.count;
  return print;
}

std::string describe(const CallPrint& print) {
  return describeCall(static_cast<Collective>(print.collective), print.count,
                      static_cast<loomDataType_t>(print.datatype), static_cast<loomRedOp_t>(print.op), print.root);
}

std::string describe(const Fingerprint& print) {
  std::string text = "call #" + std::to_string(print.sequence) + ": ";
  if (print.calls > 1) text += "a group of " + std::to_string(print.calls) + " collectives, ";
  for (uint32_t i = 0; i < print.calls && i < kShownCalls; ++i) text += (i ? ", " : "") + describe(print.shown[i]);
  if (print.calls > kShownCalls) text += ", ...";
  return text;
}

bool same(const Fingerprint& a, const Fingerprint& b) {
  return a.sequence == b.sequence && a.calls == b.calls && a.hash == b.hash;
}

}  // namespace

loomResult_t checkSameCalls(loomComm* comm, std::span<const Call> calls) {
  Fingerprint mine;
  std::memset(&mine, 0, sizeof(mine));
  mine.hash = 14695981039346656037ull;
  for (const Call& call : calls) {
    if (call.collective == Collective::kSendRecv) continue;
    CallPrint print = printOf(call);
    const auto* bytes = reinterpret_cast<const uint8_t*>(&print);
    for (size_t i = 0; i < sizeof(print); ++i) mine.hash = (mine.hash ^ bytes[i]) * 1099511628211ull;
    if (mine.calls < kShownCalls) mine.shown[mine.calls] = print;
    ++mine.calls;
  }
  if (mine.calls == 0) return loomSuccess;
  std::lock_guard<std::mutex> lock(comm->checkMutex);
  mine.sequence = ++comm->checkedCalls;
  std::vector<Fingerprint> all(comm->nranks);
  all[comm->rank] = mine;
  LOOM_CHECK(comm->bootstrap->allGather(all.data(), sizeof(Fingerprint), comm->settings.timeoutMs));
  bool agree = true;
  for (const Fingerprint& theirs : all) agree = agree && same(theirs, mine);
  if (agree) return loomSuccess;
  // Ranks with the same fingerprint together: "ranks 0, 2: call #7: AllReduce ...; rank 1: call #7: Broadcast ...".
  std::vector<bool> told(all.size(), false);
  std::string text;
  for (size_t r = 0; r < all.size(); ++r) {
    if (told[r]) continue;
    std::string ranks;
    int members = 0;
    for (size_t s = r; s < all.size(); ++s) {
      if (told[s] || !same(all[s], all[r])) continue;
      told[s] = true;
      ranks += (members++ ? ", " : "") + std::to_string(s);
    }
    text +=
        (text.empty() ? "" : "; ") + std::string(members > 1 ? "ranks " : "rank ") + ranks + ": " + describe(all[r]);
  }
  std::string whose = comm->settings.name.empty() ? "the ranks" : "the ranks of \"" + comm->settings.name + "\"";
  return LOOM_FAIL(loomInvalidUsage, COLL, "LOOM_CHECK_COLL: %s called different collectives: %s", whose.c_str(),
                   text.c_str());
}

}  // namespace loom
