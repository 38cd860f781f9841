// Linear attention with a per-head scalar decay (FLA's simple_gla with g_gamma, Lightning
// Attention). Compiled by NVRTC for each real target of the fat binary; no CUDA headers.
//
// Recurrence for one (sequence, head), with gamma = exp(g_gamma[h]) and S a D x D fp32 state:
//     S_t = gamma * S_{t-1} + k_t^T v_t,      o_t = scale * q_t S_t
//
// Kernels (extern "C", looked up by name from the host):
//   cula_chunk_<dtype>_d<D>_generic  chunked prefill, warp-specialised, warp-level mma.sync on tiles
//                                    brought in by TMA (sm_90+; what the sm_100 family runs for now)
//   cula_chunk_<dtype>_d<D>_sm90a    the same roles and ring with warpgroup-level wgmma; body only
//                                    in sm_90a code
//   cula_recurrent_<dtype>_d<D>      token-by-token recurrence (fused_recurrent, decode)
//   cula_gated_recurrent_<dtype>_d<D> the same with a per-token gate g (common/recurrence.cuh, the
//                                    gated delta rule's recurrence without the delta rule; _one,
//                                    K = 64 only: one token a sequence)
//   cula_chunk_<dtype>_d<D>_{generic,sm90a}_gated  the chunked prefill with a per-token gate g
//                                    [tokens, H] in place of g_gamma (ChunkDecay; no sequence split)
#include "common/frags.cuh"
#include "common/ptx.cuh"
#include "common/recurrence.cuh"
#include "common/seqs.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "params.h"

// The rows of one (sequence, head) and, for v and o, of one value slice of BV columns: token t of
// the sequence is at x + t * row_stride.
struct HeadRows {
  const u16* q;
  const u16* k;
  const u16* v;
  u16* o;
  long long bos, len, row_stride;
};

template <int D, int BV, typename Params>
__device__ __forceinline__ HeadRows head_rows(const Params& p, int n, int h, int vb) {
  HeadRows r;
  clamped_seq_bounds(p.seqs, n, p.total_tokens, r.bos, r.len);
  r.row_stride = (long long)p.heads * D;
  const long long off = r.bos * r.row_stride + (long long)h * D;
  r.q = (const u16*)p.q + off;
  r.k = (const u16*)p.k + off;
  r.v = (const u16*)p.v + off + vb * BV;
  r.o = (u16*)p.o + off + vb * BV;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Chunked prefill
// ---------------------------------------------------------------------------------------------
// Which piece of which sequence a work item of the chunked prefill covers (see
// CulaChunkParams::parts): its rows narrowed to the piece, where its state starts and where it
// ends up. z numbers the (sequence, piece) pairs, `pieces` per sequence.
struct ChunkPiece {
  HeadRows hr;
  int n, part;
  long long start;  // first token of the piece within the sequence
};

template <int D, int BV>
__device__ __forceinline__ ChunkPiece chunk_piece(const CulaChunkParams& p, int h, int vb, int z, int pieces) {
  ChunkPiece c;
  c.n = z / pieces;
  c.part = z % pieces;
  c.hr = head_rows<D, BV>(p, c.n, h, vb);
  c.start = (long long)c.part * p.part_len;
  if (p.parts > 1) {
    const long long off = c.start * c.hr.row_stride;
    c.hr.q += off;
    c.hr.k += off;
    c.hr.v += off;
    c.hr.o += off;
    c.hr.bos += c.start;
    const long long rest = c.hr.len - c.start;
    c.hr.len = rest < p.part_len ? rest : p.part_len;
  }
  return c;
}

// Where the piece's final state goes: its slot of part_states (states pass), ht for the last
// piece of a sequence, nowhere for the others.
template <int D, int BV, bool STATES>
__device__ __forceinline__ float* piece_final_state(const CulaChunkParams& p, const ChunkPiece& c, int h, int vb) {
  if (STATES)
    return p.part_states + (((long long)c.n * (p.parts - 1) + c.part) * p.heads + h) * D * D + vb * BV;
  if (p.ht && c.part == p.parts - 1) return p.ht + ((long long)c.n * p.heads + h) * D * D + vb * BV;
  return nullptr;
}

// The state at the piece's start, into registers: zero for the states pass; otherwise h0 and, for
// a later piece of a split sequence, the earlier pieces' contributions (their final states from
// the states pass), each decayed to this piece's first token. Each source is read with all its
// loads in flight at once: a loop over the pieces per element pair instead made the main pass of
// B1 T2048 H8 (8 pieces) take 62 us rather than 20 (ncu, H200), and the kernels' code 3-7x longer.
template <int D, int BV, bool STATES, int MT, int W, typename Row0>
__device__ __forceinline__ void load_state(float (&S)[MT][W], Row0 row0, const CulaChunkParams& p, const ChunkPiece& c,
                                           int h, int vb, float glog2) {
  const float* h0 = STATES || !p.h0 ? nullptr : p.h0 + ((long long)c.n * p.heads + h) * D * D + vb * BV;
  for_state_pairs(S, row0, [&](int row, int col, float& x, float& y) {
    const float2 s = h0 ? *(const float2*)&h0[(long long)row * D + col] : make_float2(0.f, 0.f);
    x = s.x;
    y = s.y;
  });
  if (STATES || c.part == 0) return;
  const float f0 = fast_exp2(glog2 * (float)c.start);
  for_state_pairs(S, row0, [&](int, int, float& x, float& y) {
    x *= f0;
    y *= f0;
  });
  for (int q = 0; q < c.part; ++q) {
    const float* l = p.part_states + (((long long)c.n * (p.parts - 1) + q) * p.heads + h) * D * D + vb * BV;
    const float f = fast_exp2(glog2 * (float)((long long)(c.part - 1 - q) * p.part_len));
    for_state_pairs(S, row0, [&](int row, int col, float& x, float& y) {
      const float2 s = *(const float2*)&l[(long long)row * D + col];
      x += f * s.x;
      y += f * s.y;
    });
  }
}

// A CTA takes work items (a piece of sequence n, head h, value slice vb of BV columns) in turn
// (see ItemWalk) and walks each one chunk by chunk, keeping its D x BV slice of the state in fp32
// registers. For a chunk of L <= C tokens with in-chunk positions i, j and g = log2(gamma):
//   A_ij = (q_i . k_j) 2^{g (i-j)}  for j <= i
//   o_i  = scale * (2^{g (i+1)} q_i S + sum_j A_ij v_j)
//   S   <- 2^{g L} S + sum_j 2^{g (L-1-j)} k_j^T v_j
// Each output warp computes 16 rows of A and o (warp w of a warpgroup: rows [16w, 16w+16), but
// see chunk_output_generic).
//
// Both variants are warp-specialised around the same ring: one warp issues the TMA loads (one
// tensor copy per 64 x 64 box, completion on an mbarrier) into CULA_STAGES chunks of shared memory,
// stored densely in the 128-byte swizzle that TMA, ldmatrix and wgmma all read without bank
// conflicts; a state warpgroup carries S (row tile mt of its warp w: rows 64 mt + 16 w + {g, g+8})
// one chunk ahead and hands it over through two 16-bit copies; output warps compute o and store
// it by TMA; mbarriers order them.
//   sm90a:   warpgroup-level wgmma (m64n64k16, asynchronous, operands read from shared memory by
//            the tensor cores); one output warpgroup; three warps make decayed copies of the
//            value boxes for the state update (CULA_SM90A_THREADS).
//   generic: warp-level mma.sync (m16n8k16) on fragments loaded by ldmatrix; two output
//            warpgroups taking alternate chunks (CULA_GENERIC_THREADS).

// Every decay factor a chunk needs is a power 2^{g d} with 0 <= d <= C, g = log2 of the head's
// decay (0 without g_gamma): each role of the prefill tabulates them in shared memory (pw[d]) for
// each work item's head instead of evaluating ~70 exponentials per thread and chunk. A role of n
// threads (tid its thread) has its own table and named barrier `bar`, passed before the fill (all
// are done with the last item's table) and after it. Returns g. The *_gated kernels need no table
// (ChunkDecay reads the stage's gates): 0, and no barrier.
template <bool GATED>
__device__ __forceinline__ float role_powers(float* pw, const CulaChunkParams& p, int h, int tid, int n, int bar) {
  if (GATED) return 0.f;
  const float glog2 = p.g_gamma ? p.g_gamma[h] * CULA_LOG2E : 0.f;
  asm volatile("bar.sync %0, %1;" ::"r"(bar), "r"(n) : "memory");
  for (int i = tid; i <= CULA_CHUNK; i += n) pw[i] = fast_exp2(glog2 * (float)i);
  asm volatile("bar.sync %0, %1;" ::"r"(bar), "r"(n) : "memory");
  return glog2;
}

// The decay factors of one chunk, for its tokens i, j (0 <= j <= i < rows):
//   g_gamma (GATED false): from the role's table of powers t[d] = 2^{g d};
//   per-token gate (GATED true): from the chunk's cumulative log2 gates t[i] = G_i (the sum of
//     log2 e * g over tokens 0..i, written by the producer into the ring stage), each factor a
//     difference's exp2: a chunk's G reaches -250 and beyond, so a product of 2^{G_i} and 2^{-G_j}
//     would overflow.
template <bool GATED>
struct ChunkDecay {
  const float* t;
  __device__ __forceinline__ float between(int i, int j) const { return GATED ? fast_exp2(t[i] - t[j]) : t[i - j]; }
  __device__ __forceinline__ float from_start(int i) const { return GATED ? fast_exp2(t[i]) : t[i + 1]; }
  __device__ __forceinline__ float to_end(int j, int rows) const {
    return GATED ? fast_exp2(t[rows - 1] - t[j]) : t[rows - 1 - j];
  }
  __device__ __forceinline__ float whole(int rows) const { return GATED ? fast_exp2(t[rows - 1]) : t[rows]; }
};

// mask_decay's per-token gate for row tile W (rows 16 W + g, + 8 of 64 columns; d: the chunk's
// cumulative gates; cols: the warp's table).
template <int W>
__device__ __forceinline__ void gated_mask(float (&A)[8][4], int g, int t, const ChunkDecay<true>& d, float* cols) {
  constexpr int R = 16 * W;
  const int lane = g * 4 + t;
  if (W > 0) {
    __syncwarp();  // the warp's lanes are done reading the last chunk's table
    if (lane < R) cols[lane] = d.between(R, lane);
    if (lane + 32 < R) cols[lane + 32] = d.between(R, lane + 32);
    __syncwarp();
  }
  const float r[2] = {d.between(R + g, R), d.between(R + g + 8, R)};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    if (nt < 2 * W) {
      const float2 c = *(const float2*)&cols[nt * 8 + 2 * t];
#pragma unroll
      for (int e = 0; e < 4; ++e) A[nt][e] *= r[e >> 1] * (e & 1 ? c.y : c.x);
    } else if (nt < 2 * W + 2) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = R + g + (e >> 1) * 8, j = nt * 8 + 2 * t + (e & 1);
        const bool above = nt == 2 * W + 1 && e < 2;  // rows g of the block's right half: all above the diagonal
        A[nt][e] = !above && j <= i ? A[nt][e] * d.between(i, j) : 0.f;
      }
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) A[nt][e] = 0.f;
    }
  }
}

