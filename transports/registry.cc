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

std::string ConnectionKey::name() const {
  char text[96];
  std::snprintf(text, sizeof(text), "loom-%016llx-%d-%d-%d", (unsigned long long)commHash, sender, receiver, channel);
  return text;
}

std::vector<Transport*> transportsInPriorityOrder() {
  // shm first: it works between processes and threads alike, on one host. loopback only when asked for (tests).
  // tcp reaches every rank.
  std::vector<Transport*> all = {shmTransport(), loopbackTransport(), tcpTransport()};
  std::string allowed = params::transports();
  if (allowed.empty()) return {shmTransport(), tcpTransport()};
  std::vector<Transport*> chosen;
  for (Transport* transport : all) {
    std::stringstream list(allowed);
    for (std::string word; std::getline(list, word, ',');)
      if (word == transport->name()) chosen.push_back(transport);
  }
  return chosen;
}

}  // namespace loom
