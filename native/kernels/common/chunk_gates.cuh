// The scalar gates of a chunk (the gated delta rule's g and beta per token, CulaGdnParams), for the
// chunked kernels that take them (common/chunk_gated.cuh, and the scalar-gate prep of
// common/chunk_kda.cuh): one warp loads the raw values a chunk ahead, two tokens a lane, and turns
// them into beta and G, the cumulative log decay, by a warp scan. Compiled by NVRTC (no CUDA headers).
#pragma once

#include "common/recurrence.cuh"
#include "params.h"

// The raw gates of a chunk's tokens 2 lane and 2 lane + 1, loaded a chunk ahead (g = 0, beta = 1
// past the end).
struct ChunkGates {
  float g[2], beta[2];
};

// Token j of the chunk at tok0 (tok0 + j < len) reads g and beta at gb0 + (tok0 + j) HV.
__device__ __forceinline__ void chunk_load_gates(ChunkGates& x, const CulaGdnParams& p, long long gb0, long long tok0,
                                                 long long len) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const long long j = tok0 + 2 * lane + e;
    const bool ok = j < len;
    x.g[e] = ok && p.g ? load_scalar(p.g, p.g_dtype, gb0 + j * p.v_heads) : 0.f;
    x.beta[e] = ok && p.beta ? load_scalar(p.beta, p.beta_dtype, gb0 + j * p.v_heads) : 1.f;
  }
}

// One warp: the chunk's gates as the kernels use them (the in-kernel gate and beta's sigmoid
// applied; g = beta = 0 past the first `rows` tokens) into beta[0..63], and G in log2 units into
// g2[0..63] (shared memory).
__device__ __forceinline__ void chunk_gate_scan(float* beta, float* g2, const ChunkGates& x, const CulaGdnParams& p,
                                                const InGate& ig, int rows) {
  const int lane = threadIdx.x & 31;
  float gl[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int i = 2 * lane + e;
    float g = gate_of(p, ig, x.g[e]), b = beta_of(p, x.beta[e]);
    if (i >= rows) g = b = 0.f;
    gl[e] = g;
    beta[i] = b;
  }
  float s = gl[0] + gl[1];
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, s, off);
    if (lane >= off) s += y;
  }
  g2[2 * lane] = (s - gl[1]) * CULA_LOG2E;
  g2[2 * lane + 1] = s * CULA_LOG2E;
}
