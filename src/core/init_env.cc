// loomCommInitFromEnv: joins the world communicator a launcher describes in the environment.
//
// Rank and size come from the first launcher found: loomrun (LOOM_RANK), torchrun (RANK), Open MPI
// (OMPI_COMM_WORLD_RANK), MPICH/Hydra (PMI_RANK), Slurm (SLURM_PROCID). The root (rank 0's rendezvous) is
// LOOM_ROOT_ADDR when set; else MASTER_ADDR:MASTER_PORT+LOOM_PORT_OFFSET (torchrun); else, for a job whose ranks
// all run on one host, 127.0.0.1 with a port derived from the job's identity; else the first Slurm node. The
// secret is LOOM_SECRET (loomrun sets a random one); without it the secret is derived from the job's identity,
// which keeps jobs apart but is no protection against a hostile process on the network: set LOOM_SECRET then.
#include <cstring>
#include <string>

#include "src/base/bootstrap.h"
#include "src/base/check.h"
#include "src/base/params.h"
#include "src/base/siphash.h"

namespace loom {
namespace {

struct WorldEnv {
  const char* launcher = nullptr;
  int rank = -1;
  int nranks = -1;
  std::string rootAddress;
  std::string jobIdentity;  // hashed into the default port and secret
};

bool parseHex(const std::string& text, uint8_t* out, size_t bytes) {
  if (text.size() != bytes * 2) return false;
  for (size_t i = 0; i < bytes; ++i) {
    unsigned value = 0;
    if (std::sscanf(text.c_str() + 2 * i, "%2x", &value) != 1) return false;
    out[i] = static_cast<uint8_t>(value);
  }
  return true;
}

uint64_t identityHash(const std::string& identity, uint8_t salt) {
  uint8_t key[kSipHashKeyBytes] = {'l', 'o', 'o', 'm', '-', 'e', 'n', 'v', salt};
  return sipHash24(key, identity.data(), identity.size());
}

// "node[03-05,7],other" -> "node03"; "a,b" -> "a".
std::string firstSlurmNode(const std::string& list) {
  size_t bracket = list.find('['), comma = list.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) return list.substr(0, comma);
  size_t end = list.find_first_of("-,]", bracket + 1);
  return list.substr(0, bracket) + list.substr(bracket + 1, end - bracket - 1);
}

std::string localRootFor(const std::string& identity) {
  // Ports 20000..32767: below Linux's ephemeral range (32768-60999 by default), where every outgoing connection
  // takes its local port and a derived port would now and then find one in use (seen: "Address already in use").
  return "127.0.0.1:" + std::to_string(20000 + identityHash(identity, 1) % 12768);
}

loomResult_t readWorld(WorldEnv* env) {
  // The launcher's own variables are read first: a malformed one is said as such, not as a rank of -1.
  std::string why;
  if (!params::check(&why)) return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommInitFromEnv: %s", why.c_str());
  if (params::rank() >= 0) {
    *env = {"loomrun", static_cast<int>(params::rank()), static_cast<int>(params::nranks()), "", "loomrun"};
  } else if (params::torchRank() >= 0) {
    *env = {"torchrun", static_cast<int>(params::torchRank()), static_cast<int>(params::torchWorldSize()), "", ""};
    if (!params::masterAddr().empty() && params::masterPort() > 0) {
      env->rootAddress = params::masterAddr() + ":" + std::to_string(params::masterPort() + params::portOffset());
      env->jobIdentity = env->rootAddress;
    }
  } else if (params::ompiRank() >= 0) {
    *env = {"Open MPI", static_cast<int>(params::ompiRank()), static_cast<int>(params::ompiSize()), "",
            "ompi/" + params::pmixNamespace()};
    if (params::ompiLocalSize() == params::ompiSize()) env->rootAddress = localRootFor(env->jobIdentity);
  } else if (params::pmiRank() >= 0) {
    *env = {"MPICH", static_cast<int>(params::pmiRank()), static_cast<int>(params::pmiSize()), "", "pmi"};
  } else if (params::slurmProcId() >= 0) {
    *env = {"Slurm", static_cast<int>(params::slurmProcId()), static_cast<int>(params::slurmNtasks()), "",
            "slurm/" + params::slurmJobId() + "." + params::slurmStepId()};
    std::string node = firstSlurmNode(params::slurmNodelist());
    if (!node.empty()) env->rootAddress = node + localRootFor(env->jobIdentity).substr(9);
  } else {
    return LOOM_FAIL(loomInvalidUsage, INIT,
                     "loomCommInitFromEnv: no launcher found (none of LOOM_RANK, RANK, OMPI_COMM_WORLD_RANK, "
                     "PMI_RANK, SLURM_PROCID is set); start the program with loomrun, torchrun, mpirun or srun");
  }
  if (!params::rootAddr().empty()) env->rootAddress = params::rootAddr();
  if (env->nranks < 1 || env->rank >= env->nranks)
    return LOOM_FAIL(loomInvalidUsage, INIT, "loomCommInitFromEnv: %s gives rank %d of %d ranks", env->launcher,
                     env->rank, env->nranks);
  if (env->rootAddress.empty())
    return LOOM_FAIL(loomInvalidUsage, INIT,
                     "loomCommInitFromEnv: started by %s across hosts, but no root address: set LOOM_ROOT_ADDR to "
                     "host:port of rank 0 (or MASTER_ADDR and MASTER_PORT)",
                     env->launcher);
  if (env->jobIdentity.empty()) env->jobIdentity = env->rootAddress;
  return loomSuccess;
}

}  // namespace
}  // namespace loom

using namespace loom;

loomResult_t loomCommInitFromEnv(loomComm_t* comm) {
  clearThreadLastError();
  if (comm == nullptr) return LOOM_FAIL(loomInvalidArgument, INIT, "comm pointer is NULL");
  WorldEnv env;
  LOOM_CHECK(readWorld(&env));
  UniqueIdInfo info;
  info.rootAddress = env.rootAddress;
  std::string secret = params::secret();
  if (!secret.empty()) {
    if (!parseHex(secret, info.secret, kSecretBytes))
      return LOOM_FAIL(loomInvalidArgument, INIT, "LOOM_SECRET must be %zu hex digits, found %zu characters",
                       2 * kSecretBytes, secret.size());
  } else {
    uint64_t low = identityHash(env.jobIdentity, 2), high = identityHash(env.jobIdentity, 3);
    std::memcpy(info.secret, &low, 8);
    std::memcpy(info.secret + 8, &high, 8);
  }
  if (env.rank == 0) LOOM_CHECK(startRoot(info));
  loomUniqueId id;
  LOOM_CHECK(packUniqueId(info, &id));
  LOOM_INFO(INIT, "init from %s: rank %d of %d, root %s", env.launcher, env.rank, env.nranks, env.rootAddress.c_str());
  return loomCommInitRank(comm, env.nranks, id, env.rank);
}