// Decay of the in-chunk scores (rows i, columns j of row tile row0 / 16, a 16 x 64 fragment set)
// and causal mask: from the role's table of powers (g_gamma), or, per-token (GATED: the generic
// kernel only; `cols`: this warp's table, see CULA_GATE_COLS), factored from the chunk's cumulative
// gates: on the diagonal 16 x 16 block each factor its own 2^{G_i - G_j} and left of it,
// j < r = row0 <= i, 2^{G_i - G_r} 2^{G_r - G_j}, both <= 1 (so no overflow, and no underflow the
// factor itself would not have), the second from the table that the warp's lanes fill, one or two
// exponentials each: 6-10 exponentials per thread and chunk, not 32. The generic kernel's output
// warps compute the mask between mma.sync (B2 T8192 H32 forced generic, H200: 0.2300 -> 0.2236
// ms). The sm90a kernel's per-token mask is gated_factors / gated_apply (below): there the table's
// round trip through shared memory cost more than the exponentials saved (0.1756 -> 0.1774).
template <bool GATED>
__device__ __forceinline__ void mask_decay(float (&A)[8][4], int row0, int g, int t, const ChunkDecay<GATED>& d,
                                           float* cols) {
  if constexpr (!GATED) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = row0 + g + (e >> 1) * 8, j = nt * 8 + 2 * t + (e & 1);
        A[nt][e] = j <= i ? A[nt][e] * d.between(i, j) : 0.f;
      }
  } else {
    switch (row0 >> 4) {  // (the same across the warp: each tile's own code, no selects between them)
      case 0: gated_mask<0>(A, g, t, d, cols); break;
      case 1: gated_mask<1>(A, g, t, d, cols); break;
      case 2: gated_mask<2>(A, g, t, d, cols); break;
      default: gated_mask<3>(A, g, t, d, cols);
    }
  }
}

// The sm90a output warpgroup's per-token mask in two halves, so that its exponentials run while
// Q K^T is on the tensor cores: gated_factors, 2^{G_i - G_j} for each of the thread's 32 scores
// (those above the diagonal too, where the factor may be inf: gated_apply does not use them), and,
// once P has landed, gated_apply: each score on or below the diagonal times its factor, 0 above.
// Computed after the wait for P (one exponential per score, as mask_decay did), they were the
// longest part of the output's path from P to the s_empty arrive the state warpgroup waits for:
// 166 SASS instructions a warp there, 64 now (ncu). B2 T8192 H32 per-token g, H200, in turns with
// the old code: 0.1737 -> 0.1711 ms (0.985), and 0.997 more with the float2 loads; the same bits.
__device__ __forceinline__ void gated_factors(float (&F)[8][4], int row0, int g, int t, const ChunkDecay<true>& d) {
  const float gi[2] = {d.t[row0 + g], d.t[row0 + g + 8]};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const float2 gj = *(const float2*)&d.t[nt * 8 + 2 * t];  // (columns 2 t, 2 t + 1: one load)
#pragma unroll
    for (int e = 0; e < 4; ++e) F[nt][e] = fast_exp2(gi[e >> 1] - (e & 1 ? gj.y : gj.x));
  }
}
// (A select, not a factor of 0 above the diagonal: ptxas moved the products by a known 0 above
// the wait for P and then waited for Q S there too, C7517.)
__device__ __forceinline__ void gated_apply(float (&A)[8][4], const float (&F)[8][4], int row0, int g, int t) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = row0 + g + (e >> 1) * 8, j = nt * 8 + 2 * t + (e & 1);
      A[nt][e] = j <= i ? A[nt][e] * F[nt][e] : 0.f;
    }
}

// The state's share of o, q_i S, decayed to row i of the chunk (2^{g (i+1)}, or 2^{G_i}) on the
// rows row0 + g and row0 + g + 8 of a 16 x 64 accumulator set.
template <bool GATED>
__device__ __forceinline__ void decay_state_share(float (&O)[8][4], int row0, int g, const ChunkDecay<GATED>& d) {
  const float f0 = d.from_start(row0 + g), f1 = d.from_start(row0 + g + 8);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    O[nt][0] *= f0;
    O[nt][1] *= f0;
    O[nt][2] *= f1;
    O[nt][3] *= f1;
  }
}

// The A operand of k-step kk of K^T V for state rows [m0, m0+16): 16 keys x 16 tokens of K^T,
// each token j scaled by its decay to the chunk end (0 past the end).
template <typename T, bool GATED, typename Tile>
__device__ __forceinline__ void key_fragment(u32 (&a)[4], const Tile& tk, int kk, int m0, int lane, int t, int rows,
                                             const ChunkDecay<GATED>& d) {
  float f[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int j = kk * 16 + 2 * t + (e & 1) + (e >> 1) * 8;
    f[e] = j < rows ? d.to_end(j, rows) : 0.f;
  }
  ldsm_x4_trans(a, tk.at(kk * 16 + (lane & 7) + ((lane >> 4) & 1) * 8, m0 + ((lane >> 3) & 1) * 8));
  a[0] = scale2<T>(a[0], f[0], f[1]);
  a[1] = scale2<T>(a[1], f[0], f[1]);
  a[2] = scale2<T>(a[2], f[2], f[3]);
  a[3] = scale2<T>(a[3], f[2], f[3]);
}

