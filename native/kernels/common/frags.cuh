// Warp-level mma.sync (m16n8k16) fragments shared by the chunked kernels: a state slice held in
// the accumulator layout, its 16-bit copies by stmatrix, score fragments as A operands, and
// products with 64-column swizzled tiles. Compiled by NVRTC (no CUDA headers).
#pragma once

#include "common/ptx.cuh"
#include "common/tma.cuh"

// A CTA's state slice lives in registers in the mma / wgmma accumulator layout: in row tile mt (16
// rows from row0(mt); the thread's rows g and g+8) and 8-column tile nt, the thread's pairs at
// columns 2t, 2t+1 are S[mt][4 nt + {0, 1}] (row g) and S[mt][4 nt + {2, 3}] (row g+8).
// f(row, col, x, y) is called for each pair.
template <int MT, int W, typename Row0, typename F>
__device__ __forceinline__ void for_state_pairs(float (&S)[MT][W], Row0 row0, F f) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < W / 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        f(row0(mt) + g + hf * 8, nt * 8 + 2 * t, S[mt][4 * nt + 2 * hf], S[mt][4 * nt + 2 * hf + 1]);
}

// Four 8 x 8 pieces of 16-bit pairs, a 16 x 16 block as an A fragment holds it (rows g / g+8, columns
// 2t / 2t+8), by stmatrix: lane l gives the address of row l % 8 of piece l / 8 (16 contiguous
// bytes, whatever the swizzle).
__device__ __forceinline__ void stmatrix_x4(u32 addr, const u32 (&a)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a[0]), "r"(a[1]),
               "r"(a[2]), "r"(a[3])
               : "memory");
}

// The same with each piece transposed: lane l gives the address of row l % 8 of piece l / 8 as
// stored, which holds column l % 8 of the piece as the registers hold it.
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, const u32 (&a)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a[0]),
               "r"(a[1]), "r"(a[2]), "r"(a[3])
               : "memory");
}

// A 16-bit copy of S by stmatrix into a swizzled tile, each value times `scale` (the state copies
// and the o boxes of the prefill): per warp and pair of 8-column tiles, one instruction stores the
// four 8 x 8 pieces (rows g / g+8 of each) that 16 st.shared would.
template <typename T, int MT, typename Row0, typename Tile>
__device__ __forceinline__ void copy_stmatrix(float (&S)[MT][32], Row0 row0, const Tile& ts, float scale = 1.f) {
  const int lane = threadIdx.x & 31, r = (lane & 7) + ((lane >> 3) & 1) * 8, half = lane >> 4;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; nt += 2) {
      const float* x = &S[mt][4 * nt];
      const u32 a[4] = {pack2<T>(scale * x[0], scale * x[1]), pack2<T>(scale * x[2], scale * x[3]),
                        pack2<T>(scale * x[4], scale * x[5]), pack2<T>(scale * x[6], scale * x[7])};
      stmatrix_x4(ts.at(row0(mt) + r, (nt + half) * 8), a);
    }
}

// The state at the piece's end, to `out` (piece_final_state) unless null.
template <int D, int MT, int W, typename Row0>
__device__ __forceinline__ void store_state(float (&S)[MT][W], Row0 row0, float* out) {
  if (out)
    for_state_pairs(S, row0, [&](int row, int col, float& x, float& y) {
      *(float2*)&out[(long long)row * D + col] = make_float2(x, y);
    });
}

// The A operand (16 x 16, k-major fragment) of k-step kk of A V, from the score fragments.
template <typename T>
__device__ __forceinline__ void score_fragment(u32 (&a)[4], const float (&A)[8][4], int kk) {
  a[0] = pack2<T>(A[2 * kk][0], A[2 * kk][1]);
  a[1] = pack2<T>(A[2 * kk][2], A[2 * kk][3]);
  a[2] = pack2<T>(A[2 * kk + 1][0], A[2 * kk + 1][1]);
  a[3] = pack2<T>(A[2 * kk + 1][2], A[2 * kk + 1][3]);
}

