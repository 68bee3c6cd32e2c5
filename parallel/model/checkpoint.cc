// Checkpoint files (checkpoint.h). Layout of version 1, every field little-endian:
//   0   char[8]   "LOOMCKPT"
//   8   u32       version (1, or 2 for a mixture of experts)
//   12  u32       header bytes (64; 96 in version 2)
//   16  i32 x 5   layers, heads, channels, maxT, vocab
//   36  u32       element type (0: fp32)
//   40  u64       parameter count (must be the config's)
//   48  u64       optimizer step
//   56  u64       data position
//   version 2 only:
//   64  i32 x 3   experts, top-k, each expert's MLP width
//   76  f32       capacity factor
//   80  u32       drop policy (0: position, 1: probability)
//   84  f32       load-balancing loss coefficient
//   88  u64       0 (reserved)
//   64 (96)  f32 x n   parameters; then, when saved, f32 x n first moments and f32 x n second moments
//   end u64       FNV-1a 64 of every byte before it
// Whether the moments are there follows from the size, which must fit exactly 1 or 3 arrays.
#include "parallel/model/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>

namespace loom::parallel {
namespace {

constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'C', 'K', 'P', 'T'};
constexpr size_t kHeaderBytes = 64, kExpertHeaderBytes = 96;

uint64_t fnv1a(const unsigned char* data, size_t bytes, uint64_t hash = 0xcbf29ce484222325ull) {
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ data[i]) * 0x100000001b3ull;
  return hash;
}

template <typename T>
void put(std::vector<unsigned char>* out, size_t at, T value) {
  std::memcpy(out->data() + at, &value, sizeof(value));
}
template <typename T>
T get(std::span<const unsigned char> in, size_t at) {
  T value;
  std::memcpy(&value, in.data() + at, sizeof(value));
  return value;
}

bool writeAll(int fd, const unsigned char* data, size_t bytes) {
  while (bytes > 0) {
    ssize_t written = write(fd, data, bytes);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    data += written;
    bytes -= static_cast<size_t>(written);
  }
  return true;
}

std::string systemError(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

bool encodeCheckpoint(const Checkpoint& checkpoint, std::vector<unsigned char>* out, std::string* error) {
  const size_t n = GptLayout::of(checkpoint.config).total;
  if (checkpoint.params.size() != n) {
    *error =
        "checkpoint: " + std::to_string(checkpoint.params.size()) + " parameters for a model of " + std::to_string(n);
    return false;
  }
  const bool moments = !checkpoint.m.empty() || !checkpoint.v.empty();
  if (moments && (checkpoint.m.size() != n || checkpoint.v.size() != n)) {
    *error = "checkpoint: moments of " + std::to_string(checkpoint.m.size()) + " and " +
             std::to_string(checkpoint.v.size()) + " elements for " + std::to_string(n) + " parameters";
    return false;
  }
  const size_t arrays = moments ? 3 : 1;
  const GptConfig& c = checkpoint.config;
  const bool experts = c.experts > 0;
  const size_t header = experts ? kExpertHeaderBytes : kHeaderBytes;
  std::vector<unsigned char> bytes(header + arrays * n * sizeof(float) + sizeof(uint64_t));
  std::memcpy(bytes.data(), kMagic, sizeof(kMagic));
  put<uint32_t>(&bytes, 8, experts ? 2 : 1);
  put<uint32_t>(&bytes, 12, static_cast<uint32_t>(header));
  put<int32_t>(&bytes, 16, c.layers);
  put<int32_t>(&bytes, 20, c.heads);
  put<int32_t>(&bytes, 24, c.channels);
  put<int32_t>(&bytes, 28, c.maxT);
  put<int32_t>(&bytes, 32, c.vocab);
  put<uint32_t>(&bytes, 36, 0);
  put<uint64_t>(&bytes, 40, n);
  put<uint64_t>(&bytes, 48, checkpoint.step);
  put<uint64_t>(&bytes, 56, checkpoint.dataPosition);
  if (experts) {
    put<int32_t>(&bytes, 64, c.experts);
    put<int32_t>(&bytes, 68, c.topk);
    put<int32_t>(&bytes, 72, c.hidden());
    put<float>(&bytes, 76, c.capacityFactor);
    put<uint32_t>(&bytes, 80, c.dropPolicy == DropPolicy::kPosition ? 0 : 1);
    put<float>(&bytes, 84, c.auxLossCoefficient);
    put<uint64_t>(&bytes, 88, 0);
  }
  size_t at = header;
  for (const std::vector<float>* array : {&checkpoint.params, &checkpoint.m, &checkpoint.v}) {
    if (array->empty()) continue;
    std::memcpy(bytes.data() + at, array->data(), n * sizeof(float));
    at += n * sizeof(float);
  }
  put<uint64_t>(&bytes, at, fnv1a(bytes.data(), at));
  *out = std::move(bytes);
  return true;
}

bool writeCheckpoint(const std::string& path, const Checkpoint& checkpoint, std::string* error) {
  std::vector<unsigned char> bytes;
  if (!encodeCheckpoint(checkpoint, &bytes, error)) return false;
  const std::string temporary = path + ".tmp";
  int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = systemError("checkpoint: cannot create " + temporary);
    return false;
  }
  const bool written = writeAll(fd, bytes.data(), bytes.size()) && fsync(fd) == 0;
  const int savedErrno = errno;
  close(fd);
  if (!written || rename(temporary.c_str(), path.c_str()) != 0) {
    errno = written ? errno : savedErrno;
    *error = systemError("checkpoint: cannot write " + path);
    unlink(temporary.c_str());
    return false;
  }
  // The rename itself, durable: fsync the directory.
  const size_t slash = path.rfind('/');
  const std::string directory = slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
  int dirFd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd >= 0) {
    fsync(dirFd);
    close(dirFd);
  }
  return true;
}