// ---- the TMA ring (both variants) -------------------------------------------------------------
template <int D, int STAGES>
struct TmaSmem {  // every array is a multiple of 1 KiB: all stay 1024-byte aligned
  u16 q[STAGES][CULA_CHUNK * D];  // a ring of STAGES chunks
  u16 k[STAGES][CULA_CHUNK * D];
  u16 v[STAGES][CULA_CHUNK * CULA_BLOCK_V];
  u16 s[2][D * CULA_BLOCK_V];  // 16-bit copies of the state at chunk c's start in s[c % 2], swizzled like a box
  u16 vd[2][CULA_CHUNK * CULA_BLOCK_V];  // sm90a: decayed copies of chunk c's value box in vd[c % 2]
  u16 o[2][CULA_CHUNK * CULA_BLOCK_V];   // chunk c's o box on its way out by TMA in o[c % 2]
  u64 full[STAGES];   // the stage's boxes have landed (TMA transaction count)
  u64 empty[STAGES];  // every consumer thread is done with the stage
  u64 s_full[2];      // s[b] holds the next state
  u64 s_empty[2];     // the output warpgroup of the chunk is done reading s[b]
  u64 vd_full[2];     // vd[b] holds the next decayed value box
  u64 vd_empty[2];    // the state warpgroup is done reading vd[b]
  u64 tail[2];        // a last chunk's rows past the end are cleared (by gc % 2: chunk_producer)
  // *_gated only, last, so that the other kernels' shared memory (CULA_CHUNK_SMEM_BYTES) ends before
  // them: the stages' cumulative log2 gates (ChunkDecay), written by the producer, and the generic
  // kernel's output warps' gate factors (output_table; in the sm90a kernel the decay warps' factors
  // of two chunks, RowsToEnd).
  float G[STAGES][CULA_CHUNK];
  float cols[CULA_GENERIC_OUT_WGS][CULA_GATE_COLS];
  static __device__ TmaSmem& get(unsigned char* raw) { return smem_aligned_1024<TmaSmem>(raw); }
};

// Chunk rows [tok0, tok0 + C) of q, k (D/64 boxes each) and of the value slice (one box).
template <int D, int STAGES, bool STATES>
__device__ __forceinline__ void tma_load_chunk(TmaSmem<D, STAGES>& sm, const CulaChunkParams& p, const HeadRows& hr,
                                               int h, int vb, int buf, long long tok0) {
  constexpr int C = CULA_CHUNK, BV = CULA_BLOCK_V;
  const u32 bar = smem_addr(&sm.full[buf]);
  // Whole boxes, rows past the tensor's end included; the states pass needs no q.
  const u32 bytes = ((STATES ? 1 : 2) * C * D + C * BV) * 2;
  mbar_expect_tx(bar, bytes);
  const int y = (int)(hr.bos + tok0);
#pragma unroll
  for (int j = 0; j < D / 64; ++j) {
    if (!STATES) tma_load_2d(&sm.q[buf][j * C * 64], &p.tma_q, h * D + j * 64, y, bar);
    tma_load_2d(&sm.k[buf][j * C * 64], &p.tma_k, h * D + j * 64, y, bar);
  }
  tma_load_2d(sm.v[buf], &p.tma_v, h * D + vb * BV, y, bar);
}

// The persistent prefill: a grid of one CTA per SM (unless CULA_CHUNK_CTAS says otherwise), CTA b
// taking the work items b, b + gridDim.x, ... An item is (value slice vb, head h, piece z of a
// sequence), vb counting fastest, so that the two value slices of a head, which read the same q
// and k, run side by side.
// Every role walks the same items and counts their chunks alike: the ring's stage and phase and
// the hand-over buffers go by gc, the CTA's chunks before the chunk, and the phase of `tail[b]` by
// ntail[b], the CTA's last partial chunks before with b = gc % 2. While one role finishes an item
// the others start on the next (the producer loads its first chunks, the state warpgroup loads
// its initial state).
// Each role but the producer keeps its own decay table (role_powers): pw[r] for role slot r, named
// barrier CULA_TABLE_BAR + r (barrier 0 is __syncthreads, 1 the sm90a output warpgroup's o store).
#define CULA_ROLE_TABLES 3
#define CULA_TABLE_BAR 2

// The generic *_gated kernels' output warps keep no table of powers: each keeps the factors of its
// row tile w's scores left of the diagonal block (mask_decay), 16 w floats at 8 w (w - 1) of its
// warpgroup's table (TmaSmem::cols).
static_assert(CULA_GATE_COLS == 8 * 3 * 4, "row tiles 1-3 of a warpgroup: 16 + 32 + 48 floats");
template <bool GATED, int D, int STAGES>
__device__ __forceinline__ float* output_table(TmaSmem<D, STAGES>& sm, float (&pw)[CULA_ROLE_TABLES][CULA_CHUNK + 1],
                                               int ow) {
  return GATED ? sm.cols[ow] : pw[ow];
}

struct ChunkItem {
  ChunkPiece piece;
  int h, vb, nchunks;
  int last_rows;  // the rows of its last chunk (1..C)
  int gc;         // the CTA's chunks before this item's first
  int ntail0, ntail1;  // the CTA's last partial chunks before this item's with gc % 2 = 0, 1
  __device__ __forceinline__ int rows(int c) const { return c + 1 < nchunks ? CULA_CHUNK : last_rows; }
  // (scalars and selects: an indexed array put the whole item in local memory)
  __device__ __forceinline__ int ntail(int gc) const { return gc & 1 ? ntail1 : ntail0; }
};
template <int D, bool STATES>
struct ItemWalk {  // for (ItemWalk<D, STATES> walk; walk.next(p);) { walk.it ... }
  ChunkItem it;
  int i;
  __device__ __forceinline__ ItemWalk() : i((int)blockIdx.x - (int)gridDim.x) {
    it.gc = it.ntail0 = it.ntail1 = it.nchunks = 0;
    it.last_rows = CULA_CHUNK;
  }
  __device__ __forceinline__ bool next(const CulaChunkParams& p) {
    constexpr int SLICES = D / CULA_BLOCK_V;
    const int pieces = STATES ? p.parts - 1 : p.parts;  // the states pass skips each sequence's last piece
    if (it.last_rows < CULA_CHUNK) {
      const bool odd = (it.gc + it.nchunks - 1) & 1;
      it.ntail0 += !odd;
      it.ntail1 += odd;
    }
    it.gc += it.nchunks;
    i += gridDim.x;
    if (i >= SLICES * p.heads * p.seqs.num_seqs * pieces) return false;  // items + grid < 2^31 (the host checks)
    it.vb = i % SLICES;
    it.h = (i / SLICES) % p.heads;
    it.piece = chunk_piece<D, CULA_BLOCK_V>(p, it.h, it.vb, i / (SLICES * p.heads), pieces);
    // The same across the warp, which the compiler cannot know of values loaded from cu_seqlens:
    // broadcast, so that the chunk counts stay in uniform registers.
    it.nchunks = __shfl_sync(0xffffffffu, (int)((it.piece.hr.len + CULA_CHUNK - 1) / CULA_CHUNK), 0);
    it.last_rows = __shfl_sync(0xffffffffu, (int)(it.piece.hr.len - (long long)(it.nchunks - 1) * CULA_CHUNK), 0);
    return true;
  }
};

