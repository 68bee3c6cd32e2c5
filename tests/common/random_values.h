// Seeded normal values for the kernel tests (tests/parallel, tests/gpu): the same inputs on every run.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace loomtest {

inline std::vector<float> randomValues(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& value : values) value = normal(generator);
  return values;
}

}  // namespace loomtest