// The A fragment (16 x 16) of rows [row0, row0 + 16) and k-step kk of the 16-bit tile tx (k-major:
// its columns are the k dimension), by ldmatrix: an A operand of mma.sync, or of wgmma from registers.
__device__ __forceinline__ void ldsm_a(u32 (&a)[4], const SwizzledTile& tx, int row0, int kk, int lane) {
  ldsm_x4(a, tx.at(row0 + (lane & 15), kk * 16 + (lane >> 4) * 8));
}

// The B fragments of k-step kk for the 16 columns n0 .. n0 + 15 of the transpose of the k-major
// tile `tile` (its rows n0 ..), by ldmatrix: b[0], b[1] for columns n0 .. n0 + 7, b[2], b[3] for
// the next 8.
__device__ __forceinline__ void ldsm_b_t(u32 (&b)[4], const SwizzledTile& tile, int n0, int kk, int lane) {
  ldsm_x4(b, tile.at(n0 + (lane & 7) + ((lane >> 4) << 3), kk * 16 + ((lane >> 3) & 1) * 8));
}

// Products with rows [16 kk, 16 kk + 16) of the 64-column tile `tile`, an mn-major operand (a state
// copy, a value box, U) read by ldmatrix.trans, each B fragment once for all NA A fragments:
// acc(f, n) (the 16 x 8 accumulator of columns 8 n .. 8 n + 7) += a[f] (a 16 x 16 fragment) times
// the tile's rows there.
template <typename T, int NA, typename Acc>
__device__ __forceinline__ void mma_times_tile_rows(const u32 (&a)[NA][4], const SwizzledTile& tile, int kk, int lane,
                                                    Acc acc) {
#pragma unroll
  for (int np = 0; np < 4; ++np) {
    u32 b[4];
    ldsm_x4_trans(b, tile.at(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, np * 16 + (lane >> 4) * 8));
#pragma unroll
    for (int f = 0; f < NA; ++f) {
      mma<T>(acc(f, 2 * np), a[f], b[0], b[1]);
      mma<T>(acc(f, 2 * np + 1), a[f], b[2], b[3]);
    }
  }
}

// acc (16 x 64) += a (a 16 x 16 fragment, k-step kk) times the transpose of the 64-row tile `tile`
// (k-major: its columns are the k dimension, read by ldmatrix), its row pairs of 8-row tiles up to
// `last` (0..3; the accumulator's tiles past them untouched).
template <typename T>
__device__ __forceinline__ void mma_times_tile_t(float (&acc)[8][4], const u32 (&a)[4], const SwizzledTile& tile,
                                                 int kk, int lane, int last = 3) {
#pragma unroll
  for (int np = 0; np < 4; ++np) {
    if (np > last) continue;
    u32 b[4];
    ldsm_b_t(b, tile, np * 16, kk, lane);
    mma<T>(acc[2 * np], a, b[0], b[1]);
    mma<T>(acc[2 * np + 1], a, b[2], b[3]);
  }
}

// O (16 x 64) += (a[0] + .. + a[NA - 1]) times rows [16 kk, 16 kk + 16) of `tile` (NA = 2: a float32
// operand as hi + lo).
template <typename T, int NA>
__device__ __forceinline__ void mma_tile_rows(float (&O)[8][4], const u32 (&a)[NA][4], const SwizzledTile& tile,
                                              int kk, int lane) {
  mma_times_tile_rows<T, NA>(a, tile, kk, lane, [&](int, int n) { return O[n]; });
}
template <typename T>
__device__ __forceinline__ void mma_tile_rows(float (&O)[8][4], const u32 (&a)[4], const SwizzledTile& tile, int kk,
                                              int lane) {
  mma_tile_rows<T, 1>(O, reinterpret_cast<const u32(&)[1][4]>(a), tile, kk, lane);
}

// O (16 x 64) += rows [row0, row0 + 16) of the 16-bit tile tx (k-major: its columns are the k
// dimension) times the 64-column tile `tile` (mn-major), over k-steps 0 .. last (of KSTEPS): a
// warp's rows of a product with a state copy or with U.
template <typename T, int KSTEPS>
__device__ __forceinline__ void mma_rows_times_tile(float (&O)[8][4], const SwizzledTile& tx, int row0,
                                                    const SwizzledTile& tile, int lane, int last = KSTEPS - 1) {
#pragma unroll
  for (int kk = 0; kk < KSTEPS; ++kk) {
    if (kk > last) continue;
    u32 a[4];
    ldsm_a(a, tx, row0, kk, lane);
    mma_tile_rows<T>(O, a, tile, kk, lane);
  }
}

