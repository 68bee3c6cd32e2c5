// Fuzz target: the topology XML reader (LOOM_TOPO_FILE, and the local views ranks exchange at init). Whatever it
// accepts, writing it out and reading that back gives the same text (xml.h's promise).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "src/topology/xml.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::Topology topo;
  std::string error;
  const bool parsed =
      loom::parseTopologyXml(std::string_view(reinterpret_cast<const char*>(data), size), &topo, &error);
  loomfuzz::verdict(parsed ? "" : error);
  if (!parsed) {
    FUZZ_CHECK(!error.empty());
    return 0;
  }
  const std::string written = loom::topologyToXml(topo);
  loom::Topology again;
  FUZZ_CHECK(loom::parseTopologyXml(written, &again, &error));
  FUZZ_CHECK(loom::topologyToXml(again) == written);
  return 0;
}
