// The chunked prefills' key-first copy of the states (CulaStateStage, params.h): the chunked kernels
// take [N, HV, D, D] key-first states, so value-first states (FLA's state_v_first) and state pools
// read at slots (SGLang's initial_state_indices) are copied into the workspace before them (gather)
// and the final states out of it after them (scatter). [D, D] float32 matrices (D a multiple of 32)
// by tiles of 32 x 32 through shared memory, transposed or not: a CTA of 256 threads a tile, reads
// and writes of 128 contiguous bytes a warp. The token loop reads and writes value-first states and
// pools itself (common/recurrence.cuh).
#pragma once

#include "common/ptx.cuh"
#include "common/seqs.cuh"
#include "params.h"

// The grid's x: the tiles of a matrix; its y: a stride over the matrices m = n * HV + hv.
__device__ __forceinline__ void state_stage(const CulaStateStage& p) {
  __shared__ float tile[32][33];  // (a column of the tile over 32 banks)
  const int dim = p.dim, tiles = dim / 32, tr = (int)blockIdx.x / tiles, tc = (int)blockIdx.x % tiles;
  const int x = threadIdx.x & 31, y = threadIdx.x >> 5;
  const long long size = (long long)dim * dim;
  const long long from = (long long)(32 * tr) * dim + 32 * tc;
  const long long to = p.transpose ? (long long)(32 * tc) * dim + 32 * tr : from;
  for (long long m = blockIdx.y; m < p.count; m += gridDim.y) {
    const int n = (int)(m / p.v_heads), hv = (int)(m % p.v_heads);
    long long at_slot = m;
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
          for (int r = y; r < 32; r += 8) p.dst[m * size + from + (long long)r * dim + x] = 0.f;
        continue;
      }
      at_slot = slot * p.v_heads + hv;
    }
    if (!p.dst) continue;
    const float* s = p.src + (p.src_at_slots ? at_slot : m) * size + from;
    float* d = p.dst + (p.dst_at_slots ? at_slot : m) * size + to;
#pragma unroll
    for (int r = y; r < 32; r += 8) tile[r][x] = s[(long long)r * dim + x];
    __syncthreads();
#pragma unroll
    for (int r = y; r < 32; r += 8) d[(long long)r * dim + x] = p.transpose ? tile[x][r] : tile[r][x];
    __syncthreads();
  }
}

// The entry point (extern "C", looked up by name from the host): 256 threads a CTA.
#define CULA_STATE_STAGE_KERNEL(NAME)                                                               \
  extern "C" __global__ void __launch_bounds__(256) NAME(const __grid_constant__ CulaStateStage p) { \
    state_stage(p);                                                                                 \
  }
