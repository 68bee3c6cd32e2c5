// The transport registry: the only file that names the concrete transports, in priority order.
// LOOM_TRANSPORTS (a comma list) keeps only the named ones, in this order.
#include <sstream>
#include <string>
#include <vector>

#include "src/core/params.h"
#include "transports/transport.h"

namespace loom {

Transport* shmTransport();
Transport* loopbackTransport();
Transport* tcpTransport();
#ifdef LOOM_HAVE_UCX
Transport* ucxTransport();
#endif

std::string ConnectionKey::name() const {
  char text[96];
  std::snprintf(text, sizeof(text), "loom-%016llx-%d-%d-%d", (unsigned long long)commHash, sender, receiver, channel);
  return text;
}

namespace {

std::vector<Transport*> allTransports() {
  return {shmTransport(), loopbackTransport(),
#ifdef LOOM_HAVE_UCX
          ucxTransport(),
#endif
          tcpTransport()};
}

}  // namespace

bool netChoiceError(std::string* why) {
  std::string net = params::net();
  if (net.empty() || net == "tcp") return false;
  if (net != "ucx") {
    *why = "LOOM_NET=\"" + net + "\": expected tcp or ucx";
    return true;
  }
  std::string reason;
  if (transportAvailable(net, &reason)) return false;
  *why = "LOOM_NET=ucx: " + reason;
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
    // shm within a host; between hosts LOOM_NET's (checked at init, netChoiceError), else tcp.
    std::string net = params::net();
    for (Transport* transport : all)
      if (net == transport->name() && transport != shmTransport() && transport != loopbackTransport())
        return {shmTransport(), transport};
    return {shmTransport(), tcpTransport()};
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
