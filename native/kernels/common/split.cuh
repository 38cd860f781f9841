// A long prefill split into segments (the gated delta rule's one-launch kernel; CulaSplit, params.h).
// A segment's states follow an affine map of its first state S: S_t = Phi_t S + N_t. The host runs
// each segment after the first twice, beside the first: from zero with its values (N_t, and the
// output o'_t), and from the identity with zero values (Phi_t, and o^I_t = scale Phi_t^T q_t). These
// kernels then join them: the segments' first states in order (split_step), and each later token's
// output o_t = o'_t + S^T o^I_t (split_fix).
#pragma once

#include "common/ptx.cuh"
#include "params.h"

// p.out [p.count, D, D] = the identity (a grid-stride loop).
__device__ __forceinline__ void split_identity(const CulaSplit& p) {
  const long long size = (long long)p.dim * p.dim, n = p.count * size;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
    const long long r = e % size;
    p.out[e] = r / p.dim == r % p.dim ? 1.f : 0.f;
  }
}

// p.out = p.phi p.s + p.n for each value head (blockIdx.y), float32 [D, D] matrices: CTA x a 32 x 32
// block of out, 256 threads of four outputs (rows r0 + 8 i, one column).
__device__ __forceinline__ void split_step(const CulaSplit& p) {
  __shared__ float a[32][129];  // the block's rows of phi (padded: a column over 32 banks)
  __shared__ float b[128][33];  // its columns of s
  const int dim = p.dim, blocks = dim / 32, br = (int)blockIdx.x / blocks, bc = (int)blockIdx.x % blocks;
  const long long base = (long long)blockIdx.y * dim * dim;
  for (int e = threadIdx.x; e < 32 * dim; e += 256) {
    a[e / dim][e % dim] = p.phi[base + (long long)(32 * br + e / dim) * dim + e % dim];
    b[e / 32][e % 32] = p.s[base + (long long)(e / 32) * dim + 32 * bc + e % 32];
  }
  __syncthreads();
  const int c = threadIdx.x & 31, r0 = threadIdx.x >> 5;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int j = 0; j < dim; ++j) {
    const float x = b[j][c];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += a[r0 + 8 * i][j] * x;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const long long at = base + (long long)(32 * br + r0 + 8 * i) * dim + 32 * bc + c;
    p.out[at] = acc[i] + p.n[at];
  }
}

