// loom's topology XML: the file format of LOOM_TOPO_FILE and LOOM_TOPO_DUMP_FILE, and the wire format in which
// ranks exchange their local views. docs/TOPOLOGY.md documents the dialect:
//
//   <topology version="1" source="...">
//     <node name="host0" kind="host" host="0" hostname="a1"/>
//     <node name="host0/gpu0" kind="gpu" host="0" index="0" busid="0000:1b:00.0"/>
//     <link kind="pcie" from="host0/pci0" to="host0/gpu0" bw="63" lat="0.15"/>
//     <rank id="0" node="host0/gpu0"/>
//   </topology>
//
// The reader takes the subset the writer emits (elements, attributes, comments, an <?xml?> declaration, the five
// predefined entities and character references), written without any XML library; it rejects anything else with
// the line where it went wrong. Writing then reading gives an equal topology, and reading then writing a file
// loom wrote gives the same bytes.
#pragma once

#include <string>
#include <string_view>

#include "src/topology/topology.h"

namespace loom {

std::string topologyToXml(const Topology& topo);
// Replaces *topo with the topology in `text`; on malformed XML or an invalid graph returns false with *error
// ("line 12: ...") and leaves *topo alone.
bool parseTopologyXml(std::string_view text, Topology* topo, std::string* error);

// The same for files; errors start with the path.
bool readTopologyFile(const std::string& path, Topology* topo, std::string* error);
// Writes through a temporary file renamed into place, so readers never see half a file.
bool writeTopologyFile(const std::string& path, const Topology& topo, std::string* error);

}  // namespace loom
