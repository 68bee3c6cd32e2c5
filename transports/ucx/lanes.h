// What ucp_ep_print_info says of an endpoint's lanes, read for the one thing the ucx transport needs and UCX has
// no query for: whether the endpoint has a lane with native RMA. A lane line reads
//   "#                 lane[3]:  5:cma/memory.0 md[4]          -> md[4]/cma/sysdev[255] rma_bw#0"
// (its resource "<index>:<transport>/<device>", then where it goes, then its roles). A lane counts when it has an
// "rma" role (rma, rma_bw) and its transport is not tcp, whose puts (emulated with active messages, or tcp's own
// put with an acknowledgement) are no better than a tagged send and fail hard when the acknowledgement cannot go.
#pragma once

#include <string_view>

namespace loom {

inline bool lanesHaveNativeRma(std::string_view info) {
  while (!info.empty()) {
    const size_t end = info.find('\n');
    const std::string_view line = info.substr(0, end);
    info = end == std::string_view::npos ? std::string_view() : info.substr(end + 1);
    const size_t lane = line.find("lane[");
    const size_t label = lane == std::string_view::npos ? lane : line.find("]:", lane);
    if (label == std::string_view::npos) continue;
    const size_t resource = line.find_first_not_of(' ', label + 2);
    const size_t colon = resource == std::string_view::npos ? resource : line.find(':', resource);
    const size_t slash = colon == std::string_view::npos ? colon : line.find('/', colon);
    if (slash == std::string_view::npos) continue;
    const std::string_view transport = line.substr(colon + 1, slash - colon - 1);
    if (transport == "tcp") continue;
    for (size_t at = line.find(" rma", slash); at != std::string_view::npos; at = line.find(" rma", at + 1)) {
      const std::string_view role = line.substr(at + 1, line.find(' ', at + 1) - at - 1);
      if (role == "rma" || role.substr(0, 4) == "rma#" || role.substr(0, 6) == "rma_bw") return true;
    }
  }
  return false;
}

}  // namespace loom