bool readCheckpoint(const std::string& path, Checkpoint* checkpoint, std::string* error) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = systemError("checkpoint: cannot open " + path);
    return false;
  }
  std::vector<unsigned char> bytes;
  unsigned char chunk[1 << 16];
  for (;;) {
    ssize_t got = read(fd, chunk, sizeof(chunk));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      *error = systemError("checkpoint: cannot read " + path);
      close(fd);
      return false;
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + got);
  }
  close(fd);
  return parseCheckpoint(bytes.data(), bytes.size(), path, checkpoint, error);
}

bool parseCheckpoint(const unsigned char* data, size_t size, const std::string& path, Checkpoint* checkpoint,
                     std::string* error) {
  const std::span<const unsigned char> bytes(data, size);
  if (bytes.size() < kHeaderBytes + sizeof(uint64_t) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    *error = "checkpoint: " + path + " is not a loom checkpoint (no LOOMCKPT header)";
    return false;
  }
  const uint32_t version = get<uint32_t>(bytes, 8);
  const size_t header = version == 2 ? kExpertHeaderBytes : kHeaderBytes;
  if (version < 1 || version > kCheckpointVersion || get<uint32_t>(bytes, 12) != header ||
      bytes.size() < header + sizeof(uint64_t)) {
    *error = "checkpoint: " + path + " is version " + std::to_string(version) + "; this build reads versions 1 to " +
             std::to_string(kCheckpointVersion);
    return false;
  }
  Checkpoint result;
  result.config = GptConfig{get<int32_t>(bytes, 16), get<int32_t>(bytes, 20), get<int32_t>(bytes, 24),
                            get<int32_t>(bytes, 28), get<int32_t>(bytes, 32)};
  if (version == 2) {
    result.config.experts = get<int32_t>(bytes, 64);
    result.config.topk = get<int32_t>(bytes, 68);
    result.config.ffn = get<int32_t>(bytes, 72);
    result.config.capacityFactor = get<float>(bytes, 76);
    result.config.dropPolicy = get<uint32_t>(bytes, 80) == 0 ? DropPolicy::kPosition : DropPolicy::kProbability;
    result.config.auxLossCoefficient = get<float>(bytes, 84);
    if (result.config.experts < 1) {
      *error = "checkpoint: " + path + " is version 2 without experts";
      return false;
    }
  }
  const std::string problem = result.config.check();
  if (!problem.empty()) {
    *error = "checkpoint: " + path + " holds an invalid model: " + problem;
    return false;
  }
  // The model's largest matrices (the embeddings, every block's MLP of every expert) must fit in the file before its
  // layout is computed: a corrupted size could otherwise ask for more memory than any machine has.
  const size_t body = bytes.size() - header - sizeof(uint64_t);
  const GptConfig& c = result.config;
  const double floats = static_cast<double>(body / sizeof(float)), C = c.channels;
  if (C * c.vocab > floats || C * c.maxT > floats ||
      static_cast<double>(c.layers) * std::max(c.experts, 1) * C * c.hidden() > floats) {
    *error = "checkpoint: " + path + " is " + std::to_string(bytes.size()) + " bytes, too few for its model (" +
             std::to_string(c.layers) + " layers of " + std::to_string(c.channels) + " channels, vocabulary " +
             std::to_string(c.vocab) + "): truncated or corrupted";
    return false;
  }
  const uint64_t n = get<uint64_t>(bytes, 40);
  const size_t modelParams = GptLayout::of(result.config).total;
  if (get<uint32_t>(bytes, 36) != 0 || n != modelParams) {
    *error = "checkpoint: " + path + " holds " + std::to_string(n) + " parameters of type " +
             std::to_string(get<uint32_t>(bytes, 36)) + "; its model has " + std::to_string(modelParams) + " fp32 ones";
    return false;
  }
  if (body != n * sizeof(float) && body != 3 * n * sizeof(float)) {
    *error = "checkpoint: " + path + " is " + std::to_string(bytes.size()) + " bytes, which fits neither " +
             "parameters alone nor parameters with moments (truncated?)";
    return false;
  }
  const size_t checked = bytes.size() - sizeof(uint64_t);
  if (get<uint64_t>(bytes, checked) != fnv1a(bytes.data(), checked)) {
    *error = "checkpoint: " + path + " fails its checksum (corrupted)";
    return false;
  }
  result.step = get<uint64_t>(bytes, 48);
  result.dataPosition = get<uint64_t>(bytes, 56);
  // memcpy, not a cast: the bytes need not be aligned for floats.
  size_t at = header;
  for (std::vector<float>* array : {&result.params, &result.m, &result.v}) {
    if (at == header + body) break;
    array->resize(n);
    std::memcpy(array->data(), bytes.data() + at, n * sizeof(float));
    at += n * sizeof(float);
  }
  *checkpoint = std::move(result);
  return true;
}

}  // namespace loom::parallel
