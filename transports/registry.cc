// The transport registry: the only file that names the concrete transports, in priority order.
// LOOM_TRANSPORTS (a comma list) keeps only the named ones, in this order.
#include <sstream>
#include <string>
#include <vector>

#include "src/base/params.h"
#include "transports/transport.h"

namespace loom {

Transport* shmTransport();
Transport* loopbackTransport();
Transport* tcpTransport();
#ifdef LOOM_HAVE_UCX
Transport* ucxTransport();
#endif
#ifdef LOOM_HAVE_CUDA
Transport* cudaIpcTransport();
#endif
#ifdef LOOM_HAVE_IBVERBS
Transport* ibTransport();
bool rdmaPortActive();
#endif

std::string ConnectionKey::name() const {
  char text[96];
  std::snprintf(text, sizeof(text), "loom-%016llx-%d-%d-%d", (unsigned long long)commHash, sender, receiver, channel);
  return text;
}

Transport* deviceTransport() {
#ifdef LOOM_HAVE_CUDA
  return cudaIpcTransport();
#else
  return nullptr;
#endif
}

namespace {

std::vector<Transport*> allTransports() {
  return {shmTransport(), loopbackTransport(),
#ifdef LOOM_HAVE_IBVERBS
          ibTransport(),
#endif
#ifdef LOOM_HAVE_UCX
          ucxTransport(),
#endif
          tcpTransport()};
}

}  // namespace

// The transport between hosts when LOOM_NET is empty: ib where this machine has an active RDMA port, else tcp.
// ucx, between the two in order of preference, is taken only when named: where RDMA is there ib comes first, and
// over plain Ethernet it brings nothing tcp lacks. Every rank decides alone; init checks that they agree.
static Transport* automaticNet() {
#ifdef LOOM_HAVE_IBVERBS
  static const bool rdma = rdmaPortActive();
  if (rdma) return ibTransport();
#endif
  return tcpTransport();
}

bool netChoiceError(std::string* why) {
  std::string net = params::net();
  if (net.empty() || net == "tcp") return false;
  if (net != "ucx" && net != "ib") {
    *why = "LOOM_NET=\"" + net + "\": expected ib, ucx or tcp";
    return true;
  }
  std::string reason;
  if (transportAvailable(net, &reason)) return false;
  *why = "LOOM_NET=" + net + ": " + reason;
  return true;
}

bool transportAvailable(const std::string& name, std::string* why) {
  for (Transport* transport : allTransports()) {
    if (name != transport->name()) continue;
    PeerInfo anyone{0, 0, 0, 0};
    return transport->canConnect(anyone, anyone, why);
  }
  *why = "not built into this library";
  return false;
}

std::vector<Transport*> transportsInPriorityOrder() {
  // shm first: it works between processes and threads alike, on one host. loopback only when asked for (tests).
  // tcp reaches every rank.
  std::vector<Transport*> all = allTransports();
  std::string allowed = params::transports();
  if (allowed.empty()) {
    // shm within a host; between hosts LOOM_NET's (checked at init, netChoiceError), else the automatic one.
    std::string net = params::net();
    for (Transport* transport : all)
      if (net == transport->name() && transport != shmTransport() && transport != loopbackTransport())
        return {shmTransport(), transport};
    return {shmTransport(), automaticNet()};
  }
  std::vector<Transport*> chosen;
  for (Transport* transport : all) {
    std::stringstream list(allowed);
    for (std::string word; std::getline(list, word, ',');)
      if (word == transport->name()) chosen.push_back(transport);
  }
  return chosen;
}

}  // namespace loom
