// copyOut: every length and misalignment, plain and streaming, copies exactly and writes nothing outside.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "src/exec/copy.h"

namespace loom {
namespace {

TEST(CopyOut, ExactForEveryLengthAndAlignment) {
  const size_t kMax = 3 * 4096 + 200;
  std::vector<uint8_t> source(kMax + 64), target(kMax + 128);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 7 + 1);
  for (bool streaming : {false, true}) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{8191},
                         kMax}) {
      for (size_t srcShift : {0, 1, 13}) {
        for (size_t dstShift : {0, 3, 16, 63}) {
          std::fill(target.begin(), target.end(), 0xEE);
          copyOut(target.data() + dstShift, source.data() + srcShift, bytes, streaming);
          for (size_t i = 0; i < target.size(); ++i) {
            bool inside = i >= dstShift && i < dstShift + bytes;
            uint8_t want = inside ? source[i - dstShift + srcShift] : 0xEE;
            ASSERT_EQ(target[i], want) << "byte " << i << " of a " << bytes << "-byte copy, streaming " << streaming
                                       << ", shifts " << srcShift << "/" << dstShift;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom
