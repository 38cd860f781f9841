// The delta rule's triangular solve within a chunk, shared by the chunked kernels of the delta-rule
// families (common/chunk_gated.cuh, common/chunk_kda.cuh): (I + A) U = X for a strictly lower
// triangular A of CULA_CHUNK = 64 rows, warp-level tf32 mma.sync. Compiled by NVRTC (no CUDA
// headers).
//
// By blocks of 16 rows (solve_lower_blocks16_t; the gated delta rule's chain): the inverses D_i of
// the 16-row diagonal blocks as in step 1 below, then U_i = D_i Y_i and Y_j -= A_ji U_i for the
// blocks j > i, on the calling warp's 16 columns in registers (14 dependent mma).
//
// By blocks of 32 rows:
// 1. One warp per 16-row diagonal block w of I + A inverts it by forward substitution in fp32
//    (invert_diagonal_block: rows 16 w .. 16 w + 15, columns 16 (w & 1) of the inverses), then,
//    after a barrier, the 32-row inverses from them: [D0 0; L D1] with L = -D1 A10 D0
//    (join_diagonal_inverses: two 16 x 16 products in tf32, two warps per 32-row block).
// 2. After a barrier, U0 = B0 X0, Y1 = X1 - A10 U0, U1 = B1 Y1 (B0, B1 the 32-row inverses, A10
//    rows 32..63 by columns 0..31 of A), transposed, on 16 columns of X held in registers by the
//    calling warp (solve_lower_blocks32_t; from X in shared memory: solve_columns32): 12 dependent
//    mma and no shared-memory round trip. Every warp reads all of A10 and the inverses: 36 8-byte
//    loads a lane, where session 18's solve by 16-row blocks (X in shared memory) took 80 loads of
//    A and 80 of X (all 32-bit, and as many conversions) and 8 round trips through shared memory.
#pragma once

#include "common/frags.cuh"
#include "common/ptx.cuh"
#include "common/tma.cuh"

#define CULA_DINV32_PITCH 36  // floats per row of the 32-row diagonal inverses (32 + 4)

// The tf32 operands are stored rounded: the inverses (invert_diagonal_block, join_diagonal_inverses)
// and, by the caller, A's entries left of its 16-row diagonal blocks (those read by the products
// here; the diagonal blocks stay fp32 for invert_diagonal_block) hold tf32_value of the float, so
// that each of the 16 warps of a solve passes the bits as they are where each converted them.
__device__ __forceinline__ float tf32_value(float x) { return __uint_as_float(to_tf32(x)); }

// The calling warp: the inverse of diagonal block w (0..3) of I + A (a: row pitch AP floats, a
// multiple of 4, 16-byte aligned) into dinv rows 16 w .. 16 w + 15, columns col0 .. col0 + 15; lane
// c (and c + 16) computes column c. Row r's entries left of the diagonal are read 4 at a time (36
// broadcast loads for the block where one a float took 120).
template <int AP>
__device__ __forceinline__ void invert_diagonal_block(const float (*a)[AP], float (*dinv)[CULA_DINV32_PITCH], int w,
                                                      int col0) {
  static_assert(AP % 4 == 0, "rows of whole float4s");
  const int lane = threadIdx.x & 31, c = lane & 15, r0 = 16 * w;
  float col[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    float acc = r == c ? 1.f : 0.f;
#pragma unroll
    for (int q = 0; q < (r + 3) / 4; ++q) {
      const float4 x = *(const float4*)&a[r0 + r][r0 + 4 * q];
      const float e[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int j = 4 * q; j < 4 * q + 4 && j < r; ++j) acc -= e[j - 4 * q] * col[j];
    }
    col[r] = acc;
  }
  if (lane < 16)
#pragma unroll
    for (int r = 0; r < 16; ++r) dinv[r0 + r][col0 + c] = tf32_value(col[r]);
}