// The producer warp: loads chunk after chunk into the ring as stages free up. The boxes of an
// item's last chunk hold, past the piece's end, whatever follows it in memory (the next sequence,
// or zeros past the tensor): once they land it clears those rows (a row of a box is 128
// contiguous bytes whatever the swizzle) and signals `tail[gc % 2]`, which the consumers wait on
// instead of `full`. A `tail` completes once per such chunk, so before it is signalled again every
// consumer must be past the previous one: done with that chunk (the stage's `empty`), which the
// wait for a free stage only covers when it is STAGES chunks back or more. Two of them, by gc % 2,
// so that every consumer waits for a `tail`'s phases in order (a parity wait cannot tell a phase
// from the one two before): the generic kernel's two output warpgroups take alternate chunks, and
// with one `tail` a warpgroup could wait for a partial chunk's phase while the other's, the one
// before, was still pending, and pass at once (seen with per-token gates: NaN from rows not yet
// cleared).
// GATED: every lane loads the gates of 2 of a chunk's tokens AHEAD chunks before the chunk's turn,
// and after its TMA loads writes their cumulative log2 gates into G[stage] and arrives on the
// stage's `full` too (its count is 33 then; the arrivals release those writes to the consumers'
// waits). AHEAD 0: at the chunk's turn, before the wait for a free stage (which hides the loads'
// latency when the ring is full). The scan waits for the loads, and so does the next chunk's TMA
// issue behind it. With the gates 2 chunks ahead the sm90a kernel is 1.2-1.8% faster (B2 T8192
// H32, g [B, T, H] float32, H200, two machines: 0.1740 -> 0.1719 ms, 0.1755 -> 0.1724; 3 ahead
// 0.1731), the generic one 0-1.2% slower (0.2224 -> 0.2247), so that one keeps AHEAD 0. Without
// any gate loads (a bound, not a kernel) the two took 0.1698 and 0.2198.
template <int D, int STAGES, bool STATES, bool GATED, int AHEAD>
__device__ __forceinline__ void chunk_producer(TmaSmem<D, STAGES>& sm, const CulaChunkParams& p) {
  constexpr int C = CULA_CHUNK;
  const int lane = threadIdx.x & 31;
  int last_tail0 = -STAGES, last_tail1 = -STAGES;  // the CTA's chunks that last signalled tail[0], tail[1]
  for (ItemWalk<D, STATES> walk; walk.next(p);) {
    const ChunkItem& it = walk.it;
    const HeadRows& hr = it.piece.hr;
    // GATED: chunk c's gates of tokens 2 lane, 2 lane + 1 (past the piece: 0) into ga[k], gb[k]
    // (chunks c, .., c + AHEAD at chunk c's turn)
    const auto gates = [&](int c, float& a, float& b) {
      if (!GATED || c >= it.nchunks) return;
      const int rows = it.rows(c);
      const long long tok = hr.bos + (long long)c * C + 2 * lane;
      if (2 * lane < rows) a = load_scalar(p.g, p.g_dtype, tok * p.heads + it.h);
      if (2 * lane + 1 < rows) b = load_scalar(p.g, p.g_dtype, (tok + 1) * p.heads + it.h);
    };
    float ga[AHEAD + 1] = {}, gb[AHEAD + 1] = {};
#pragma unroll
    for (int k = 0; k < AHEAD; ++k) gates(k, ga[k], gb[k]);
    for (int c = 0; c < it.nchunks; ++c) {
      const int gc = it.gc + c, buf = gc % STAGES;
      const int rows = it.rows(c);
      gates(c + AHEAD, ga[AHEAD], gb[AHEAD]);
      const float a = ga[0], b = gb[0];
#pragma unroll
      for (int k = 0; k < AHEAD; ++k) {
        ga[k] = ga[k + 1];
        gb[k] = gb[k + 1];
      }
      ga[AHEAD] = gb[AHEAD] = 0.f;
      if (gc >= STAGES) mbar_wait(&sm.empty[buf], ((gc / STAGES) + 1) & 1);
      if (lane == 0) tma_load_chunk<D, STAGES, STATES>(sm, p, hr, it.h, it.vb, buf, (long long)c * C);
      if (GATED) {
        float incl = a + b;  // the pair's sum, then the inclusive scan of the pairs
#pragma unroll
        for (int m = 1; m < 32; m <<= 1) {
          const float x = __shfl_up_sync(0xffffffffu, incl, m);
          if (lane >= m) incl += x;
        }
        const float before = incl - (a + b);
        *(float2*)&sm.G[buf][2 * lane] = make_float2((before + a) * CULA_LOG2E, incl * CULA_LOG2E);
        mbar_arrive(&sm.full[buf]);
      }
      if (rows < C) {
        const int last = gc & 1 ? last_tail1 : last_tail0;
        if (last > gc - STAGES) mbar_wait(&sm.empty[last % STAGES], (last / STAGES) & 1);
        if (gc & 1)
          last_tail1 = gc;
        else
          last_tail0 = gc;
        mbar_wait(&sm.full[buf], (gc / STAGES) & 1);
        const int n = (C - rows) * 8;  // 16-byte pieces per box
        for (int i = lane; i < n * (2 * (D / 64) + 1); i += 32) {
          const int box = i / n, piece = i % n;
          u16* base = box < D / 64 ? sm.q[buf] + box * C * 64
                     : box < 2 * (D / 64) ? sm.k[buf] + (box - D / 64) * C * 64 : sm.v[buf];
          *(uint4*)(base + rows * 64 + piece * 8) = make_uint4(0, 0, 0, 0);
        }
        fence_async_smem();
        mbar_arrive(&sm.tail[gc & 1]);  // every lane: each releases its own stores
      }
    }
  }
}

// A consumer's wait for the CTA's chunk gc (rows valid rows) of an item it.
template <int D, int STAGES>
__device__ __forceinline__ void wait_chunk(TmaSmem<D, STAGES>& sm, int gc, int rows, const ChunkItem& it) {
  if (rows < CULA_CHUNK)
    mbar_wait(&sm.tail[gc & 1], it.ntail(gc) & 1);
  else
    mbar_wait(&sm.full[gc % STAGES], (gc / STAGES) & 1);
}

// The ring's and the hand-overs' mbarriers, set up by thread 0, then a barrier for the CTA (from
// here on the roles run apart): a stage is free again after `consumers` arrivals, a decayed value
// box (sm90a) is full after `decayers`.
template <int D, int STAGES, bool GATED>
__device__ __forceinline__ void init_barriers(TmaSmem<D, STAGES>& sm, u32 consumers, u32 decayers) {
  if (threadIdx.x == 0) {
    for (int b = 0; b < STAGES; ++b) {
      mbar_init(&sm.full[b], GATED ? 33 : 1);
      mbar_init(&sm.empty[b], consumers);
    }
    for (int b = 0; b < 2; ++b) {
      mbar_init(&sm.s_full[b], 128);
      mbar_init(&sm.s_empty[b], 128);
      mbar_init(&sm.vd_full[b], decayers);
      mbar_init(&sm.vd_empty[b], 128);
    }
    mbar_init(&sm.tail[0], 32);
    mbar_init(&sm.tail[1], 32);
    mbar_init_fence();
  }
  __syncthreads();
}

// The state warpgroup's hand-over of the state at the start of the CTA's chunk gc: a 16-bit copy
// into s[gc % 2], once the output warps of chunk gc - 2 are done reading it.
template <typename T, int D, int STAGES, int MT, typename Row0>
__device__ __forceinline__ void hand_over_state(TmaSmem<D, STAGES>& sm, float (&S)[MT][32], Row0 row0, int gc) {
  const int b = gc & 1;
  if (gc >= 2) mbar_wait(&sm.s_empty[b], ((gc >> 1) + 1) & 1);
  copy_stmatrix<T>(S, row0, SwizzledTile{sm.s[b], D});
  fence_async_smem();  // wgmma (sm90a) reads it through the async proxy
  mbar_arrive(&sm.s_full[b]);
}

// A state warpgroup's start of an item (decay table pw, named barrier `bar`): the table, the
// initial state into S and its hand-over for the item's first chunk. Returns where the item's
// final state goes (piece_final_state).
template <typename T, bool STATES, bool GATED, int D, int STAGES, int MT, typename Row0>
__device__ __forceinline__ float* begin_state_item(TmaSmem<D, STAGES>& sm, const CulaChunkParams& p,
                                                   const ChunkItem& it, float* pw, int bar, float (&S)[MT][32],
                                                   Row0 row0) {
  const float glog2 = role_powers<GATED>(pw, p, it.h, threadIdx.x & 127, 128, bar);
  load_state<D, CULA_BLOCK_V, STATES>(S, row0, p, it.piece, it.h, it.vb, glog2);
  float* const out = piece_final_state<D, CULA_BLOCK_V, STATES>(p, it.piece, it.h, it.vb);
  if (!STATES && it.nchunks > 0) hand_over_state<T>(sm, S, row0, it.gc);
  return out;
}

// The CTA's chunk gc: this warp's o rows (its accumulators: rows row0 + {g, g+8}), times the
// scale. A whole chunk goes out through the o box `box` (o[gc % 2], 64 rows) by TMA; storing the
// accumulators directly, 4 bytes per row and column tile, took half the sm_90a kernel's time. An
// item's last partial chunk is stored directly, since a box would write over the rows after it.
//   PER_WARP (generic): each warp stores its own 16 rows (tma_o has boxes of 16 rows) once its lane
//     0 has seen its previous store finish reading them, with no barrier across the warpgroup.
//   else (sm90a): thread 0 stores the warpgroup's 64 rows after the named barrier `bar`. The box
//     was last read by the store of chunk gc-2, which thread 0's wait before chunk gc-1's barrier
//     saw finish reading; a partial chunk passes the same wait and barrier, for the next item's
//     first chunk.
template <typename T, int D, bool PER_WARP>
__device__ __forceinline__ void store_chunk_o(u16* box, float (&O)[1][32], const CulaChunkParams& p, const HeadRows& hr,
                                              long long tok0, int rows, int h, int vb, int row0, int bar) {
  const int tid = threadIdx.x & 127, lane = tid & 31, x = h * D + vb * CULA_BLOCK_V;
  if (rows < CULA_CHUNK) {
    store_o<T, 8>(hr.o, reinterpret_cast<float(&)[8][4]>(O), tok0, row0, lane >> 2, lane & 3, rows, hr.row_stride,
                  p.scale);
  } else {
    if (PER_WARP) {
      if (lane == 0) bulk_wait_read();
      __syncwarp();
    }
    copy_stmatrix<T>(O, [row0](int) { return row0; }, SwizzledTile{box, CULA_CHUNK}, p.scale);
    fence_async_smem();
    if (PER_WARP) {
      __syncwarp();
      if (lane == 0) tma_store_2d(&p.tma_o, box + row0 * 64, x, (int)(hr.bos + tok0) + row0);
    }
  }
  if (!PER_WARP) {
    if (tid == 0) bulk_wait_read();
    asm volatile("bar.sync %0, 128;" ::"r"(bar) : "memory");  // the warpgroup's own barrier
    if (tid == 0 && rows == CULA_CHUNK) tma_store_2d(&p.tma_o, box, x, (int)(hr.bos + tok0));
  }
}

