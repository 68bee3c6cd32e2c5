// Fuzz target: the checkpoint reader (parallel/model/checkpoint.h), which loom-train runs on whatever file it is
// pointed at. It must refuse bad bytes with a message, never read past them or ask for memory the file cannot back;
// what it accepts, encoded again and read back, gives the same checkpoint.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "parallel/model/checkpoint.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::parallel::Checkpoint;
  Checkpoint checkpoint;
  std::string error;
  const bool parsed = loom::parallel::parseCheckpoint(data, size, "input", &checkpoint, &error);
  loomfuzz::verdict(parsed ? "" : error);
  if (!parsed) {
    FUZZ_CHECK(!error.empty());
    return 0;
  }
  std::vector<unsigned char> bytes;
  FUZZ_CHECK(loom::parallel::encodeCheckpoint(checkpoint, &bytes, &error));
  Checkpoint again;
  FUZZ_CHECK(loom::parallel::parseCheckpoint(bytes.data(), bytes.size(), "encoded", &again, &error));
  FUZZ_CHECK(again.step == checkpoint.step && again.dataPosition == checkpoint.dataPosition);
  FUZZ_CHECK(again.config.layers == checkpoint.config.layers && again.config.experts == checkpoint.config.experts);
  FUZZ_CHECK(sameBits(again.params, checkpoint.params) && sameBits(again.m, checkpoint.m) &&
             sameBits(again.v, checkpoint.v));
  return 0;
}
