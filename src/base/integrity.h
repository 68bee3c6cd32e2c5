// Integrity of the data in flight (LOOM_CHECKSUM, docs/RELIABILITY.md): the checksum every message carries, and the
// test hook that corrupts one message on its way (LOOM_FAULT_CORRUPT).
//
// The checksum is CRC32C (the Castagnoli polynomial, as iSCSI, ext4 and SCTP use it): it detects every flipped bit
// and every burst of up to 32 bits, and any other error but about one in 2^32. x86-64 processors with SSE4.2
// compute it in hardware (the crc32 instruction), three streams at once so that the instruction's latency is
// hidden; with carry-less multiplication they fold longer runs instead: 256 bytes a step with AVX-512 and
// VPCLMULQDQ (from 512 bytes), else 128 bytes a step with PCLMULQDQ (from 256 bytes), which on AMD Zen 2 (crc32
// one every three cycles) is 1.6 times crc32 alone; elsewhere a table does it, 8 bytes a step. All give the same
// values. (Running crc32 streams beside the folding, in the same loop, was slower on Zen 2: 9 against 11 GB/s.)
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom {

// The CRC32C of `bytes` bytes at `data` (crc32c("123456789") == 0xe3069283). `previous`, the CRC32C of the bytes
// before them, continues it: crc32c(b, n, crc32c(a, m)) is the CRC32C of a's m bytes followed by b's n.
uint32_t crc32c(const void* data, size_t bytes, uint32_t previous = 0);
// The same by the table alone (for tests: the hardware path must agree with it).
uint32_t crc32cPortable(const void* data, size_t bytes, uint32_t previous = 0);
// The same without the carry-less folding (the crc32 instruction alone, else the table): for tests and benchmarks.
uint32_t crc32cWithoutFolding(const void* data, size_t bytes, uint32_t previous = 0);
// The same by 16-byte folding with PCLMULQDQ where the processor has it (the path without AVX-512), else as
// crc32cWithoutFolding: for tests, so that a machine with AVX-512 checks that path too.
uint32_t crc32cFolding16(const void* data, size_t bytes, uint32_t previous = 0);
// Whether crc32c() uses the processor's instructions here, and which way it goes, in words ("PCLMULQDQ folding,
// crc32 below 256 bytes").
bool crc32cInHardware();
const char* crc32cMethod();

// The bytes a message's checksum takes after its payload, in the FIFO slot and on every wire.
constexpr size_t kChecksumBytes = 4;

// Where the fault hook stands (LOOM_FAULT_CORRUPT=N[+][:BIT]): this process counts the messages that go through
// corruptInTransit (from 1, over all its connections) and flips one bit of the N-th (with "+", of the N-th and
// every later one): bit BIT of the message, counted from its first byte (modulo its bits), by default the middle
// one. Unset or malformed (a WARN says so), it does nothing. Returns whether it flipped a bit of this message.
bool corruptInTransit(void* data, size_t bytes);
// Whether the hook may still flip a bit (LOOM_FAULT_CORRUPT is set and well formed): callers that would pass every
// message through corruptInTransit only for the hook read this once per call instead.
bool corruptionArmed();
// Reads LOOM_FAULT_CORRUPT again and counts from 1 again: for tests that set it in a running process.
void rearmCorruption();

}  // namespace loom