// The m16n8k8 A fragment (ptx.cuh, mma_tf32) at rows r0 + {g, g+8}, columns c0 + {t, t+4} of a
// matrix of tf32 values (tf32_value).
template <int P>
__device__ __forceinline__ void tf32_rows(u32 (&f)[4], const float (*m)[P], int r0, int c0, int g, int t) {
  const auto at = [&](int r, int c) { return __float_as_uint(m[r][c]); };
  f[0] = at(r0 + g, c0 + t);
  f[1] = at(r0 + g + 8, c0 + t);
  f[2] = at(r0 + g, c0 + t + 4);
  f[3] = at(r0 + g + 8, c0 + t + 4);
}

// The calling warp: columns 8 h .. 8 h + 7 (h = 0, 1) of the lower left block L = -D1 A10 D0 of the
// 32-row inverse r (0..1) of I + A, from its two 16-row ones, which invert_diagonal_block put at
// rows 32 r + {0..15, 16..31} of binv, columns {0, 16}; L goes to rows 32 r + 16 .. 32 r + 31,
// columns 0..15. (Two warps per block, one for each half: the same latency as one warp for both.)
// P = D1 A10 stays in registers: its accumulator fragments are the A fragments of P D0 with the
// k-steps' columns permuted (lane t holds columns 2 t, 2 t + 1), so D0's rows are read in that order.
template <int AP>
__device__ __forceinline__ void join_diagonal_inverses(const float (*a)[AP], float (*binv)[CULA_DINV32_PITCH], int r,
                                                       int h) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, r0 = 32 * r;
  float P[2][4] = {};
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    u32 f[4];
    tf32_rows(f, binv, r0 + 16, 16 + 8 * ks, g, t);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
      mma_tf32(P[nt], f, __float_as_uint(a[r0 + 16 + 8 * ks + t][r0 + 8 * nt + g]),
               __float_as_uint(a[r0 + 16 + 8 * ks + t + 4][r0 + 8 * nt + g]));
  }
  float L[4] = {};
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    if (ks < h) continue;  // D0 is lower triangular: its rows 0..7 are zero in columns 8..15
    const u32 f[4] = {to_tf32(-P[ks][0]), to_tf32(-P[ks][2]), to_tf32(-P[ks][1]), to_tf32(-P[ks][3])};
    mma_tf32(L, f, __float_as_uint(binv[r0 + 8 * ks + 2 * t][8 * h + g]),
             __float_as_uint(binv[r0 + 8 * ks + 2 * t + 1][8 * h + g]));
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
    *(float2*)&binv[r0 + 16 + g + 8 * hf][8 * h + 2 * t] =
        make_float2(tf32_value(L[2 * hf]), tf32_value(L[2 * hf + 1]));
}

// The m16n8k8 A fragment of k-step ks from the accumulator of an m16n8 product (x[ks]), times sign:
// lane t's columns 2 t, 2 t + 1 as its k-slots t and t + 4 (a permutation the B fragments follow).
__device__ __forceinline__ void tf32_frag_t(u32 (&f)[4], const float (&acc)[4], float sign) {
  f[0] = to_tf32(sign * acc[0]);
  f[1] = to_tf32(sign * acc[2]);
  f[2] = to_tf32(sign * acc[1]);
  f[3] = to_tf32(sign * acc[3]);
}

// The calling warp: y[ni] += sign * z[ks] times the transpose of the 32 x 32 block of M at m (row
// pitch `pitch`), over k-steps ks and n-tiles ni (of 4): b0, b1 = m[(8 ni + g) pitch + 8 ks + 2 t +
// {0, 1}]. LOWER: a 32-row inverse, whose 8 x 8 blocks past the diagonal are skipped: zero, and for
// its rows 0..15 the columns 16..31 are never written.
template <bool LOWER>
__device__ __forceinline__ void times_block32_t(float (&y)[4][4], const float (&z)[4][4], const float* m, int pitch,
                                                float sign) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    u32 f[4];
    tf32_frag_t(f, z[ks], sign);
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      if (LOWER && ks > ni) continue;
      const float2 b = *(const float2*)&m[(8 * ni + g) * pitch + 8 * ks + 2 * t];
      mma_tf32(y[ni], f, __float_as_uint(b.x), __float_as_uint(b.y));
    }
  }
}

