// Value-first states (FLA's state_v_first: [.., V, K] instead of [.., K, V]) for the kernels that
// take key-first ones: a batched transpose of [D, D] float32 matrices (a multiple of 32 each way),
// by tiles of 32 x 32 through shared memory (a CTA of 256 threads a tile: reads and writes of 128
// contiguous bytes a warp). The chunked prefills run on key-first copies made by it (host:
// chunk_gated); the token loop reads and writes value-first states itself (common/recurrence.cuh).
#pragma once

#include "params.h"

// Matrix m of src (count of them, D x D, row-major) into dst transposed; the grid's x the tiles of
// a matrix, its y a stride over the matrices.
__device__ __forceinline__ void state_transpose(const float* __restrict__ src, float* __restrict__ dst, int dim,
                                                long long count) {
  __shared__ float tile[32][33];  // (a column of the tile over 32 banks)
  const int tiles = dim / 32, tr = (int)blockIdx.x / tiles, tc = (int)blockIdx.x % tiles;
  const int x = threadIdx.x & 31, y = threadIdx.x >> 5;
  const long long size = (long long)dim * dim;
  for (long long m = blockIdx.y; m < count; m += gridDim.y) {
    const float* s = src + m * size + (long long)(32 * tr) * dim + 32 * tc;
    float* d = dst + m * size + (long long)(32 * tc) * dim + 32 * tr;
#pragma unroll
    for (int r = y; r < 32; r += 8) tile[r][x] = s[(long long)r * dim + x];
    __syncthreads();
#pragma unroll
    for (int r = y; r < 32; r += 8) d[(long long)r * dim + x] = tile[x][r];
    __syncthreads();
  }
}

// The entry point (extern "C", looked up by name from the host): 256 threads a CTA.
#define CULA_STATE_TRANSPOSE_KERNEL(NAME)                                                                      \
  extern "C" __global__ void __launch_bounds__(256) NAME(const float* __restrict__ src, float* __restrict__ dst, \
                                                         int dim, long long count) {                           \
    state_transpose(src, dst, dim, count);                                                                     \
  }