// o[r] += oi[r] S for the later segments' rows r (token rows of [.., HV, D], from the second
// segment's first): CTA (x, hv) rows of value head hv in segment x / p.groups, group x % p.groups
// of p.group_rows rows (a multiple of 16), whose first state is p.starts [segment, HV, D, D]. S is
// rounded to T once a CTA, as the chunked kernels round their state operands; then eight warps of
// 16 rows at a time, m16n8k16 products of the 16-bit oi and S accumulated in float32 onto o' (the
// accumulators start from it: the sum is rounded once).
//
// Lane (g, t) moves 16 bytes of a row at a time: columns 32 m + 8 t .. + 7 of rows g and g + 8 of oi
// and o. So the products take oi's columns (the sum's k) and o's (n) in another order than mma's
// fragments name them, the same on both sides: k-step 2 m + h takes its k 2 t + e as column 32 m +
// 8 t + 4 h + e and its k 2 t + 8 + e as that + 2 (e < 2); n-tile 4 m + q its n 2 t + e as column
// 32 m + 8 t + 2 q + e, so B's column c of that tile is S's column 32 m + 8 (c / 2) + 2 q + c % 2.
template <typename T, int D>
__device__ __forceinline__ void split_fix(const CulaSplit& p) {
  constexpr int P = D + 4, M = D / 32;  // (P / 2 = 2 mod 32 words: a half-warp's 64-bit B loads hit 32 banks)
  __shared__ __align__(16) u16 st[D * P];  // S^T: st[n P + j] = S[j][n]
  const int hv = blockIdx.y;
  const long long seg = blockIdx.x / p.groups, first = seg * p.rows_per_seg + (blockIdx.x % p.groups) * p.group_rows;
  const long long end = first + p.group_rows < (seg + 1) * p.rows_per_seg ? first + p.group_rows : (seg + 1) * p.rows_per_seg;
  const float* S = p.starts + (seg * p.v_heads + hv) * (long long)(D * D);
#pragma unroll 16  // (loads in flight together: the loop is the kernel's latency otherwise)
  for (int e = threadIdx.x; e < D * D; e += 256) st[(e % D) * P + e / D] = (u16)(pack2<T>(S[e], 0.f) & 0xffffu);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const long long pitch = (long long)p.v_heads * D;
  const u16* bcol = st + (8 * (g >> 1) + (g & 1)) * P + 8 * t;  // (B's column c = g of tile 0, its k 8 t)
  for (long long row = first + 16 * warp; row < end; row += 128) {
    const u16* __restrict__ oi = (const u16*)p.oi + (row + g) * pitch + (long long)hv * D + 8 * t;
    u16* __restrict__ o = (u16*)p.o + (row + g) * pitch + (long long)hv * D + 8 * t;
    uint4 a_lo[M], a_hi[M], o_lo[M], o_hi[M];  // (rows g and g + 8; every load of the 16 rows first)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      a_lo[m] = *(const uint4*)(oi + 32 * m);
      a_hi[m] = *(const uint4*)(oi + 8 * pitch + 32 * m);
      o_lo[m] = *(const uint4*)(o + 32 * m);
      o_hi[m] = *(const uint4*)(o + 8 * pitch + 32 * m);
    }
    float acc[D / 8][4];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const u32 lo[4] = {o_lo[m].x, o_lo[m].y, o_lo[m].z, o_lo[m].w}, hi[4] = {o_hi[m].x, o_hi[m].y, o_hi[m].z, o_hi[m].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float* c = acc[4 * m + q];
        c[0] = to_float<T>((u16)(lo[q] & 0xffffu)), c[1] = to_float<T>((u16)(lo[q] >> 16));
        c[2] = to_float<T>((u16)(hi[q] & 0xffffu)), c[3] = to_float<T>((u16)(hi[q] >> 16));
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 a[4] = {h ? a_lo[m].z : a_lo[m].x, h ? a_hi[m].z : a_hi[m].x, h ? a_lo[m].w : a_lo[m].y,
                          h ? a_hi[m].w : a_hi[m].y};
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          const uint2 b = *(const uint2*)(bcol + (32 * (n / 4) + 2 * (n % 4)) * P + 32 * m + 4 * h);
          mma<T>(acc[n], a, b.x, b.y);
        }
      }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      uint4 lo, hi;
      u32* l = &lo.x;
      u32* r = &hi.x;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float* c = acc[4 * m + q];
        l[q] = pack2<T>(c[0], c[1]), r[q] = pack2<T>(c[2], c[3]);
      }
      *(uint4*)(o + 32 * m) = lo;
      *(uint4*)(o + 8 * pitch + 32 * m) = hi;
    }
  }
}

// The entry points (extern "C", looked up by name from the host).
#define CULA_SPLIT_KERNELS()                                                                             \
  extern "C" __global__ void __launch_bounds__(256) cula_split_identity(const __grid_constant__ CulaSplit p) { \
    split_identity(p);                                                                                   \
  }                                                                                                      \
  extern "C" __global__ void __launch_bounds__(256) cula_split_step(const __grid_constant__ CulaSplit p) { \
    split_step(p);                                                                                       \
  }
#define CULA_SPLIT_FIX_KERNEL(NAME, T, D)                                                         \
  extern "C" __global__ void __launch_bounds__(256) NAME(const __grid_constant__ CulaSplit p) { \
    split_fix<T, D>(p);                                                                         \
  }