// ---- generic variant --------------------------------------------------------------------------
// The sm_90a kernel's roles and ring with warp-level mma.sync (m16n8k16) in place of wgmma, which
// the sm_100 family lacks. Operands come from the swizzled boxes by ldmatrix (each lane's address
// is a row's 16 contiguous bytes, wherever the swizzle put them). CULA_GENERIC_OUT_WGS output
// warpgroups take alternate chunks: one alone is latency-bound (H200, B2 T8192 H32: 0.43 ms with
// one, 0.28 with two). The state update scales the k fragments by each token's decay in registers,
// so no decayed value boxes are made.

// The state warpgroup (decay table pw, named barrier `bar`): per item, S <- 2^{g L} S +
// (decayed K)^T V chunk after chunk, handing each chunk's start state over (hand_over_state).
template <typename T, int D, int STAGES, bool STATES, bool GATED>
__device__ __forceinline__ void chunk_state_generic(TmaSmem<D, STAGES>& sm, const CulaChunkParams& p,
                                                    float* pw, int bar) {
  constexpr int C = CULA_CHUNK, MT = D / 64;
  const int lane = threadIdx.x & 31, warp = (threadIdx.x & 127) >> 5, t = lane & 3;
  const auto row0 = [warp](int mt) { return mt * 64 + warp * 16; };
  for (ItemWalk<D, STATES> walk; walk.next(p);) {
    const ChunkItem& it = walk.it;
    float S[MT][32];
    float* const out = begin_state_item<T, STATES, GATED>(sm, p, it, pw, bar, S, row0);
    for (int c = 0; c < it.nchunks; ++c) {
      const int gc = it.gc + c, buf = gc % STAGES;
      const int rows = it.rows(c);
      wait_chunk(sm, gc, rows, it);
      const ChunkDecay<GATED> dc{GATED ? sm.G[buf] : pw};
      const float gl = dc.whole(rows);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 32; ++e) S[mt][e] *= gl;
      const SwizzledTile tk{sm.k[buf], C}, tv{sm.v[buf], C};
#pragma unroll
      for (int kk = 0; kk < C / 16; ++kk) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) key_fragment<T>(a[mt], tk, kk, row0(mt), lane, t, rows, dc);
        mma_state_rows<T>(S, a, tv, kk, lane);
      }
      mbar_arrive(&sm.empty[buf]);
      if (!STATES && c + 1 < it.nchunks) hand_over_state<T>(sm, S, row0, gc + 1);
    }
    store_state<D>(S, row0, out);
  }
}

// Output warpgroup ow (decay table pw, or its gate tables: output_table; named barrier `bar`):
// the CTA's chunks gc with gc % CULA_GENERIC_OUT_WGS = ow. For chunk gc, A = Q K^T (every key
// tile: branching around the masked ones cost more than their mma.sync, 0.234 -> 0.217 ms at B2
// T8192 H32) and O = Q S_gc (from s[gc % 2]) in one pass over the q fragments, the decay mask on
// A, O = 2^{g(i+1)} O + A V, then each warp stores its rows (store_chunk_o, box o[gc % 2]). Two
// output warpgroups at most: chunks gc and gc + 2 may share o[gc % 2] only when they belong to the
// same warpgroup (whose warps wait for their own earlier stores before writing a box again).
static_assert(CULA_GENERIC_OUT_WGS >= 1 && CULA_GENERIC_OUT_WGS <= 2, "o boxes are shared per warpgroup");
template <typename T, int D, int STAGES, bool GATED>
__device__ __forceinline__ void chunk_output_generic(TmaSmem<D, STAGES>& sm, const CulaChunkParams& p,
                                                     float* pw, int bar) {
  constexpr int C = CULA_CHUNK, W = CULA_GENERIC_OUT_WGS;
  const int ow = threadIdx.x >> 7, tid = threadIdx.x & 127, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // Row tile w (16 rows) of this warp: the causal mask leaves A V w + 1 of its 4 k-steps, so the
  // second warpgroup takes the row tiles in reverse and each SM sub-partition (warp index mod 4)
  // gets the same work over two chunks.
  const int w = ow ? 3 - (tid >> 5) : tid >> 5;
  for (ItemWalk<D, false> walk; walk.next(p);) {
    const ChunkItem& it = walk.it;
    role_powers<GATED>(pw, p, it.h, tid, 128, bar);
    const HeadRows& hr = it.piece.hr;
    for (int c = (ow - it.gc % W + W) % W; c < it.nchunks; c += W) {
      const int gc = it.gc + c, buf = gc % STAGES;
      const long long tok0 = (long long)c * C;
      const int rows = it.rows(c);
      const SwizzledTile tq{sm.q[buf], C}, tk{sm.k[buf], C}, tv{sm.v[buf], C}, ts{sm.s[gc & 1], D};
      wait_chunk(sm, gc, rows, it);
      mbar_wait(&sm.s_full[gc & 1], (gc >> 1) & 1);
      float A[8][4], O[8][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) A[nt][e] = O[nt][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        u32 a[4];
        ldsm_a(a, tq, w * 16, kk, lane);
        mma_times_tile_t<T>(A, a, tk, kk, lane);  // all four key tiles: mask_decay zeroes those above the diagonal
        mma_tile_rows<T>(O, a, ts, kk, lane);
      }
      mbar_arrive(&sm.s_empty[gc & 1]);
      const ChunkDecay<GATED> dc{GATED ? sm.G[buf] : pw};
      mask_decay<GATED>(A, w * 16, g, t, dc, pw + 8 * w * (w - 1));
      decay_state_share(O, w * 16, g, dc);
#pragma unroll
      for (int kk = 0; kk < C / 16; ++kk) {
        if (kk > w) continue;  // A is zero there
        u32 a[4];
        score_fragment<T>(a, A, kk);
        mma_tile_rows<T>(O, a, tv, kk, lane);
      }
      mbar_arrive(&sm.empty[buf]);
      store_chunk_o<T, D, true>(sm.o[gc & 1], reinterpret_cast<float(&)[1][32]>(O), p, hr, tok0, rows, it.h, it.vb,
                                w * 16, 0);
    }
  }
  if (lane == 0) bulk_wait();  // this warp's stores are done
}

// CULA_GENERIC_THREADS: the output warpgroups, the state warpgroup and the producer warp (the
// sm_90a kernel's, feeding the same ring). The states pass of a split sequence runs without the
// output warpgroups.
// 416 threads (13 warps) would start with 128 registers each, and the output and state warps
// spilled (sm_100f: 36-64 bytes). So the producer warp comes with 3 idle warps, a warpgroup that
// gives up all but 40 registers (setmaxnreg.dec), for the others to take 152 (as in sm90a, each
// warpgroup's setmaxnreg on its own branch).
template <typename T, int D, int STAGES, bool STATES, bool GATED>
__device__ __forceinline__ void chunk_fwd_generic(const CulaChunkParams& p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  TmaSmem<D, STAGES>& sm = TmaSmem<D, STAGES>::get(smem_raw);
  __shared__ float pw[CULA_ROLE_TABLES][CULA_CHUNK + 1];
  constexpr int OUT = 128 * CULA_GENERIC_OUT_WGS;
  const int role = __shfl_sync(0xffffffffu, threadIdx.x < OUT ? 0 : threadIdx.x < OUT + 128 ? 1 : 2, 0);  // as in sm90a
  init_barriers<D, STAGES, GATED>(sm, STATES ? 128 : 256, 1);
  if (role == 2) {
    setmaxnreg_dec<40>();
    if (threadIdx.x < OUT + 160) chunk_producer<D, STAGES, STATES, GATED, 0>(sm, p);
  } else if (role == 1) {
    setmaxnreg_inc<152>();
    chunk_state_generic<T, D, STAGES, STATES, GATED>(sm, p, pw[2], CULA_TABLE_BAR + 2);
  } else if (!STATES) {
    setmaxnreg_inc<152>();
    const int ow = threadIdx.x >> 7;
    chunk_output_generic<T, D, STAGES, GATED>(sm, p, output_table<GATED>(sm, pw, ow), CULA_TABLE_BAR + ow);
  }
}