// S (MT row tiles of 16 x 64) += a[mt] (16 x 16 fragments) times rows [16 kk, 16 kk + 16) of the
// 64-column tile `tile` (mn-major, read by ldmatrix.trans): a k-step of a chunked state update.
template <typename T, int MT>
__device__ __forceinline__ void mma_state_rows(float (&S)[MT][32], const u32 (&a)[MT][4], const SwizzledTile& tile,
                                               int kk, int lane) {
  mma_times_tile_rows<T, MT>(a, tile, kk, lane, [&](int mt, int n) { return &S[mt][4 * n]; });
}

// o rows of this thread (row0 + g, row0 + g + 8), columns nt*8 + 2t: scaled, rounded, stored.
template <typename T, int NT>
__device__ __forceinline__ void store_o(u16* o, const float (&O)[NT][4], long long tok0, int row0, int g, int t,
                                        int rows, long long row_stride, float scale) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = row0 + g + hf * 8;
    if (i < rows) {
      u16* orow = o + (tok0 + i) * row_stride + 2 * t;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        *(u32*)&orow[nt * 8] = pack2<T>(scale * O[nt][2 * hf], scale * O[nt][2 * hf + 1]);
    }
  }
}

// Rows [0, rows) of NT COLS-column 16-bit tiles (row-major in global memory, one row stride
// `stride` elements for all) into their swizzled tiles of CULA_CHUNK rows by cp.async, 16 bytes
// per copy, thread `tid` of NTHREADS; rows past `rows` are zero-filled. Tiles of one layout go in
// one call: a row's address is computed once for all of them (on the chain warps of the chunk
// kernels, whose every instruction is latency). The caller commits the group.
// A thread copies the same 16-byte column piece of rows r0, r0 + STEP, ...: STEP is a multiple of
// 8, so each of those rows has r0's swizzle phase (r & 7) and lies 128 STEP bytes after the one
// before in the tile. So a copy is a pointer step and a shared-address step (the rows to
// zero-fill in a loop of their own), where the swizzle and the row's offset computed for each copy
// took about 20 instructions. (Loops, not unrolled: unrolled, the passes' offsets were hoisted out
// of the kernels' chunk loops into registers, and the generic one-launch kernel spilled on sm_100f.)
template <int COLS, int NTHREADS, int NT>
__device__ __forceinline__ void cp_async_rows(const SwizzledTile (&tiles)[NT], const u16* const (&srcs)[NT],
                                              long long stride, int rows, int tid) {
  constexpr int P = COLS / 8, STEP = NTHREADS / P;  // 16-byte pieces per row; rows one pass covers
  static_assert(NTHREADS % P == 0 && STEP % 8 == 0 && CULA_CHUNK % STEP == 0, "one piece, every STEP-th row");
  const int r0 = tid / P, c = (tid % P) * 8;
  u32 dst[NT];
  const u16* src[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) dst[j] = tiles[j].at(r0, c), src[j] = srcs[j] + r0 * stride + c;
  const long long step = STEP * stride;
  const int full = rows < CULA_CHUNK ? rows : CULA_CHUNK;
  int r = r0;
#pragma unroll 1
  for (; r < full; r += STEP)
#pragma unroll
    for (int j = 0; j < NT; ++j) cp_async16(dst[j], src[j], 16u), dst[j] += STEP * 128, src[j] += step;
#pragma unroll 1
  for (; r < CULA_CHUNK; r += STEP)  // (zero-filling copies name the chunk's first row)
#pragma unroll
    for (int j = 0; j < NT; ++j) cp_async16(dst[j], srcs[j], 0u), dst[j] += STEP * 128;
}
template <int COLS, int NTHREADS>
__device__ __forceinline__ void cp_async_rows(const SwizzledTile& tile, const u16* src, long long stride, int rows,
                                              int tid) {
  cp_async_rows<COLS, NTHREADS, 1>({tile}, {src}, stride, rows, tid);
}
