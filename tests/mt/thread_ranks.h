// Runs a function as N ranks, one thread each, over one communicator made with loomGetUniqueId and
// loomCommInitRank: the in-process harness of the mt suite.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "loom/loom.h"

namespace loomtest {

// Calls body(comm, rank) on nranks threads; returns the communicators' init results (all loomSuccess normally).
// Each thread destroys its communicator after body returns. `config` may be null.
void runRanks(int nranks, const std::function<void(loomComm_t comm, int rank)>& body, loomConfig_t* config = nullptr);

// Sets an environment variable for the lifetime of the object (tests choose transports this way).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();

 private:
  std::string name_;
  std::string saved_;
  bool hadValue_;
};

}  // namespace loomtest