// ---- sm_90a variant ---------------------------------------------------------------------------
// The decayed copy of the value box: row j (token j of the chunk) times its decay to the chunk end,
// zero past the end; the operand of the state update (d.to_end(j, rows): ChunkDecay<false>'s table,
// or RowsToEnd below). Same swizzle as the box (a row's 16-byte pieces only move within the row), so
// piece i of one is piece i of the other.
// Thread `tid` of N takes pieces tid, tid + N, ..., B passes at a time: their loads first, then
// their stores (the compiler cannot tell the two boxes apart, and kept each pass's load behind the
// last pass's store: a shared-memory round trip, an exponential and a store in turn, six times a
// chunk). Session 47, B2 T8192 H32 sm90a, H200, new / old in turns: B = 2 0.979 and 0.983
// (g_gamma), 1.003 and 1.006 (per-token g); B = 3 1.021, 0.997; B = 6 spills at the decay warps'
// 40 registers. Without any decay work (a bound, wrong outputs) the two rows took 0.930 and 0.954.
template <typename T, int N, typename Decay>
__device__ __forceinline__ void decay_rows(u16* dst, const u16* src, int rows, const Decay& d, int tid) {
  constexpr int PIECES = CULA_CHUNK * 8, PASSES = (PIECES + N - 1) / N, B = 2;
#pragma unroll
  for (int k0 = 0; k0 < PASSES; k0 += B) {
    uint4 x[B];
    float f[B];
#pragma unroll
    for (int k = 0; k < B; ++k) {
      const int i = tid + (k0 + k) * N, r = i >> 3;
      if (k0 + k < PASSES && (PIECES % N == 0 || i < PIECES)) {
        f[k] = r < rows ? d.to_end(r, rows) : 0.f;
        x[k] = *(const uint4*)(src + i * 8);
      }
    }
#pragma unroll
    for (int k = 0; k < B; ++k) {
      const int i = tid + (k0 + k) * N;
      if (k0 + k < PASSES && (PIECES % N == 0 || i < PIECES)) {
        x[k].x = scale2<T>(x[k].x, f[k], f[k]);
        x[k].y = scale2<T>(x[k].y, f[k], f[k]);
        x[k].z = scale2<T>(x[k].z, f[k], f[k]);
        x[k].w = scale2<T>(x[k].w, f[k], f[k]);
        *(uint4*)(dst + i * 8) = x[k];
      }
    }
  }
}

// The per-token gate's factors to the chunk end, 2^{G_{rows-1} - G_r} for rows r < rows, that the
// decay warps write together for a chunk (one exponential a row, where each of a row's 8 pieces
// took its own, and two loads of G).
struct RowsToEnd {
  const float* e;
  __device__ __forceinline__ float to_end(int r, int) const { return e[r]; }
};

// Warps 9-11 (decay table pw, named barrier `bar`): the decayed value boxes, chunk after chunk,
// the CTA's chunk gc into vd[gc % 2] for the state warpgroup. With a per-token gate they first
// write the chunk's RowsToEnd into cols[gc % 2] (the generic kernel's tables; two, so that one
// barrier a chunk keeps the next chunk's writes off the factors still being read). B2 T8192 H32
// per-token g, H200: 0.1719 -> 0.1709 ms (0.994 in turns, 3 rounds), the same bits.
template <typename T, int D, int STAGES, bool STATES, bool GATED>
__device__ __forceinline__ void chunk_decay_warps(TmaSmem<D, STAGES>& sm, const CulaChunkParams& p,
                                                  float* pw, int bar) {
  constexpr int N = CULA_SM90A_THREADS - 288;
  const int tid = threadIdx.x - 288;
  for (ItemWalk<D, STATES> walk; walk.next(p);) {
    const ChunkItem& it = walk.it;
    role_powers<GATED>(pw, p, it.h, tid, N, bar);
    for (int c = 0; c < it.nchunks; ++c) {
      const int gc = it.gc + c, b = gc & 1;
      const int rows = it.rows(c);
      wait_chunk(sm, gc, rows, it);
      if (gc >= 2) mbar_wait(&sm.vd_empty[b], ((gc >> 1) + 1) & 1);  // chunk gc-2's update is done with it
      if constexpr (GATED) {
        static_assert(CULA_GENERIC_OUT_WGS >= 2 && CULA_GATE_COLS >= CULA_CHUNK, "two chunks' factors in cols");
        float* const e = sm.cols[b];
        if (tid < CULA_CHUNK) e[tid] = ChunkDecay<true>{sm.G[gc % STAGES]}.to_end(tid, rows);
        asm volatile("bar.sync %0, %1;" ::"r"(bar), "r"(N) : "memory");
        decay_rows<T, N>(sm.vd[b], sm.v[gc % STAGES], rows, RowsToEnd{e}, tid);
      } else {
        decay_rows<T, N>(sm.vd[b], sm.v[gc % STAGES], rows, ChunkDecay<false>{pw}, tid);
      }
      fence_async_smem();
      mbar_arrive(&sm.vd_full[b]);
      mbar_arrive(&sm.empty[gc % STAGES]);
    }
  }
}

// The A operands of the CTA's chunk gc's state update (stage buf, `rows` tokens) for the warp's
// rows of each row tile (key_fragment: K^T by ldmatrix.trans, each token decayed to the chunk end).
template <typename T, int D, int STAGES, bool GATED, int MT>
__device__ __forceinline__ void state_key_operands(u32 (&a)[MT][CULA_CHUNK / 16][4], TmaSmem<D, STAGES>& sm,
                                                   const float* pw, int buf, int rows, int warp, int lane) {
  const ChunkDecay<GATED> dc{GATED ? sm.G[buf] : pw};
  const SwizzledTile tk{sm.k[buf], CULA_CHUNK};
#pragma unroll
  for (int kk = 0; kk < CULA_CHUNK / 16; ++kk)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) key_fragment<T>(a[mt][kk], tk, kk, mt * 64 + warp * 16, lane, lane & 3, rows, dc);
}

// Where the sm90a state update takes K^T from registers, decayed there (state_key_operands), with
// no decay warps: g_gamma at D = 64. B2 T8192 H32, H200, against the decay warps' value boxes (3
// rounds, two calls): D = 64 0.1142 -> 0.1040 ms (0.911, 0.909); D = 128 1.083 slower (B8 T1024
// 1.047), its state warpgroup making twice the operands, its chunk the kernel's; a per-token g 1.059
// slower at D = 128, 1.017 at D = 64, 1.019 with the producer's factors in place of the 16
// exponentials a thread, 1.024 with the next stage tested after the issue instead of waited for
// before it (notes/gated-delta-rule.md, session 54).
template <int D, bool GATED>
constexpr bool sm90a_keys_in_registers = D == 64 && !GATED;

// The state warpgroup (decay table pw, named barrier `bar`): per item, S <- 2^{g L} S + K^T V
// chunk after chunk, one chunk ahead of the output warpgroup, handing each chunk's start state
// over (hand_over_state). V is the decay warps' decayed copy (vd), or (sm90a_keys_in_registers)
// K^T, decayed, is the A operand from registers, the next chunk's made while this chunk's update
// is in flight; its stage is waited for before the update is issued (a wait between the issue and
// wgmma_wait serialises the kernel's wgmma), and so is the scaling of S (issued after the fence,
// it made ptxas wait for the first row tile's products before the second's, C7517).
template <typename T, int D, int STAGES, bool STATES, bool GATED>
__device__ __forceinline__ void chunk_state_wg(TmaSmem<D, STAGES>& sm, const CulaChunkParams& p,
                                               float* pw, int bar) {
  constexpr int C = CULA_CHUNK, BV = CULA_BLOCK_V, MT = D / 64;  // 64-row tiles of the state
  constexpr bool KEYS = sm90a_keys_in_registers<D, GATED>;
  const int warp = (threadIdx.x & 127) >> 5, lane = threadIdx.x & 31;
  // The wgmma accumulators of row tile mt (64 rows); this warp's 16 start at 64 mt + 16 warp.
  const auto row0 = [warp](int mt) { return mt * 64 + warp * 16; };
  const u64 dk0 = smem_desc(sm.k[0]), dv0 = smem_desc(KEYS ? sm.v[0] : sm.vd[0]);
  for (ItemWalk<D, STATES> walk; walk.next(p);) {
    const ChunkItem& it = walk.it;
    float S[MT][32];
    float* const out = begin_state_item<T, STATES, GATED>(sm, p, it, pw, bar, S, row0);
    u32 a[MT][C / 16][4];  // KEYS: the chunk's A operands
    if (KEYS && it.nchunks > 0) {
      wait_chunk(sm, it.gc, it.rows(0), it);
      state_key_operands<T, D, STAGES, GATED>(a, sm, pw, it.gc % STAGES, it.rows(0), warp, lane);
    }
    for (int c = 0; c < it.nchunks; ++c) {
      const int gc = it.gc + c, buf = gc % STAGES;
      const int rows = it.rows(c);
      const bool more = c + 1 < it.nchunks;
      if (!KEYS) {
        wait_chunk(sm, gc, rows, it);
        mbar_wait(&sm.vd_full[gc & 1], (gc >> 1) & 1);
      }
      const u64 dv = desc_at(dv0, (KEYS ? buf : gc & 1) * C * BV);
      const float gl = ChunkDecay<GATED>{GATED ? sm.G[buf] : pw}.whole(rows);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 32; ++e) S[mt][e] *= gl;
      if (KEYS && more) wait_chunk(sm, gc + 1, it.rows(c + 1), it);
      wgmma_fence();
      if constexpr (KEYS)
        wgmma_state_update<T, MT, C>(S, a, dv);
      else
        wgmma_state_update<T, MT, C>(S, desc_at(dk0, buf * C * D), dv);
      wgmma_commit();
      u32 an[MT][C / 16][4];
      if (KEYS && more)
        state_key_operands<T, D, STAGES, GATED>(an, sm, pw, (gc + 1) % STAGES, it.rows(c + 1), warp, lane);
      wgmma_wait<0>();
      mbar_arrive(&sm.empty[buf]);
      if (!KEYS) mbar_arrive(&sm.vd_empty[gc & 1]);
      if (KEYS && more) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int kk = 0; kk < C / 16; ++kk)
#pragma unroll
            for (int e = 0; e < 4; ++e) a[mt][kk][e] = an[mt][kk][e];
      }
      if (!STATES && more) hand_over_state<T>(sm, S, row0, gc + 1);
    }
    store_state<D>(S, row0, out);
  }
}

