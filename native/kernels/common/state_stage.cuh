// The chunked prefills' key-first copy of the states (CulaStateStage, params.h): the chunked kernels
// take [N, HV, D, D] key-first states, so value-first states (FLA's state_v_first) and state pools
// read at slots (SGLang's initial_state_indices) are copied into the workspace before them (gather)
// and the final states out of it after them (scatter). [D, D] float32 matrices (D = 64 or 128) by
// blocks of 64 x 64 through shared memory, transposed or not: a CTA of 256 threads a block, each
// thread with 16 loads in flight (a warp reads and writes 128 contiguous bytes at a time). The token
// loop reads and writes value-first states and pools itself (common/recurrence.cuh).
#pragma once

#include "common/ptx.cuh"
#include "common/seqs.cuh"
#include "params.h"

// The grid's x: the 64 x 64 blocks of a matrix; its y: a stride over the matrices m = n * HV + hv.
// Thread (x, y) moves rows y + 8 i (i < 8) of the block, columns x and 32 + x: the 32 x 32 tile
// (r / 32, c / 32) of the block sits in tile[2 (r / 32) + c / 32].
__device__ __forceinline__ void state_stage(const CulaStateStage& p) {
  __shared__ float tile[4][32][33];  // (a column of a tile over 32 banks)
  const int dim = p.dim, blocks = dim / 64, br = (int)blockIdx.x / blocks, bc = (int)blockIdx.x % blocks;
  const int x = threadIdx.x & 31, y = threadIdx.x >> 5;
  const long long size = (long long)dim * dim;
  const long long from = (long long)(64 * br) * dim + 64 * bc;
  const long long to = p.transpose ? (long long)(64 * bc) * dim + 64 * br : from;
  for (long long m = blockIdx.y; m < p.count; m += gridDim.y) {
    const int n = (int)(m / p.v_heads), hv = (int)(m % p.v_heads);
    long long at_slot = m * size;  // (floats)
    if (p.indices) {  // (the same for the whole CTA: the branches below hold no barrier)
      const long long slot = load_index(p.indices, p.indices_int64, n);
      if (slot < 0 || slot >= p.num_slots) {  // a padding sequence: zero o, zero states unless in the pool
        if (p.o) {
          long long bos, len;
          clamped_seq_bounds(p.seqs, n, p.total_tokens, bos, len);
          u16* o = (u16*)p.o + bos * p.v_heads * dim + (long long)hv * dim;
          for (long long e = blockIdx.x * 256LL + threadIdx.x; e < len * dim; e += 256LL * gridDim.x)
            o[(e / dim) * p.v_heads * dim + e % dim] = 0;
        }
        if (p.dst && !p.dst_at_slots)
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            float* d = p.dst + m * size + to + (long long)(y + 8 * i) * dim + x;
            d[0] = 0.f;
            d[32] = 0.f;
          }
        continue;
      }
      at_slot = slot * p.pool_pitch + hv * size;
    }
    if (!p.dst) continue;
    const float* s = p.src + (p.src_at_slots ? at_slot : m * size) + from;
    float* d = p.dst + (p.dst_at_slots ? at_slot : m * size) + to;
    float a[8][2];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float* row = s + (long long)(y + 8 * i) * dim + x;
      a[i][0] = row[0];
      a[i][1] = row[32];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = y + 8 * i;
      tile[2 * (r >> 5)][r & 31][x] = a[i][0];
      tile[2 * (r >> 5) + 1][r & 31][x] = a[i][1];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // row r of the destination block, columns x and 32 + x
      const int r = y + 8 * i;
      float* row = d + (long long)r * dim + x;
      row[0] = p.transpose ? tile[r >> 5][x][r & 31] : tile[2 * (r >> 5)][r & 31][x];
      row[32] = p.transpose ? tile[2 + (r >> 5)][x][r & 31] : tile[2 * (r >> 5) + 1][r & 31][x];
    }
    __syncthreads();
  }
}

// The entry point (extern "C", looked up by name from the host): 256 threads a CTA.
#define CULA_STATE_STAGE_KERNEL(NAME)                                                               \
  extern "C" __global__ void __launch_bounds__(256) NAME(const __grid_constant__ CulaStateStage p) { \
    state_stage(p);                                                                                 \
  }
