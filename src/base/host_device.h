// LOOM_HOST_DEVICE marks code that the host and CUDA executors share: __host__ __device__ when nvcc compiles it,
// nothing for the host compiler. Such code uses no standard library beyond fixed-width integers.
#pragma once

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif
