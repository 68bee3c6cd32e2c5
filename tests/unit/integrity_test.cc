// CRC32C (src/base/integrity.h): the published check values, the hardware path against the table at every length
// and alignment around its stream size, continuation, and that a flipped bit always changes the checksum.
#include "src/base/integrity.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace loom {
namespace {

TEST(Crc32c, PublishedCheckValues) {
  // The catalogue's check value, and RFC 3720's (iSCSI) test patterns of 32 bytes.
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xe3069283u);
  EXPECT_EQ(crc32cPortable(digits.data(), digits.size()), 0xe3069283u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xff), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62a8ab43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46dd794eu);
  EXPECT_EQ(crc32c(down.data(), 32), 0x113fdb5cu);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, HardwareAgreesWithTheTableAtEveryLengthAndAlignment) {
  std::mt19937_64 random(2026);
  std::vector<unsigned char> data(3 * 1024 * 4 + 64);
  for (auto& byte : data) byte = static_cast<unsigned char>(random());
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t bytes = 0; bytes + offset <= data.size(); bytes += bytes < 64 ? 1 : 61) {
      ASSERT_EQ(crc32c(data.data() + offset, bytes), crc32cPortable(data.data() + offset, bytes))
          << bytes << " bytes at offset " << offset << (crc32cInHardware() ? " (hardware)" : " (table)");
    }
  }
  // Around the crc32 path's blocks of three streams (3 x 1024 bytes) and the foldings' windows (256 and 128 bytes,
  // two at least), each path against the table.
  for (size_t bytes : {255, 256, 511, 512, 513, 767, 768, 769, 1000, 3071, 3072, 3073, 6143, 6144, 6145, 12288}) {
    EXPECT_EQ(crc32c(data.data() + 1, bytes), crc32cPortable(data.data() + 1, bytes)) << bytes;
    EXPECT_EQ(crc32cWithoutFolding(data.data() + 3, bytes), crc32cPortable(data.data() + 3, bytes)) << bytes;
  }
  for (size_t bytes : {255, 256, 257, 383, 384, 385, 1000, 3199, 3200, 3201, 3455, 6400, 6401, 12291})
    EXPECT_EQ(crc32cFolding16(data.data() + 5, bytes, 0x9abcdef0u), crc32cPortable(data.data() + 5, bytes, 0x9abcdef0u))
        << bytes;
  std::vector<unsigned char> slot(524288);
  for (auto& byte : slot) byte = static_cast<unsigned char>(random());
  for (size_t bytes : {size_t{131068}, size_t{131072}, size_t{524284}, slot.size()})
    EXPECT_EQ(crc32c(slot.data(), bytes, 0x12345678u), crc32cPortable(slot.data(), bytes, 0x12345678u)) << bytes;
  for (size_t bytes : {size_t{131068}, slot.size()})
    EXPECT_EQ(crc32cFolding16(slot.data() + 1, bytes - 1), crc32cPortable(slot.data() + 1, bytes - 1)) << bytes;
  std::printf("crc32c here: %s\n", crc32cMethod());
}

TEST(Crc32c, ContinuesFromAPreviousValue) {
  std::mt19937_64 random(7);
  std::vector<unsigned char> data(200000);
  for (auto& byte : data) byte = static_cast<unsigned char>(random());
  for (size_t split : {size_t{0}, size_t{1}, size_t{5000}, size_t{131072}, data.size()}) {
    const uint32_t first = crc32c(data.data(), split);
    EXPECT_EQ(crc32c(data.data() + split, data.size() - split, first), crc32c(data.data(), data.size())) << split;
  }
}

TEST(Crc32c, EveryFlippedBitOfASliceChangesIt) {
  std::mt19937_64 random(11);
  std::vector<unsigned char> data(131072 - kChecksumBytes);
  for (auto& byte : data) byte = static_cast<unsigned char>(random());
  const uint32_t clean = crc32c(data.data(), data.size());
  for (size_t bit = 0; bit < data.size() * 8; bit += 997) {
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    ASSERT_NE(crc32c(data.data(), data.size()), clean) << "bit " << bit;
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
  EXPECT_EQ(crc32c(data.data(), data.size()), clean);
}

}  // namespace
}  // namespace loom
