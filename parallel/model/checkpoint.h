// The reference GPT's checkpoint file, version 1, or 2 for a mixture of experts (docs/PARALLEL.md, "Checkpoints"): a
// fixed header (magic, version, config, counts), the parameters in the model's layout, optionally AdamW's two moments,
// and a checksum of all of it, little-endian fp32 throughout. Written atomically: a temporary file beside the target,
// fsync'd, then renamed over it, so a reader never sees half a checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/model/gpt.h"

namespace loom::parallel {

constexpr uint32_t kCheckpointVersion = 2;  // the newest this build reads and writes

struct Checkpoint {
  GptConfig config;
  uint64_t step = 0;          // optimizer steps taken
  uint64_t dataPosition = 0;  // where the trainer's data source resumes
  std::vector<float> params;  // GptLayout order
  std::vector<float> m, v;    // AdamW's moments, same order (both empty: none saved)
};

// Writes `checkpoint` to `path` atomically; on failure returns false with *error saying why (the old file, if
// any, stays as it was).
bool writeCheckpoint(const std::string& path, const Checkpoint& checkpoint, std::string* error);
// Reads `path`; on failure (no such file, another format or version, a wrong size, a bad checksum) returns false
// with *error saying what was wrong.
bool readCheckpoint(const std::string& path, Checkpoint* checkpoint, std::string* error);

// The file's bytes, without the file: what writeCheckpoint writes and readCheckpoint reads. parseCheckpoint checks
// every field and size against the `size` bytes at `data` before it reads them (tests/fuzz/checkpoint_fuzz.cc);
// `name` starts its errors.
bool encodeCheckpoint(const Checkpoint& checkpoint, std::vector<unsigned char>* out, std::string* error);
bool parseCheckpoint(const unsigned char* data, size_t size, const std::string& name, Checkpoint* checkpoint,
                     std::string* error);

}  // namespace loom::parallel
