// The link figures the presets, discovery and fusion assume, in one place so that docs/TOPOLOGY.md can cite them.
// Bandwidths are GB/s (1e9 bytes/s) in each direction, nominal signalling rates after line encoding; latencies
// are one-way microseconds per link, chosen so that the sums along typical routes land where published
// end-to-end measurements do (a GPU -> NVSwitch -> GPU hop pair under 1 us, a cross-node GPU -> NIC -> switch
// -> NIC -> GPU route 2-5 us). They are not measurements of this machine.
#pragma once

namespace loom::figures {

// PCIe x16, per direction, after 128b/130b encoding (PCI-SIG base specifications 3.0, 4.0, 5.0).
constexpr double kPcieGen3x16 = 15.75;
constexpr double kPcieGen4x16 = 31.5;
constexpr double kPcieGen5x16 = 63.0;
constexpr double kPcieLatency = 0.15;  // one switch or root-port hop

// NVLink 4 (H100): 18 links of 25 GB/s per direction, 450 GB/s per GPU (NVIDIA H100 Tensor Core GPU whitepaper).
constexpr double kNvLink4Link = 25.0;
constexpr double kNvLinkLatency = 0.35;  // GPU to NVSwitch

// CPU sockets: the inter-socket fabric (UPI/xGMI) and copies through shared memory between two processes.
constexpr double kSmpSapphireRapids = 96.0;  // 4 UPI 2.0 links at 16 GT/s, about 24 GB/s of data each
constexpr double kSmpIceLake = 62.0;         // 3 UPI links at 11.2 GT/s
constexpr double kSmpDefault = 40.0;         // discovery: the inter-socket rate is not visible through hwloc
constexpr double kSmpLatency = 0.1;          // socket to host, so 0.2 us across sockets
constexpr double kSharedMemoryCopy = 20.0;   // one process copying through shared memory on one NUMA node
constexpr double kSharedMemoryLatency = 0.5;

// Networks. A NIC's link to its first switch carries the NIC's own processing; switch-to-switch hops are cheaper.
constexpr double kNdr400 = 50.0;             // 400 Gb/s InfiniBand NDR / ConnectX-7
constexpr double kHdr200 = 25.0;             // 200 Gb/s
constexpr double kEdr100 = 12.5;             // 100 Gb/s
constexpr double kNicLatencyIb = 1.0;        // verbs NIC to switch
constexpr double kNicLatencyEthernet = 5.0;  // kernel TCP stack to switch
constexpr double kSwitchLatency = 0.5;       // one switch to switch hop
// Hosts with no NIC in their view are joined by a plain link of this speed (10 GbE through the kernel).
constexpr double kPlainNetwork = 1.25;
constexpr double kPlainNetworkLatency = 20.0;
// A NIC whose speed is unknown (virtual NICs report none) is assumed to run at this many Gb/s.
constexpr double kUnknownNicGbps = 10.0;

// TPU-style tori: ICI links (TPU v4 class) and the host's PCIe link to each chip.
constexpr double kTorusLink = 50.0;
constexpr double kTorusLatency = 0.5;
constexpr int kChipsPerTorusHost = 4;

// Ascend-style super node: HCCS, 56 GB/s per link (Atlas 800T A2: 8 NPUs in a full mesh, 392 GB/s per NPU over
// 7 links).
constexpr double kHccsLink = 56.0;
constexpr double kHccsLatency = 0.6;
constexpr int kNpusPerMeshHost = 8;

}  // namespace loom::figures