// The output warpgroup: for chunk c, P = Q K^T and O = Q S_c (S_c from s[c % 2]) as one batch,
// the decay mask on P while O is in flight, then O += A V and the store. A whole chunk's o goes
// out through shared memory and one TMA store (storing the accumulators directly, 4 bytes per
// row and column tile, took half the kernel's time); a last partial chunk is stored directly,
// since a box would write over the rows after the sequence.
template <typename T, int D, int STAGES, bool GATED>
__device__ __forceinline__ void chunk_output_wg(TmaSmem<D, STAGES>& sm, const CulaChunkParams& p,
                                                float* pw, int bar) {
  constexpr int C = CULA_CHUNK, BV = CULA_BLOCK_V;
  const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const u64 dk0 = smem_desc(sm.k[0]), dv0 = smem_desc(sm.v[0]), ds0 = smem_desc(sm.s[0]);
  for (ItemWalk<D, false> walk; walk.next(p);) {
    const ChunkItem& it = walk.it;
    role_powers<GATED>(pw, p, it.h, tid, 128, bar);
    const HeadRows& hr = it.piece.hr;
    for (int c = 0; c < it.nchunks; ++c) {
      const int gc = it.gc + c, buf = gc % STAGES, sb = gc & 1;
      const long long tok0 = (long long)c * C;
      const int rows = it.rows(c);
      const u64 dk = desc_at(dk0, buf * C * D), dv = desc_at(dv0, buf * C * BV), ds = desc_at(ds0, sb * D * BV);
      wait_chunk(sm, gc, rows, it);
      // Both waits before the first wgmma: a wait loop between issue and wgmma_wait makes the compiler
      // serialise every wgmma of the kernel.
      mbar_wait(&sm.s_full[sb], (gc >> 1) & 1);
      float Pacc[32], Oacc[32];
#pragma unroll
      for (int e = 0; e < 32; ++e) Pacc[e] = Oacc[e] = 0.f;  // defined inputs keep the wgmma chains in place
      // q (each warp's 16 rows, by ldmatrix) is the A operand of both Q K^T and Q S from registers:
      // 16 wgmma no longer each read it from shared memory (B2 T8192 H32 0.160 -> 0.157 ms, H200).
      u32 qf[D / 16][4];
      const SwizzledTile tq{sm.q[buf], C};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) ldsm_a(qf[kk], tq, warp * 16, kk, lane);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        WgmmaRS<T, 0>::run(Pacc, qf[kk], desc_at(dk, kmajor_step(kk, C)), 1);
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) WgmmaRS<T, 1>::run(Oacc, qf[kk], desc_at(ds, mnmajor_step(kk)), 1);
      wgmma_commit();
      const ChunkDecay<GATED> dc{GATED ? sm.G[buf] : pw};
      float(&A)[8][4] = *reinterpret_cast<float(*)[8][4]>(Pacc);
      if constexpr (GATED) {
        float F[8][4];
        gated_factors(F, warp * 16, g, t, dc);
        wgmma_wait<1>();  // P is ready; Q S runs on
        gated_apply(A, F, warp * 16, g, t);
      } else {
        wgmma_wait<1>();  // P is ready; Q S runs on
        mask_decay<GATED>(A, warp * 16, g, t, dc, nullptr);
      }
      u32 af[C / 16][4];
#pragma unroll
      for (int kk = 0; kk < C / 16; ++kk) score_fragment<T>(af[kk], A, kk);
      wgmma_wait<0>();
      mbar_arrive(&sm.s_empty[sb]);
      decay_state_share(*reinterpret_cast<float(*)[8][4]>(Oacc), warp * 16, g, dc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < C / 16; ++kk) WgmmaRS<T, 1>::run(Oacc, af[kk], desc_at(dv, mnmajor_step(kk)), 1);
      wgmma_commit();
      wgmma_wait<0>();
      mbar_arrive(&sm.empty[buf]);
      store_chunk_o<T, D, false>(sm.o[gc & 1], reinterpret_cast<float(&)[1][32]>(Oacc), p, hr, tok0, rows, it.h, it.vb,
                                 warp * 16, 1);
    }
  }
  if (tid == 0) bulk_wait();  // the stores are done
}

// Warp-specialised CTA of CULA_SM90A_THREADS: warpgroup 0 computes the outputs, warpgroup 1 carries
// the state, warp 8 feeds both through a ring of STAGES chunks and warps 9-11 make the decayed value
// boxes the state update reads (idle where sm90a_keys_in_registers). The states pass of a split
// sequence runs without warpgroup 0.
template <typename T, int D, int STAGES, bool STATES, bool GATED>
__device__ __forceinline__ void chunk_fwd_sm90a_body(const CulaChunkParams& p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  TmaSmem<D, STAGES>& sm = TmaSmem<D, STAGES>::get(smem_raw);
  __shared__ float pw[CULA_ROLE_TABLES][CULA_CHUNK + 1];
  // 0 output, 1 state, 2 producer, 3 decay; read through a shuffle so that the compiler knows it is
  // the same across the warp (else it treats each role's code as divergent and serialises every wgmma).
  const int role = __shfl_sync(0xffffffffu, threadIdx.x < 256 ? (int)(threadIdx.x >> 7) : threadIdx.x < 288 ? 2 : 3, 0);
  constexpr bool KEYS = sm90a_keys_in_registers<D, GATED>;
  constexpr u32 decayers = KEYS ? 0 : CULA_SM90A_THREADS - 288;
  init_barriers<D, STAGES, GATED>(sm, (STATES ? 128 : 256) + decayers, KEYS ? 1 : decayers);
  // 384 threads start with 168 registers each. The producer's and decay warps' warpgroup needs few
  // and hands 128 each to the pool, the output warpgroup takes 64 more: no longer held to 168, it
  // runs ~1.5% faster (H200) and cu12's NVRTC no longer spills it with q in registers. Where the
  // state warpgroup makes its own operands (sm90a_keys_in_registers), it takes the other 64.
  // Each warpgroup's setmaxnreg sits on its own branch, so that ptxas allocates that role's code
  // with it (placed before a common dispatch, it was ignored or the wgmma were serialised).
  if (role >= 2) {
    setmaxnreg_dec<40>();
    if (role == 3) {
      if constexpr (!KEYS) chunk_decay_warps<T, D, STAGES, STATES, GATED>(sm, p, pw[1], CULA_TABLE_BAR + 1);
    } else {
      chunk_producer<D, STAGES, STATES, GATED, 2>(sm, p);
    }
  } else if (role == 1) {
    if (KEYS) setmaxnreg_inc<232>();
    chunk_state_wg<T, D, STAGES, STATES, GATED>(sm, p, pw[2], CULA_TABLE_BAR + 2);
  } else if (!STATES) {
    setmaxnreg_inc<232>();
    chunk_output_wg<T, D, STAGES, GATED>(sm, p, pw[0], CULA_TABLE_BAR);
  }
}