// The calling warp: U^T (16 rows: the warp's columns of U, 64 columns: the chunk's rows) for
// (I + A) U = X by blocks of 32 rows, in registers: X^T in, U^T out in x (the accumulator layout of
// an m16n8 product: x[nt] holds rows g, g+8 and columns 8 nt + 2 t, + 1), from the 32-row inverses
// of join_diagonal_inverses in binv and A (row pitch AP floats):
//   U0^T = X0^T B0^T,  Y1^T = X1^T - U0^T A10^T,  U1^T = Y1^T B1^T
// by tf32 mma, 12 dependent ones on the longest path and no shared-memory round trip (the
// transposed product keeps U where the next product's A operand wants it; only A and the inverses
// are read, by float2). An accumulator's n-tile is the A fragment of a k-step with the k-step's
// columns permuted (tf32_frag_t), so the B fragments are read in that order: b0, b1 = M[i][8 ks +
// 2 t], M[i][8 ks + 2 t + 1] for B = M^T.
template <int AP>
__device__ __forceinline__ void solve_lower_blocks32_t(const float (*a)[AP], const float (*binv)[CULA_DINV32_PITCH],
                                                       float (&x)[8][4]) {
  float x0[4][4], x1[4][4], u0[4][4] = {}, u1[4][4] = {};
#pragma unroll
  for (int ni = 0; ni < 4; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e) x0[ni][e] = x[ni][e], x1[ni][e] = x[4 + ni][e];
  times_block32_t<true>(u0, x0, &binv[0][0], CULA_DINV32_PITCH, 1.f);   // U0^T
  times_block32_t<false>(x1, u0, &a[32][0], AP, -1.f);                  // Y1^T
  times_block32_t<true>(u1, x1, &binv[32][0], CULA_DINV32_PITCH, 1.f);  // U1^T
#pragma unroll
  for (int ni = 0; ni < 4; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[ni][e] = u0[ni][e], x[4 + ni][e] = u1[ni][e];
}

// The calling warp: the U^T of solve_lower_blocks32_t by blocks of 16 rows, from the 16-row diagonal
// inverses D_i of invert_diagonal_block (block i at rows 16 i.., columns 16 (i & 1).. of dinv) and A
// (row pitch AP, tf32 values left of its 16-row diagonal blocks): for i = 0..3, U_i^T = Y_i^T D_i^T,
// then Y_j^T -= U_i^T A_ji^T for the blocks j > i. 36 mma as the 32-row solve, 14 on the longest
// path, and no 32-row inverses to form (join_diagonal_inverses).
template <int AP>
__device__ __forceinline__ void solve_lower_blocks16_t(const float (*a)[AP], const float (*dinv)[CULA_DINV32_PITCH],
                                                       float (&x)[8][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    u32 f[2][4];
    tf32_frag_t(f[0], x[2 * i], 1.f);
    tf32_frag_t(f[1], x[2 * i + 1], 1.f);
    float u[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
#pragma unroll
      for (int ni = ks; ni < 2; ++ni) {
        const float2 b = *(const float2*)&dinv[16 * i + 8 * ni + g][16 * (i & 1) + 8 * ks + 2 * t];
        mma_tf32(u[ni], f[ks], __float_as_uint(b.x), __float_as_uint(b.y));
      }
#pragma unroll
    for (int e = 0; e < 4; ++e) x[2 * i][e] = u[0][e], x[2 * i + 1][e] = u[1][e];
    if (i == 3) break;
    tf32_frag_t(f[0], u[0], -1.f);
    tf32_frag_t(f[1], u[1], -1.f);
#pragma unroll
    for (int j = i + 1; j < 4; ++j)
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
          const float2 b = *(const float2*)&a[16 * j + 8 * ni + g][16 * i + 8 * ks + 2 * t];
          mma_tf32(x[2 * j + ni], f[ks], __float_as_uint(b.x), __float_as_uint(b.y));
        }
  }
}

// U^T of solve_lower_blocks32_t or solve_lower_blocks16_t (x: rows g, g + 8 of U^T are columns c0 +
// g, c0 + 8 + g of U; columns 8 nt + 2 t, + 1 are its rows) into columns c0 .. c0 + 15 of a 16-bit
// tile of U's rows, by stmatrix.trans (each 8 x 8 piece transposed: the lane's pair of rows lands in
// one column).
template <typename T>
__device__ __forceinline__ void store_solved16(const SwizzledTile& tile, int c0, const float (&x)[8][4]) {
  const int lane = threadIdx.x & 31, li = lane >> 3, lr = lane & 7;  // the piece and row this lane addresses
#pragma unroll
  for (int np = 0; np < 4; ++np) {
    const u32 r[4] = {pack2<T>(x[2 * np][0], x[2 * np][1]), pack2<T>(x[2 * np][2], x[2 * np][3]),
                      pack2<T>(x[2 * np + 1][0], x[2 * np + 1][1]), pack2<T>(x[2 * np + 1][2], x[2 * np + 1][3])};
    stmatrix_x4_trans(tile.at(16 * np + 8 * (li >> 1) + lr, c0 + 8 * (li & 1)), r);
  }
}

// The calling warp: columns c0 .. c0 + 15 of U for (I + A) U = X with X in shared memory (float32
// boxes of 32 columns, 128-byte swizzle: a warp's loads and stores of X^T hit 32 banks; with
// `identity`, X = I, not read), by solve_lower_blocks32_t: U^T in the accumulator layout, xt[nt][e]
// = U[8 nt + 2 t + (e & 1)][c0 + g + 8 (e >> 1)]; at: the addresses of those columns' rows 2 t + (e & 1).
template <int AP>
__device__ __forceinline__ void solve_columns32_t(const float (*a)[AP], const float (*binv)[CULA_DINV32_PITCH],
                                                  const SwizzledTileF32& x, int c0, bool identity, float (&xt)[8][4],
                                                  u32 (&at)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const auto row = [&](int nt, int e) { return 8 * nt + 2 * t + (e & 1); };
  const auto col = [&](int e) { return c0 + g + 8 * (e >> 1); };
  // (rows 8 apart: 8 rows of 128 bytes apart in shared memory, the swizzle the same)
  at[0] = x.at(row(0, 0), col(0)), at[1] = x.at(row(0, 1), col(1)), at[2] = x.at(row(0, 2), col(2));
  at[3] = x.at(row(0, 3), col(3));
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) xt[nt][e] = identity ? (row(nt, e) == col(e) ? 1.f : 0.f) : lds_f32(at[e] + 1024 * nt);
  solve_lower_blocks32_t<AP>(a, binv, xt);
}
// ... U replaces those columns of X
template <int AP>
__device__ __forceinline__ void solve_columns32(const float (*a)[AP], const float (*binv)[CULA_DINV32_PITCH],
                                                const SwizzledTileF32& x, int c0, bool identity) {
  float xt[8][4];
  u32 at[4];
  solve_columns32_t<AP>(a, binv, x, c0, identity, xt, at);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) sts_f32(at[e] + 1024 * nt, xt[nt][e]);
}
// ... U in 16 bits (T) into columns c0 .. c0 + 15 of `out`, a tile of U's rows (X is left as it was)
template <typename T, int AP>
__device__ __forceinline__ void solve_columns32_16(const float (*a)[AP], const float (*binv)[CULA_DINV32_PITCH],
                                                   const SwizzledTileF32& x, int c0, const SwizzledTile& out) {
  float xt[8][4];
  u32 at[4];
  solve_columns32_t<AP>(a, binv, x, c0, false, xt, at);
  store_solved16<T>(out, c0, xt);
}
