// How loom_torch's communicators are joined (loom_torch.cc describes the backend): a unique id drawn by one rank
// and set in the group's store, read by the others, then each rank's join.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "plugins/torch/helpers.h"

namespace loom_torch {

// Draws a unique id and sets it under `key` in `store`.
loomUniqueId publishId(c10d::Store& store, const std::string& key);

// The unique id under `key` in `store`, once it is there. Polls rather than waits: a TCPStore holds its lock
// through a waiting get, which would keep this process's other threads from setting their keys.
loomUniqueId readId(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout,
                    const std::atomic<bool>* aborted = nullptr);

// loom_torch.set_deterministic: 1 or 0 for the groups made after it (loomConfig_t.deterministic), or
// LOOM_CONFIG_UNDEF_INT (never called: LOOM_DETERMINISTIC decides).
void setDeterministic(int value);
int deterministicOption();

// Joins communicator `id` as `rank` of `size`, with `timeout` as its deadline.
loomComm_t join(const loomUniqueId& id, int rank, int size, std::chrono::milliseconds timeout,
                const std::string& name);

// A receiving link's communicator waits for a message's header for as long as a receive may want one (about 24
// days, its own deadline): the group's timeout bounds each receive instead (ProcessGroupLoom::reap).
constexpr int kListenTimeoutMs = INT32_MAX;

// Joins a receiving link (rank 1 of 2) whose calls wait up to kListenTimeoutMs; the join itself is bounded by
// `timeout` (its sender joins as it publishes the id) and ends early when `stop` is set.
loomComm_t joinListening(const loomUniqueId& id, std::chrono::milliseconds timeout, const std::atomic<bool>& stop);

}  // namespace loom_torch
