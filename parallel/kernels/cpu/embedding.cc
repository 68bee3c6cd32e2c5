// Token and position embedding (kernels.h).
#include "parallel/kernels/cpu/fast_math.h"
#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel::cpu {

LOOM_CPU_DISPATCH void embeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                                        int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      float* row = out + (static_cast<size_t>(b) * T + t) * C;
      const float* position = wpe + static_cast<size_t>(t) * C;
      const int32_t id = tokens[b * T + t];
      if (id < 0) {
        for (int c = 0; c < C; ++c) row[c] = position[c];
        continue;
      }
      const float* token = wte + static_cast<size_t>(id) * C;
      for (int c = 0; c < C; ++c) row[c] = token[c] + position[c];
    }
}

// V sizes the CUDA kernel's fp32 table; the CPU adds in fp32 directly.
LOOM_CPU_DISPATCH void embeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                                         int T, int C, int /*V*/) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const float* row = dout + (static_cast<size_t>(b) * T + t) * C;
      float* position = dwpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) position[c] += row[c];
      const int32_t id = tokens[b * T + t];
      if (id < 0) continue;
      float* token = dwte + static_cast<size_t>(id) * C;
      for (int c = 0; c < C; ++c) token[c] += row[c];
    }
}

}  // namespace loom::parallel::cpu