// ---------------------------------------------------------------------------------------------
// Token-by-token recurrence
// ---------------------------------------------------------------------------------------------
// One CTA owns (sequence n, head h, CULA_REC_BLOCK_V = 32 value columns). Thread (rg, cg) with
// cg = tid % 8 and rg = tid / 8 keeps rows rg + 16 i of columns 4 cg .. 4 cg + 3 in registers.
template <typename T, int D>
__device__ __forceinline__ void recurrent_fwd(const CulaRecurrentParams& p) {
  constexpr int BV = CULA_REC_BLOCK_V, R = D / 16;
  __shared__ float sq[D], sk[D], sv[BV];
  __shared__ float4 so[4][8];
  const int vb = blockIdx.x, h = blockIdx.y, n = blockIdx.z;
  const int tid = threadIdx.x, cg = tid & 7, rg = tid >> 3, warp = tid >> 5, lane = tid & 31;
  const HeadRows hr = head_rows<D, BV>(p, n, h, vb);
  const u16 *q = hr.q, *k = hr.k, *v = hr.v;
  u16* o = hr.o;
  const long long len = hr.len, row_stride = hr.row_stride;

  long long slot = n;
  if (p.state_indices)
    slot = load_index(p.state_indices, p.state_indices_int64, n);
  if (slot < 0 || (p.state_indices && slot >= p.num_slots)) {  // padding slot: zero output, state untouched
    for (long long i = tid; i < len * (BV / 2); i += CULA_THREADS)
      *(u32*)&o[(i / (BV / 2)) * row_stride + (i % (BV / 2)) * 2] = 0u;
    return;
  }
  const long long state_off = (long long)h * D * D + vb * BV + cg * 4;  // (+ the slot's: h0_pitch, ht_pitch)
  const float decay = p.g_gamma ? fast_exp2(p.g_gamma[h] * CULA_LOG2E) : 1.f;

  float4 s[R];
#pragma unroll
  for (int i = 0; i < R; ++i)
    s[i] = p.h0 ? *(const float4*)&p.h0[slot * p.h0_pitch + state_off + (long long)(rg + 16 * i) * D]
                 : make_float4(0.f, 0.f, 0.f, 0.f);

  for (long long tk = 0; tk < len; ++tk) {
    const long long off = tk * row_stride;
    for (int i = tid; i < D; i += CULA_THREADS) {
      sq[i] = to_float<T>(q[off + i]);
      sk[i] = to_float<T>(k[off + i]);
    }
    if (tid < BV) sv[tid] = to_float<T>(v[off + tid]);
    __syncthreads();
    const float v0 = sv[cg * 4], v1 = sv[cg * 4 + 1], v2 = sv[cg * 4 + 2], v3 = sv[cg * 4 + 3];
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const float kr = sk[rg + 16 * i], qr = sq[rg + 16 * i];
      s[i].x = s[i].x * decay + kr * v0;
      s[i].y = s[i].y * decay + kr * v1;
      s[i].z = s[i].z * decay + kr * v2;
      s[i].w = s[i].w * decay + kr * v3;
      acc.x += qr * s[i].x;
      acc.y += qr * s[i].y;
      acc.z += qr * s[i].z;
      acc.w += qr * s[i].w;
    }
    // Sum over the 4 row groups of this warp (lanes differing in bits 3 and 4), then over warps.
#pragma unroll
    for (int m = 8; m <= 16; m <<= 1) {
      acc.x += __shfl_xor_sync(0xffffffffu, acc.x, m);
      acc.y += __shfl_xor_sync(0xffffffffu, acc.y, m);
      acc.z += __shfl_xor_sync(0xffffffffu, acc.z, m);
      acc.w += __shfl_xor_sync(0xffffffffu, acc.w, m);
    }
    if (lane < 8) so[warp][lane] = acc;
    __syncthreads();
    if (tid < 8) {
      float4 r = so[0][tid];
#pragma unroll
      for (int w = 1; w < 4; ++w) {
        r.x += so[w][tid].x;
        r.y += so[w][tid].y;
        r.z += so[w][tid].z;
        r.w += so[w][tid].w;
      }
      u32* dst = (u32*)&o[off + tid * 4];
      dst[0] = pack2<T>(p.scale * r.x, p.scale * r.y);
      dst[1] = pack2<T>(p.scale * r.z, p.scale * r.w);
    }
    // The next token overwrites sq/sk/sv/so only after the barrier at its top; the reads of
    // so above finish before any thread passes the next token's first barrier.
    __syncthreads();
  }
  if (p.ht) {
#pragma unroll
    for (int i = 0; i < R; ++i) *(float4*)&p.ht[slot * p.ht_pitch + state_off + (long long)(rg + 16 * i) * D] = s[i];
  }
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------
// The sm_90a variant: its body in the sm_90a cubin only (CULA_SM90A_ONLY).
template <typename T, int D, int STAGES, bool STATES, bool GATED>
__device__ __forceinline__ void chunk_fwd_sm90a(const CulaChunkParams& p) {
  CULA_SM90A_ONLY((chunk_fwd_sm90a_body<T, D, STAGES, STATES, GATED>(p)));
}

// Per dtype and head dim: the generic prefill, the sm_90a one, the states pass of a split sequence
// for both, both with a per-token gate (*_gated: no split), and the recurrences.
#define CULA_CHUNK_KERNEL(NAME, THREADS, CALL)                                                         \
  extern "C" __global__ void __launch_bounds__(THREADS, 1) NAME(const __grid_constant__ CulaChunkParams p) { \
    CALL(p);                                                                                          \
  }
#define CULA_CHUNK_KERNELS(TAG, T, D)                                                                 \
  CULA_CHUNK_KERNEL(cula_chunk_##TAG##_d##D##_generic, CULA_GENERIC_THREADS,                           \
                    (chunk_fwd_generic<T, D, CULA_STAGES, false, false>))                             \
  CULA_CHUNK_KERNEL(cula_chunk_##TAG##_d##D##_generic_states, CULA_GENERIC_THREADS,                    \
                    (chunk_fwd_generic<T, D, CULA_STAGES, true, false>))                              \
  CULA_CHUNK_KERNEL(cula_chunk_##TAG##_d##D##_generic_gated, CULA_GENERIC_THREADS,                     \
                    (chunk_fwd_generic<T, D, CULA_STAGES, false, true>))                              \
  CULA_CHUNK_KERNEL(cula_chunk_##TAG##_d##D##_sm90a, CULA_SM90A_THREADS,                               \
                    (chunk_fwd_sm90a<T, D, CULA_STAGES, false, false>))                               \
  CULA_CHUNK_KERNEL(cula_chunk_##TAG##_d##D##_sm90a_states, CULA_SM90A_THREADS,                        \
                    (chunk_fwd_sm90a<T, D, CULA_STAGES, true, false>))                                \
  CULA_CHUNK_KERNEL(cula_chunk_##TAG##_d##D##_sm90a_gated, CULA_SM90A_THREADS,                         \
                    (chunk_fwd_sm90a<T, D, CULA_STAGES, false, true>))                                \
  extern "C" __global__ void __launch_bounds__(CULA_THREADS)                                           \
      cula_recurrent_##TAG##_d##D(const CulaRecurrentParams p) {                                      \
    recurrent_fwd<T, D>(p);                                                                            \
  }                                                                                                   \
  CULA_GATED_RECURRENCE_KERNEL(cula_gated_recurrent_##TAG##_d##D, T, D, false, false, false, false, false)

CULA_CHUNK_KERNELS(bf16, bf16_tag, 64)
CULA_GATED_RECURRENCE_KERNEL(cula_gated_recurrent_bf16_d64_one, bf16_tag, 64, false, false, false, false, true)
CULA_CHUNK_KERNELS(bf16, bf16_tag, 128)
CULA_CHUNK_KERNELS(f16, f16_tag, 64)
CULA_GATED_RECURRENCE_KERNEL(cula_gated_recurrent_f16_d64_one, f16_tag, 64, false, false, false, false, true)
CULA_CHUNK_KERNELS(f16, f16_tag, 128)

// (G and cols are last: what the g_gamma kernels use ends sizeof(G) + sizeof(cols) before the struct does)
static_assert(sizeof(TmaSmem<64, CULA_STAGES>) - sizeof(TmaSmem<64, CULA_STAGES>::G) -
                      sizeof(TmaSmem<64, CULA_STAGES>::cols) + 1024 <=
                  CULA_CHUNK_SMEM_BYTES(64),
              "smem size out of sync");
static_assert(sizeof(TmaSmem<128, CULA_STAGES>) - sizeof(TmaSmem<128, CULA_STAGES>::G) -
                      sizeof(TmaSmem<128, CULA_STAGES>::cols) + 1024 <=
                  CULA_CHUNK_SMEM_BYTES(128),
              "smem size out of sync");
static_assert(sizeof(TmaSmem<64, CULA_STAGES>) + 1024 <= CULA_CHUNK_GATED_SMEM_BYTES(64), "smem size out of sync");
static_assert(sizeof(TmaSmem<128, CULA_STAGES>) + 1024 <= CULA_CHUNK_GATED_SMEM_BYTES(128), "smem size out of sync");
