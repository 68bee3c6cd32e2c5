// Fuzz target: plan files (algorithms/plan_text.h, read by loom-sim --plan). Whatever the reader accepts is written
// and read back to the same text, and small accepted plans go through the verifier, which must answer (proven or
// a reason) without crashing whatever the plan does.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "algorithms/plan_text.h"
#include "algorithms/verifier.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::PlanFile file;
  std::string error;
  const bool parsed = loom::parsePlanFile(std::string_view(reinterpret_cast<const char*>(data), size), &file, &error);
  loomfuzz::verdict(parsed ? "" : error);
  if (!parsed) {
    FUZZ_CHECK(!error.empty());
    return 0;
  }
  FUZZ_CHECK(file.plans.size() == static_cast<size_t>(file.nranks));
  const std::string written = loom::formatPlanFile(file);
  loom::PlanFile again;
  FUZZ_CHECK(loom::parsePlanFile(written, &again, &error));
  FUZZ_CHECK(loom::formatPlanFile(again) == written);

  size_t steps = 0;
  for (const loom::RankPlan& plan : file.plans)
    for (const loom::Lane& lane : plan.lanes) steps += lane.steps.size();
  if (file.nranks <= 16 && steps <= 256 && file.count <= 4096) {
    std::vector<loom::CollArgs> perRank;
    for (int r = 0; r < file.nranks; ++r) perRank.push_back(file.argsFor(r));
    for (int fifoDepth : {0, 2}) {
      loom::VerifyOptions options;
      options.fifoDepth = fifoDepth;
      const std::string verdict = loom::verifyPlan(
          perRank, [&file](const loom::CollArgs& args) { return file.plans[args.rank]; }, options);
      loomfuzz::verdict(verdict.empty() ? "proven" : verdict);
    }
  }
  return 0;
}
