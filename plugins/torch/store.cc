// Joining loom_torch's communicators through the store (store.h).
#include "plugins/torch/store.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace loom_torch {

loomUniqueId publishId(c10d::Store& store, const std::string& key) {
  loomUniqueId id;
  check(loomGetUniqueId(&id), nullptr, "loomGetUniqueId");
  const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
  store.set(key, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
  return id;
}

loomUniqueId readId(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout,
                    const std::atomic<bool>* aborted) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!store.check({key})) {
    if (aborted != nullptr && aborted->load()) fail("the group was closed or aborted while waiting for " + key);
    if (timeout.count() > 0 && std::chrono::steady_clock::now() > deadline)
      fail("no loom unique id appeared under " + key + " in the store within the group's timeout");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::vector<uint8_t> bytes = store.get(key);
  loomUniqueId id;
  if (bytes.size() != sizeof(id)) fail("the store holds no loom unique id under " + key);
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

namespace {
std::atomic<int> deterministic{LOOM_CONFIG_UNDEF_INT};
}  // namespace

void setDeterministic(int value) { deterministic.store(value); }
int deterministicOption() { return deterministic.load(); }

loomComm_t join(const loomUniqueId& id, int rank, int size, std::chrono::milliseconds timeout,
                const std::string& name) {
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.deterministic = deterministic.load();
  config.timeoutMs = static_cast<int>(std::min<int64_t>(timeout.count(), INT32_MAX));
  config.commName = name.c_str();
  loomComm_t comm = nullptr;
  check(loomCommInitRankConfig(&comm, size, id, rank, &config), nullptr, "loomCommInitRankConfig");
  return comm;
}

loomComm_t joinListening(const loomUniqueId& id, std::chrono::milliseconds timeout, const std::atomic<bool>& stop) {
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.timeoutMs = kListenTimeoutMs;
  config.blocking = 0;
  config.commName = "torch p2p";
  config.deterministic = deterministic.load();  // as the sending end's join: the two must agree
  loomComm_t comm = nullptr;
  const loomResult_t started = loomCommInitRankConfig(&comm, 2, id, 1, &config);
  if (started != loomInProgress) check(started, nullptr, "loomCommInitRankConfig");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    loomResult_t state = loomSuccess;
    loomCommGetAsyncError(comm, &state);
    if (state == loomSuccess) return comm;
    if (state != loomInProgress) {
      const std::string why = loomGetLastError(comm);
      loomCommAbort(comm);
      fail(std::string("joining a receiving link failed: ") + loomGetErrorString(state) + ": " + why);
    }
    if (stop.load() || std::chrono::steady_clock::now() > deadline) {
      loomCommAbort(comm);
      fail(stop.load() ? "the group was closed while a receiving link joined"
                       : "a receiving link's sender did not join within the group's timeout");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace loom_torch
