// KDA's chunked prefill (chunk_kda): the gated delta rule with a per-key gate, in chunks of C = 64
// tokens; also the gated delta rule's own prefill where it runs in two launches (a scalar gate: the
// prep kernel's PerKey = false, the same state kernel). A family's kernel file declares the entry
// points with CULA_CHUNK_PREP_KERNEL and CULA_CHUNK_STATE_KERNEL.
//
// In a chunk, with G_i the cumulative log decay (a vector over the K key rows) of tokens 0..i, G_L
// that of its last token, k and q L2-normalised when asked, and products of vectors over K:
//   A_ij   = beta_i k_i . (k_j exp(G_i - G_j))        j < i
//   Aqk_ij = scale q_i . (k_j exp(G_i - G_j))          j <= i
//   W  = (I + A)^-1 diag(beta) (k exp(G)),  U0 = (I + A)^-1 diag(beta) v
//   U  = U0 - W S,   o = scale (q exp(G)) S + Aqk U,   S <- diag(exp(G_L)) S + (k exp(G_L - G))^T U
// which is the token loop exactly. Only the last line needs the state, so two launches:
//
//   prep  (kda_chunk_prep, 16 warps per CTA, chunks independent): the gates, G, the norms, A and
//         Aqk by mma.sync, the solve (common/chunk_solve.cuh) of W and U0 together (2 D columns),
//         and Qg = scale q exp(G), Kl = k exp(G_L - G), exp(G_L), into the workspace (CulaKdaChunk);
//   state (kda_chunk_state): per (sequence, value head, value slice of BV = 64 columns), the chunk
//         walk of the gated chunk kernel (common/chunk_gated.cuh) on these products: the chain
//         warpgroup U = U0 - W S and the state (its rows by TMA), the output warpgroup o from Qg,
//         Aqk and U; by warp-level mma.sync (every target) or, in the sm_90a variant,
//         warpgroup-level wgmma.
//
// exp(G_i - G_j) does not factor into exp(G_i) exp(-G_j) in floating point (G falls by up to
// 64 |g| in a chunk). A and Aqk are computed by blocks of 16 rows (r: the rows' block, m <= r: the
// keys' block) against reference rows of block r, which keep every factor bounded: with s_r = G of
// its first row and c_r = G of its row 7, moved up per key to c'_r = s_r - floor(s_r - c_r) so that
// exp(s_r - c'_r) is a power of two (and the operands of a first row, a one-token chunk's, exact),
//   XS_i   = x_i exp(G_i - s_r)  (x = q or k, i in block r; <= 1: the boxes, overwritten in place)
//   KR_r,j = k_j exp(s_r - G_j)  j < 16 r (<= 1),   k_j exp(c'_r - G_j)  j in block r
//   m < r: XS_i . KR_r,j;   m = r: (XS_i exp(s_r - c'_r)) . KR_r,j, the factor exact in 16 bits;
// both factors of the diagonal block <= exp(half the block's span of G), which the safe gate
// (g >= lower_bound >= -5) keeps below exp(40). A diagonal block whose half-span is wider than the
// 16-bit operands can hold (KdaWide: 2^96 for bf16, 2^8 for fp16) is computed element by element
// from q and k in global memory instead: exact, slower. The products are pure mma: every
// exponential is taken once per element, in the element-wise pass.
#pragma once

#include "common/chunk_gates.cuh"
#include "common/chunk_solve.cuh"
#include "common/frags.cuh"
#include "common/ptx.cuh"
#include "common/recurrence.cuh"
#include "common/seqs.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "params.h"

template <typename T> struct KdaWide;  // the widest half-span of G (log2 units) a diagonal block takes by mma
template <> struct KdaWide<bf16_tag> { static constexpr float log2 = 96.f; };
template <> struct KdaWide<f16_tag> { static constexpr float log2 = 8.f; };

// The element-wise pass's constants per row block r and key d (per-key gate; log2 units, see the
// top): c'_r, exp(s_r), exp(G_L - s_{r+1}) (r < 3) and exp(s_{r+1} - s_r) (r = 1, 2), written over
// A (KdaPrepSmem::ref_table) before its phase; s_r itself is G's row 16 r. A row i of block r then
// takes three exponentials a key: exp(G_i - s_r) (XS; times exp(s_r): exp(G_i)), exp(c'_r - G_i)
// (KR_r) and y = exp(s_{r+1} - G_i), which times the products of the later steps gives KR_{r+1}..,
// and times exp(G_L - s_{r+1}) Kl's exp(G_L - G_i) (all factors <= 1: products of them lose nothing
// but a rounding).
template <int D>
struct KdaRefTable {
  float c[4][D], e[4][D], l[4][D], p[4][D];
};

template <int D>
struct KdaPrepSmem {  // 16-bit tiles first (multiples of 1 KiB: all stay 1024-byte aligned)
  u16 q[CULA_CHUNK * D], k[CULA_CHUNK * D], v[CULA_CHUNK * D];  // the chunk's boxes (SwizzledTile)
  u16 kr[2 * CULA_CHUNK * D];            // the key tiles KR_3 (64 rows), KR_2 (48), KR_0 (16); KR_1 in kr1; then
                                         // [W | U0] in 16 bits (2 D / 64 boxes: wu_tile), their tensor copies' source
  float x[2 * D * CULA_CHUNK];           // [beta k exp(G) | beta v], the solve's right-hand sides: 2 D / 32 boxes
  float g2[CULA_CHUNK][D + 8];           // G in log2 units (rows padded: float2 fragment reads)
  float a[CULA_CHUNK][CULA_CHUNK + 4];   // A
  float dinv[CULA_CHUNK][CULA_DINV_PITCH];  // the inverses of I + A's 16-row diagonal blocks (chunk_solve.cuh)
  float beta[CULA_CHUNK], rk[CULA_CHUNK], rq[CULA_CHUNK];  // rq: scale / |q|
  float dfac[CULA_KDA_PREP_THREADS / D][D];  // the diagonal blocks' factors exp(s_r - c'_r), in [r]
  float gs[CULA_CHUNK];                  // the scalar gate's G (log2 units; g2 holds the per-key gate's)
  // The per-key G scan's totals per part of the rows (tot) and each part's first local value (fst),
  // written before the barrier that ends the scan: the threads that write the constants then take
  // the G of other parts' rows from them, where they would need a barrier after G. (Not over A:
  // warps scan the next chunk while others still solve this one, kda_prep_chunk.)
  float tot[CULA_KDA_PREP_THREADS / D][D], fst[CULA_KDA_PREP_THREADS / D][D];
  u16 kr1[2 * 16 * D];                   // KR_1 (32 rows; at a multiple of 1 KiB, as the members above add up)
  u64 bar;                               // the boxes of the chunk ahead have landed (kda_prep_load)
  static __device__ KdaPrepSmem& get(unsigned char* raw) { return smem_aligned_1024<KdaPrepSmem>(raw); }
  // X as float32 boxes of 32 columns, and [W | U0]'s 16-bit boxes over the key tiles (free from the
  // A / Aqk phase on)
  __device__ __forceinline__ SwizzledTileF32 x_tile() const { return SwizzledTileF32{x, CULA_CHUNK}; }
  __device__ __forceinline__ SwizzledTile wu_tile() const { return SwizzledTile{kr, CULA_CHUNK}; }
  // The per-key gate's box of the chunk ahead (its dtype; boxes of 128-byte rows), over G (free
  // from the A / Aqk phase to the chunk's G scan, which reads it before it writes G)
  __device__ __forceinline__ unsigned char* g_box() {
    static_assert(CULA_CHUNK * D * 4 <= sizeof(g2), "a float32 gate box fits");
    return reinterpret_cast<unsigned char*>(&g2[0][0]);
  }
  __device__ __forceinline__ KdaRefTable<D>& ref_table() {  // (over A, free until the A / Aqk phase)
    static_assert(sizeof(KdaRefTable<D>) <= sizeof(a), "the table fits in A");
    return *reinterpret_cast<KdaRefTable<D>*>(&a[0][0]);
  }
  // KR_r: the key tile of row block r (16 r + 16 rows)
  __device__ __forceinline__ SwizzledTile key_tile(int r) {
    return r == 3 ? SwizzledTile{kr, 64} : r == 2 ? SwizzledTile{kr + 64 * D, 48}
         : r == 1 ? SwizzledTile{kr1, 32} : SwizzledTile{kr + 112 * D, 16};
  }
  // The reference rows of block r at key d (log2 units; see the top): s_r and n_r = s_r - c'_r, an
  // integer, from G's rows 16 r and 16 r + 7 (ref_shift: also where the constants are written, from
  // the scan's registers; both must give the same n_r)
  static __device__ __forceinline__ float ref_shift(float s, float c) { return floorf(s - c); }
  __device__ __forceinline__ float2 refs(int r, int d) const {
    const float s = g2[16 * r][d];
    return make_float2(s, ref_shift(s, g2[16 * r + 7][d]));
  }
};

// The sums of NV values over each group of W consecutive lanes (powers of 2, NV <= W), by a
// butterfly that halves the values at each of its first log2(NV) steps (NV - 1 + log2(W / NV)
// shuffles where NV separate reductions take NV log2(W)): lane l gets the sum of value
// lanes_sum_index<NV, W>(l).
template <int NV, int W>
__device__ __forceinline__ float lanes_sum(const float (&v)[NV]) {
  static_assert(NV >= 1 && W >= NV && (NV & (NV - 1)) == 0 && (W & (W - 1)) == 0, "powers of 2");
  const int lane = threadIdx.x & 31;
  if constexpr (NV == 1) {
    float x = v[0];
#pragma unroll
    for (int o = W / 2; o >= 1; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
  } else {
    const bool hi = lane & (W / 2);  // (this half of the lanes keeps the upper half of the values)
    float a[NV / 2];
#pragma unroll
    for (int j = 0; j < NV / 2; ++j)
      a[j] = (hi ? v[j + NV / 2] : v[j]) + __shfl_xor_sync(0xffffffffu, hi ? v[j] : v[j + NV / 2], W / 2);
    return lanes_sum<NV / 2, W / 2>(a);
  }
}
template <int NV, int W>
__device__ __forceinline__ int lanes_sum_index(int lane) {
  int idx = 0;
#pragma unroll
  for (int n = NV / 2, o = W / 2; n >= 1; n /= 2, o /= 2) idx += lane & o ? n : 0;
  return idx;
}

// A packed 16-bit pair as floats.
template <typename T>
__device__ __forceinline__ float2 unpack2(u32 x) {
  return make_float2(to_float<T>((u16)(x & 0xffffu)), to_float<T>((u16)(x >> 16)));
}

// The 16-bit pair at (r, c..c+1) of a swizzled tile, as floats.
template <typename T>
__device__ __forceinline__ float2 tile_pair(const SwizzledTile& tile, int r, int c) {
  return unpack2<T>(lds_u32(tile.at(r, c)));
}

// N = 2 or 4 consecutive values (within one 16-byte piece of a swizzled tile; 4 N-byte aligned in
// memory) as floats: from and into a swizzled tile, from and into float32 shared memory, into 16-bit
// global memory.
template <int N>
struct alignas(4 * N) FloatN {
  static_assert(N == 2 || N == 4, "2 or 4 values");
  float v[N];
};
template <typename T, int N>
__device__ __forceinline__ FloatN<N> tile_get(const SwizzledTile& tile, int r, int c) {
  if constexpr (N == 2) {
    const float2 f = tile_pair<T>(tile, r, c);
    return {{f.x, f.y}};
  } else {
    const uint2 w = lds_u32x2(tile.at(r, c));
    const float2 lo = unpack2<T>(w.x), hi = unpack2<T>(w.y);
    return {{lo.x, lo.y, hi.x, hi.y}};
  }
}
template <typename T, int N>
__device__ __forceinline__ uint2 pack_n(const FloatN<N>& x) {
  return make_uint2(pack2<T>(x.v[0], x.v[1]), N == 4 ? pack2<T>(x.v[N - 2], x.v[N - 1]) : 0u);
}
template <typename T, int N>
__device__ __forceinline__ void tile_put(const SwizzledTile& tile, int r, int c, const FloatN<N>& x) {
  const uint2 w = pack_n<T, N>(x);
  if constexpr (N == 4) sts_u32x2(tile.at(r, c), w);
  else sts_u32(tile.at(r, c), w.x);
}
template <typename T, int N>
__device__ __forceinline__ void global_put(u16* dst, const FloatN<N>& x) {
  const uint2 w = pack_n<T, N>(x);
  if constexpr (N == 4) *(uint2*)dst = w;
  else *(u32*)dst = w.x;
}
template <int N>
__device__ __forceinline__ FloatN<N> smem_get(const float* src) {
  return *(const FloatN<N>*)src;
}
template <int N>
__device__ __forceinline__ void smem_put(u32 addr, const FloatN<N>& x) {
  if constexpr (N == 4) sts_f32x4(addr, make_float4(x.v[0], x.v[1], x.v[N - 2], x.v[N - 1]));
  else sts_f32x2(addr, make_float2(x.v[0], x.v[1]));
}

// Fallback of a wide diagonal block r (rows and keys 16 r .. 16 r + 15): the lane's entries of
// X K^T with the decay, element by element from the chunk's rows of x (q or k) and k in global
// memory (the boxes hold XS by now; rows past the chunk's `rows` are zero). The norms are the
// caller's, as for the mma.
template <typename T, int D>
__device__ __forceinline__ void kda_wide_diagonal(const KdaPrepSmem<D>& sm, const u16* x, const u16* k,
                                                  long long stride, int rows, int r, float (&A)[2][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const auto pair = [&](const u16* base, int i, int d) { return unpack2<T>(*(const u32*)(base + i * stride + d)); };
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 16 * r + g + 8 * (e >> 1), j = 16 * r + 8 * nt + 2 * t + (e & 1);
      float acc = 0.f;
      if (j <= i && i < rows)
        for (int d = 0; d < D; d += 2) {
          const float2 xi = pair(x, i, d), kj = pair(k, j, d);
          const float2 gi = *(const float2*)&sm.g2[i][d], gj = *(const float2*)&sm.g2[j][d];
          acc += xi.x * kj.x * fast_exp2(gi.x - gj.x) + xi.y * kj.y * fast_exp2(gi.y - gj.y);
        }
      A[nt][e] = acc;
    }
}

// What the prep kernel loads of a chunk ahead of it (issued during the previous chunk's solve, when
// the boxes are free): q, k, v into the boxes by tensor copies (whole boxes: rows past the
// sequence's end are the next sequence's, or zeros past the tensor's, and no row the chunk keeps
// depends on them), with the per-key gate's box (PerKey, when g is given: sm.g_box), completing on
// sm.bar; into registers the other gate inputs: beta[tid] (tid < C) for the per-key gate, g and beta
// of two tokens a lane of warp 0 for the scalar one (common/chunk_gates.cuh). They are not used
// until the chunk's G scan, so the loads stay in flight through the solve. One copy a warp, from
// lane 0 of warps KDA_LOAD_WARP0 on (the first also announces the bytes): the copies' address work
// runs side by side. (Warp 4 on: until session 58, warps 0-3 joined the 32-row inverses meanwhile.)
// `part` splits them in two: KdaLoadV, v's boxes alone (free once the element-wise pass has read
// them: the preps that solve X issue them there, a phase before the rest; their bytes are announced
// without an arrival, so the phase cannot end before the rest's), and KdaLoadRest, the others.
constexpr int KDA_LOAD_WARP0 = 4;
enum KdaLoadPart { KdaLoadAll, KdaLoadV, KdaLoadRest };
template <int D, bool PerKey>
struct KdaAhead {
  u32 beta;
};
template <int D>
struct KdaAhead<D, false> {
  ChunkGates gates;
};

template <int D, bool PerKey>
__device__ __forceinline__ void kda_prep_load(KdaPrepSmem<D>& sm, const CulaKdaLaunchParams& lp, long long tok0,
                                              int rows, int h, int hv, KdaAhead<D, PerKey>& ah, KdaLoadPart part) {
  constexpr int C = CULA_CHUNK, B = D / 64;  // (B: 64-column boxes of q, k and v each)
  const CulaGdnParams& p = lp.p;
  const int tid = threadIdx.x, HV = p.v_heads, m = tid / 32 - KDA_LOAD_WARP0;  // m: the warp's copy
  static_assert(KDA_LOAD_WARP0 + 3 * B + D / 32 <= CULA_KDA_PREP_THREADS / 32, "a warp a copy");
  const bool v_copy = m >= 2 * B && m < 3 * B;
  if ((tid & 31) == 0 && m >= 0 && (part == KdaLoadAll || (part == KdaLoadV) == v_copy)) {
    const bool g_box = PerKey && p.g;
    const int g_bytes = p.g_dtype == CULA_F32 ? 4 : 2, g_cols = 128 / g_bytes;  // (a box's rows: 128 bytes)
    const u32 bar = smem_addr(&sm.bar);
    const u32 v_bytes = C * D * 2, rest_bytes = 2 * C * D * 2 + (g_box ? C * D * g_bytes : 0);
    if (part == KdaLoadV && m == 2 * B) mbar_expect_tx_only(bar, v_bytes);
    if (part != KdaLoadV && m == 0) mbar_expect_tx(bar, rest_bytes + (part == KdaLoadAll ? v_bytes : 0));
    if (m < 3 * B) {
      const int x = m / B, b = m % B;  // (x: q, k, v)
      tma_load_2d((x == 0 ? sm.q : x == 1 ? sm.k : sm.v) + b * C * 64, x == 0 ? &lp.q : x == 1 ? &lp.k : &lp.v,
                  (x == 2 ? hv : h) * D + 64 * b, (int)tok0, bar);
    } else if (g_box && m - 3 * B < D / g_cols) {
      const int b = m - 3 * B;
      tma_load_2d(sm.g_box() + b * 128 * C, &lp.g, hv * D + g_cols * b, (int)tok0, bar);
    }
  }
  if (part == KdaLoadV) return;
  if constexpr (!PerKey) {
    if (tid < 32) chunk_load_gates(ah.gates, p, tok0 * HV + hv, 0, rows);
  } else {
    ah.beta = p.beta && tid < rows ? load_bits(p.beta, p.beta_dtype, (tok0 + tid) * HV + hv) : 0u;
  }
}

// The A / Aqk phase's task of warp wid of the 16: rows block r against key blocks mlo..mhi (warps
// 0-7 A, 8-15 Aqk), at most two blocks a warp, the diagonal block alone (it takes the wide test,
// and on the A side the block's inverse): r, mlo, mhi of slot wid % 8 are the nibbles of the
// constants.
__device__ __forceinline__ void kda_prep_task(int wid, int& r, int& mlo, int& mhi) {
  const int s = 4 * (wid & 7);  // slots: r0 {0} | r1 {1} | r1 {0} | r2 {2} | r2 {0,1} | r3 {3} | r3 {0,1} | r3 {2}
  r = (0x33322110 >> s) & 15, mlo = (0x20302010 >> s) & 15, mhi = (0x21312010 >> s) & 15;
}

// G of a part's rows of one key column, in log2 units: the running sum of gate(x) over the part's
// first n rows (n may be <= 0), replacing x; returns the total. (Full parts take no per-row test.)
template <typename Gate, int RP>
__device__ __forceinline__ float kda_gate_scan(const Gate& gate, int n, float (&x)[RP]) {
  float G = 0.f;
  if (n >= RP) {
#pragma unroll
    for (int i = 0; i < RP; ++i) x[i] = G += gate(x[i]);
  } else {
#pragma unroll
    for (int i = 0; i < RP; ++i) x[i] = G += i < n ? gate(x[i]) : 0.f;
  }
  return G;
}

// The scalar gate's W and U0 through the inverse (kda_prep_chunk's Inv), once A and the inverses of
// its 16-row diagonal blocks (invert_diagonal_block) are in shared memory:
//   1. T = (I + A)^-1 by the solve of (I + A) T = I (warps 0-3, 16 columns each: 64 columns where
//      the solve of X has 2 D, with the same tf32 products);
//   2. W = T diag(beta rk exp(G)) k and U0 = T diag(beta) v on the raw boxes, by mma.sync: warp
//      (rows block rb, 64-column panel pn of [W | U0]) over k-steps up to rb (T is lower
//      triangular). T's scaled columns are float32; each goes in as two 16-bit operands, hi and lo
//      = the rest (tools/precision_study.py: as accurate as the solve; one bf16 operand is not);
//   3. once every warp has read the boxes, ahead(); then [W | U0] in 16 bits into their boxes
//      (KdaPrepSmem::wu_tile), which kda_prep_chunk stores.
template <typename T, int D, typename Ahead>
__device__ __forceinline__ void kda_prep_inverse(KdaPrepSmem<D>& sm, Ahead ahead) {
  constexpr int C = CULA_CHUNK, PANELS = 2 * D / 64;
  static_assert(CULA_KDA_PREP_THREADS / 32 >= 4 * PANELS && CULA_KDA_PREP_THREADS / 32 >= C / 16, "a warp a task");
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const SwizzledTileF32 xs = sm.x_tile();
  if (wid < C / 16) solve_columns<C + 4>(sm.a, sm.dinv, xs, 16 * wid, true);
  __syncthreads();  // T
  const int rb = wid & 3, pn = wid >> 2;
  const bool active = pn < PANELS, wside = pn < D / 64;
  float O[8][4] = {};
  if (active) {
    const SwizzledTile tile{(wside ? sm.k : sm.v) + (wside ? pn : pn - D / 64) * C * 64, C};
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (kk > rb) continue;  // T is zero there
      float cs[4];  // the scales of the lane's columns 16 kk + 2 t + {0, 1, 8, 9}
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = 16 * kk + 2 * t + (e & 1) + 8 * (e >> 1);
        cs[e] = wside ? sm.beta[j] * sm.rk[j] * fast_exp2(sm.gs[j]) : sm.beta[j];
      }
      u32 a[2][4];  // hi, lo; fragment register f: row g + 8 (f & 1), columns 2 t + 8 (f >> 1) + {0, 1}
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const float2 x = lds_f32x2(xs.at(16 * rb + g + 8 * (f & 1), 16 * kk + 2 * t + 8 * (f >> 1)));
        const float y0 = x.x * cs[2 * (f >> 1)], y1 = x.y * cs[2 * (f >> 1) + 1];
        a[0][f] = pack2<T>(y0, y1);
        a[1][f] = pack2<T>(y0 - to_float<T>((u16)(a[0][f] & 0xffffu)), y1 - to_float<T>((u16)(a[0][f] >> 16)));
      }
      mma_tile_rows<T, 2>(O, a, tile, kk, lane);
    }
  }
  __syncthreads();  // T and the boxes read
  ahead(KdaLoadAll);
  if (active)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        sts_u32(sm.wu_tile().at(16 * rb + g + 8 * hf, 64 * pn + 8 * nt + 2 * t),
                pack2<T>(O[nt][2 * hf], O[nt][2 * hf + 1]));
  __syncthreads();  // [W | U0]
}

// One chunk of the prep kernel (tokens tok0 .. tok0 + rows - 1 of value head hv; q / k head h), by
// the CTA's warps (CULA_KDA_PREP_THREADS / 32: each phase splits its rows or columns over all of
// them, the A / Aqk phase by kda_prep_task). Its loads were issued ahead (kda_prep_load, into ah;
// the boxes complete phase `parity` of sm.bar); ahead() issues the next chunk's, once the boxes are
// free.
//
// PerKey: KDA's per-key gate, as described at the top. Otherwise the gate is a scalar per token
// (the gated delta rule: G_i the same for every key), and the decay of A_ij and Aqk_ij is the one
// factor exp(G_i - G_j) <= 1 (j <= i), applied to the mma's products: no scaled key tiles, no wide
// blocks. The rest (norms, X, Qg, Kl, the solve, the stores) is the same code. Inv (scalar gate
// only): W and U0 through the inverse of I + A (kda_prep_inverse) instead of the solve of X.
template <typename T, int D, bool PerKey, bool Inv, typename Ahead>
__device__ __forceinline__ void kda_prep_chunk(KdaPrepSmem<D>& sm, const CulaKdaLaunchParams& lp, const InGate& ig,
                                               float bias, const KdaAhead<D, PerKey>& ah, long long tok0, int rows,
                                               long long chunk, int hv, u32 parity, Ahead ahead) {
  static_assert(!(PerKey && Inv), "the inverse path takes the scalar gate");
  constexpr int C = CULA_CHUNK, NTH = CULA_KDA_PREP_THREADS;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, g = lane >> 2, t = lane & 3;
  const CulaGdnParams& p = lp.p;
  const int HV = p.v_heads;
  const SwizzledTile tq{sm.q, C}, tk{sm.k, C}, tv{sm.v, C};

  // Two phases, each ending at a CTA barrier:
  // 1. G, per-key: thread (part, d) scans rows part * RP .. of key row d's column into registers
  //    (g = beta = 0 past the end; the gate mode and g's dtype branch outside the loops) and leaves
  //    its part's total and first value in the reference table; scalar: warp 0 (chunk_gate_scan).
  //    beta; the norms (warp wid: rows RW wid .. RW wid + RW - 1, the RW sums at once).
  // 2. Per-key: each thread adds the totals of the parts above to its rows of G; the threads of
  //    parts that start a row block r write its constants of the element-wise pass (KdaRefTable)
  //    and the diagonal factor exp(s_r - c'_r), from their own rows and the other parts' totals
  //    and first values, in the order of the sums that form those parts' G (the same floats).
  {
    constexpr int P = NTH / D, RP = C / P;
    const int d = tid % D, part = tid / D;
    float x[RP];  // (per-key: the gates of the part's rows, then their sums from the part's first row)
    if constexpr (!PerKey)
      if (wid == 0) chunk_gate_scan(sm.beta, sm.gs, ah.gates, p, ig, rows);
    mbar_wait(&sm.bar, parity);  // (the boxes, with g's in G's buffer: read here, before the first barrier)
    if constexpr (PerKey) {
      const int n = rows - part * RP;
      if (!p.g) {
#pragma unroll
        for (int i = 0; i < RP; ++i) x[i] = 0.f;
      } else if (p.g_dtype == CULA_F32) {
        const SwizzledTileF32 gt{(const float*)sm.g_box(), C};
#pragma unroll
        for (int i = 0; i < RP; ++i) x[i] = lds_f32(gt.at(part * RP + i, d));
      } else {
        const SwizzledTile gt{(const u16*)sm.g_box(), C};
        if (p.g_dtype == CULA_BF16) {
#pragma unroll
          for (int i = 0; i < RP; ++i) x[i] = to_float<bf16_tag>(lds_u16(gt.at(part * RP + i, d)));
        } else {
#pragma unroll
          for (int i = 0; i < RP; ++i) x[i] = to_float<f16_tag>(lds_u16(gt.at(part * RP + i, d)));
        }
      }
      const int mode = p.g ? p.gate_mode : CULA_GATE_RAW;
      const float G =
          mode == CULA_GATE_LOWER_BOUND ? kda_gate_scan(Log2Gate<CULA_GATE_LOWER_BOUND>(p.lower_bound, ig.a, bias), n, x)
          : mode == CULA_GATE_SOFTPLUS  ? kda_gate_scan(Log2Gate<CULA_GATE_SOFTPLUS>(p.lower_bound, ig.a, bias), n, x)
                                        : kda_gate_scan(Log2Gate<CULA_GATE_RAW>(p.lower_bound, ig.a, bias), n, x);
      sm.tot[part][d] = G, sm.fst[part][d] = x[0];
      if (tid < C)
        sm.beta[tid] = tid >= rows ? 0.f : p.beta ? beta_of(p, bits_value(ah.beta, p.beta_dtype)) : 1.f;
    }
    constexpr int RW = C / (NTH / 32);
    if (p.l2norm) {
      // 16-byte loads: a row's D / 8 pieces across PPR lanes, RPL rows a load, J loads a box; lane
      // sums s[J x + j] (x: q, k) of row RW wid + RPL j + lane / PPR, then their sums over the row's lanes.
      constexpr int PPR = D / 8, RPL = 32 / PPR, J = RW / RPL;
      static_assert(RW % RPL == 0, "whole loads");
      const int c = 8 * (lane % PPR), r0 = RW * wid + lane / PPR;
      float s[2 * J] = {};
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const uint4 w = lds_u32x4((x ? tk : tq).at(r0 + RPL * j, c));
          const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 f = unpack2<T>(ws[e]);
            s[J * x + j] += f.x * f.x + f.y * f.y;
          }
        }
      const float sum = lanes_sum<2 * J, PPR>(s);
      const int idx = lanes_sum_index<2 * J, PPR>(lane), row = RW * wid + RPL * (idx % J) + lane / PPR;
      if ((lane & (PPR / (2 * J) - 1)) == 0) {  // (the first lane of each group holding a sum)
        if (idx < J) sm.rq[row] = p.scale * rsqrtf(sum + 1e-6f);
        else sm.rk[row] = rsqrtf(sum + 1e-6f);
      }
    } else if (lane < RW) {
      sm.rq[RW * wid + lane] = p.scale, sm.rk[RW * wid + lane] = 1.f;
    }
    if constexpr (PerKey) {
      __syncthreads();  // the totals, beta, the norms
      static_assert(RP % 16 == 0 || 16 % RP == 0, "parts and row blocks nest");
      constexpr int PB = RP < 16 ? 16 / RP : 1;  // parts a row block
      KdaRefTable<D>& rt = sm.ref_table();
      float run = 0.f, above = 0.f, s1 = 0.f, gl = 0.f;  // run: the sum of the totals of parts 0 .. q - 1
#pragma unroll
      for (int q = 0; q < P; ++q) {
        if (q == part) above = run;
        if (q == part + PB) s1 = run + sm.fst[q][d];  // G of the next block's first row (the part that starts it)
        if (q == P - 1) gl = run + sm.tot[q][d];      // G_L
        run += sm.tot[q][d];
      }
#pragma unroll
      for (int i = 0; i < RP; ++i) sm.g2[part * RP + i][d] = x[i] + above;
      if (part % PB == 0) {  // the constants of row block r (see KdaRefTable): s_r, c_r are the part's rows 0 and 7
        const int r = part / PB;
        const float s = x[0] + above, nr = KdaPrepSmem<D>::ref_shift(s, x[7] + above);
        rt.c[r][d] = s - nr, rt.e[r][d] = fast_exp2(s);
        if (r < 3) {
          rt.l[r][d] = fast_exp2(gl - s1);
          if (r > 0) rt.p[r][d] = fast_exp2(s1 - s);
        }
        const int e = min(max((int)nr, -126), 127);  // 2^nr exactly (nr >= 0 for gates <= 0)
        sm.dfac[r][d] = __int_as_float((e + 127) << 23);
      }
    }
  }
  if (tid == 0) bulk_wait_read();  // (the previous chunk's tensor copies of W and U0 read their boxes)
  __syncthreads();  // G, beta, the norms, the constants

  // Element-wise: X, Qg and Kl into the workspace, and (per-key gate) XS over the q and k boxes and
  // the key tiles KR (see the top). Thread tid keeps the CW columns d .. and takes rows i0, i0 + 16,
  // .. (one of each row block: the block is the iteration; unrolled, the exponentials and
  // shared-memory latencies of the rows overlap).
  {
    constexpr int CW = D / 32, RS = NTH / (D / CW);
    static_assert(RS == 16, "a row of each block");
    const int d = CW * (tid % (D / CW)), i0 = tid / (D / CW);
    const long long at0 = ((tok0 + i0) * HV + hv) * D + d, step = (long long)RS * HV * D;
    using F = FloatN<CW>;
    const auto gate_row = [&](int i) {  // G of row i at the thread's columns
      if constexpr (PerKey) {
        return smem_get<CW>(&sm.g2[i][d]);
      } else {
        F x;
#pragma unroll
        for (int j = 0; j < CW; ++j) x.v[j] = sm.gs[i];
        return x;
      }
    };
    const F gl = gate_row(C - 1);
    const KdaRefTable<D>& rt = sm.ref_table();
#pragma unroll
    for (int br = 0; br < C / RS; ++br) {
      const int i = i0 + RS * br;
      const F gi = gate_row(i), kv = tile_get<T, CW>(tk, i, d), qv = tile_get<T, CW>(tq, i, d),
              vv = tile_get<T, CW>(tv, i, d);
      const float rk = sm.rk[i], rq = sm.rq[i], b = sm.beta[i];
      F e, kl;  // exp(G_i), exp(G_L - G_i)
      if constexpr (PerKey) {  // (XS and KR leave out 1 / |k_j| and 1 / |q_i|: the raw values where the factor is 1)
        const F s = gate_row(16 * br), c = smem_get<CW>(&rt.c[br][d]), eb = smem_get<CW>(&rt.e[br][d]);
        F xq, xk, kr;
#pragma unroll
        for (int j = 0; j < CW; ++j) {
          const float x = fast_exp2(gi.v[j] - s.v[j]);
          e.v[j] = x * eb.v[j], xq.v[j] = qv.v[j] * x, xk.v[j] = kv.v[j] * x;
          kr.v[j] = kv.v[j] * fast_exp2(c.v[j] - gi.v[j]);
        }
        tile_put<T, CW>(tq, i, d, xq);
        tile_put<T, CW>(tk, i, d, xk);
        tile_put<T, CW>(sm.key_tile(br), i, d, kr);
        if (br < 3) {
          const F s1 = gate_row(16 * br + 16), l = smem_get<CW>(&rt.l[br][d]);
          F y;  // exp(s_r - G_i) for r = br + 1 ..
#pragma unroll
          for (int j = 0; j < CW; ++j) y.v[j] = fast_exp2(s1.v[j] - gi.v[j]), kl.v[j] = y.v[j] * l.v[j];
#pragma unroll
          for (int r = br + 1; r < 4; ++r) {
            if (r > br + 1) {
              const F f = smem_get<CW>(&rt.p[r - 1][d]);
#pragma unroll
              for (int j = 0; j < CW; ++j) y.v[j] *= f.v[j];
            }
#pragma unroll
            for (int j = 0; j < CW; ++j) kr.v[j] = kv.v[j] * y.v[j];
            tile_put<T, CW>(sm.key_tile(r), i, d, kr);
          }
        } else {
#pragma unroll
          for (int j = 0; j < CW; ++j) kl.v[j] = fast_exp2(gl.v[j] - gi.v[j]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < CW; ++j) e.v[j] = fast_exp2(gi.v[j]), kl.v[j] = fast_exp2(gl.v[j] - gi.v[j]);
      }
      if constexpr (!Inv) {  // (the inverse's right-hand side, I, is the solve's own)
        F xw, xu;
#pragma unroll
        for (int j = 0; j < CW; ++j) xw.v[j] = b * kv.v[j] * rk * e.v[j], xu.v[j] = b * vv.v[j];
        smem_put<CW>(sm.x_tile().at(i, d), xw);
        smem_put<CW>(sm.x_tile().at(i, D + d), xu);
      }
      if (i < rows) {
        const long long at = at0 + br * step;
        F qg;
#pragma unroll
        for (int j = 0; j < CW; ++j) qg.v[j] = qv.v[j] * rq * e.v[j], kl.v[j] *= kv.v[j] * rk;
        global_put<T, CW>((u16*)p.kda.qg + at, qg);
        global_put<T, CW>((u16*)p.kda.kl + at, kl);
      }
    }
  }
  if (tid < D) p.kda.egl[(chunk * HV + hv) * D + tid] = fast_exp2(PerKey ? sm.g2[C - 1][tid] : sm.gs[C - 1]);
  __syncthreads();  // XS, KR and the factors
  if constexpr (!Inv) ahead(KdaLoadV);  // (v's boxes are free; the inverse path reads them after A)

  // A (the first half of the warps) or Aqk (the second) of block r of the rows against key blocks
  // mlo..mhi (kda_prep_task; in one pass: the latencies of a warp's blocks overlap).
  {
    int r, mlo, mhi;
    kda_prep_task(wid, r, mlo, mhi);
    const bool qside = wid >= NTH / 64;
    bool wide = false;  // whether diagonal block r is wide (per-key gate)
    if constexpr (PerKey) {
      float span = 0.f;
      if (mhi == r)
        for (int d = lane; d < D; d += 32) {
          const float2 sn = sm.refs(r, d);
          span = fmaxf(span, fmaxf(sn.y, sn.x - sn.y - sm.g2[16 * r + 15][d]));
        }
      wide = __any_sync(0xffffffffu, span > KdaWide<T>::log2);
    }
    const SwizzledTile tx = qside ? tq : tk;
    const auto block = [&](float (&acc)[2][4], const u32 (&x)[4], const SwizzledTile& tb, int m, int kk) {
      u32 b[4];  // (key block m of the right operand tb)
      ldsm_b_t(b, tb, m * 16, kk, lane);
      mma<T>(acc[0], x, b[0], b[1]);
      mma<T>(acc[1], x, b[2], b[3]);
    };
    u16* aqk = (u16*)p.kda.aqk;
    const auto store = [&](int m, const float (&acc)[2][4]) {  // block (r, m): norms, decay, into A or Aqk
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * r + g + 8 * hf;
        const float fi = qside ? sm.rq[i] : sm.beta[i] * sm.rk[i];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int j = 16 * m + 8 * nt + 2 * t;
          float x0 = acc[nt][2 * hf] * fi * sm.rk[j], x1 = acc[nt][2 * hf + 1] * fi * sm.rk[j + 1];
          if constexpr (!PerKey)  // the scalar gate's decay (j > i: an overflow is masked below)
            x0 *= fast_exp2(sm.gs[i] - sm.gs[j]), x1 *= fast_exp2(sm.gs[i] - sm.gs[j + 1]);
          if (!qside && m < r)  // (left of the diagonal block: the solve's tf32 operands, chunk_solve.cuh)
            *(float2*)&sm.a[i][j] = make_float2(tf32_value(x0), tf32_value(x1));
          else if (!qside)
            *(float2*)&sm.a[i][j] = make_float2(j < i ? x0 : 0.f, j + 1 < i ? x1 : 0.f);
          else if (i < rows)
            *(u32*)&aqk[((tok0 + i) * HV + hv) * C + j] = pack2<T>(j <= i ? x0 : 0.f, j + 1 <= i ? x1 : 0.f);
        }
      }
    };
    if constexpr (PerKey) {
      // The warp's blocks: the diagonal alone (XS times the exact factors, or wide), or one or two
      // blocks m < r (XS as it is); the right operand is KR_r's rows of block m.
      const SwizzledTile tr = sm.key_tile(r);
      const bool diag = mlo == r, two = mhi > mlo;
      float AX[2][2][4] = {};
      if (!(diag && wide))
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          u32 ax[4];
          ldsm_a(ax, tx, r * 16, kk, lane);
          if (diag) {  // XS_i exp(s_r - c'_r); fragment registers 0..3: (row g, c0), (g + 8, c0), (g, c0 + 8), (g + 8, c0 + 8)
            const int c0 = kk * 16 + 2 * t;
            const float2 f0 = *(const float2*)&sm.dfac[r][c0], f1 = *(const float2*)&sm.dfac[r][c0 + 8];
#pragma unroll
            for (int f = 0; f < 4; ++f) ax[f] = scale2<T>(ax[f], (f >> 1 ? f1 : f0).x, (f >> 1 ? f1 : f0).y);
          }
          block(AX[0], ax, tr, mlo, kk);
          if (two) block(AX[1], ax, tr, mhi, kk);
        }
      if (diag && wide) {
        const long long at = tok0 * p.heads * D + (long long)(hv / (HV / p.heads)) * D;
        kda_wide_diagonal<T, D>(sm, (const u16*)(qside ? p.q : p.k) + at, (const u16*)p.k + at, (long long)p.heads * D,
                                rows, r, AX[0]);
      }
      store(mlo, AX[0]);
      if (two) store(mhi, AX[1]);
    } else {
      float AX[4][2][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        u32 ax[4];
        ldsm_a(ax, tx, r * 16, kk, lane);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          if (m < mlo || m > mhi) continue;
          block(AX[m], ax, tk, m, kk);
        }
      }
#pragma unroll
      for (int m = 0; m < 4; ++m)
        if (m >= mlo && m <= mhi) store(m, AX[m]);
    }
    __syncwarp();
    if (!qside && mhi == r)  // (the block the warp wrote) its 16-row inverse, at columns 16 (r & 1)
      invert_diagonal_block<C + 4>(sm.a, sm.dinv, r, 16 * (r & 1));
  }
  __syncthreads();  // A, X and the 16-row inverses
  if constexpr (!Inv) ahead(KdaLoadRest);  // (the q and k boxes, the scaled tiles and G are free)
  // The solve puts [W | U0] in 16 bits into their boxes over the key tiles (warp wid: columns WC wid
  // .. WC wid + WC - 1). A whole chunk then leaves by tensor copies from thread 0 (it waits until
  // they are read before the barrier ahead of the next chunk's element-wise pass, which writes the
  // key tiles); a sequence's last, partial chunk by the warps' stores of their columns (a box would
  // write the next sequence's rows).
  constexpr int WC = 16, LPR = WC / 4, RS = 32 / LPR;
  static_assert(2 * D <= WC * (NTH / 32), "a warp's columns");
  const SwizzledTile wu = sm.wu_tile();
  if constexpr (Inv) {
    kda_prep_inverse<T, D>(sm, ahead);
  } else if (WC * wid < 2 * D) {
    solve_columns_16<T, C + 4>(sm.a, sm.dinv, sm.x_tile(), WC * wid, wu);
  }
  if (rows == C) {
    // Only warp 0 waits for the others' columns: they go on to the next chunk's G scan and norms,
    // which touch nothing the solve reads or writes (its loads are in, ahead()), and meet warp 0 at
    // the barrier that ends that phase.
    fence_async_smem();  // (the tensor copies read the boxes)
    if (wid == 0) {
      cta_sync<NTH>(CULA_PREP_STORE_BAR);
      if (tid == 0)  // (W: plane 0, U0: plane 3)
#pragma unroll
        for (int b = 0; b < 2 * D / 64; ++b)
          tma_store_2d(&lp.planes, sm.kr + b * C * 64, hv * D + 64 * (b % (D / 64)),
                       (b < D / 64 ? 0 : 3 * (int)p.total_tokens) + (int)tok0);
    } else {
      cta_arrive<NTH>(CULA_PREP_STORE_BAR);
    }
  } else if (WC * wid < 2 * D) {
    __syncwarp();  // (the stores read the warp's columns across its lanes)
    const int col = WC * wid + 4 * (lane % LPR), i0 = lane / LPR;
    const bool wside = col < D;  // (the same for the warp)
    u16* dst = (u16*)(wside ? p.kda.w : p.kda.u0) + ((tok0 + i0) * HV + hv) * D + (wside ? col : col - D);
    const long long step = (long long)RS * HV * D;
#pragma unroll 4
    for (int i = i0; i < rows; i += RS, dst += step) *(uint2*)dst = lds_u32x2(wu.at(i, col));
  }
}

template <typename T, int D, bool PerKey, bool Inv>
__device__ __forceinline__ void kda_chunk_prep(const CulaKdaLaunchParams& lp) {
  static_assert(sizeof(KdaPrepSmem<D>) + 1024 <= CULA_KDA_PREP_SMEM_BYTES(D), "shared memory size");
  static_assert((sizeof(KdaPrepSmem<D>) - sizeof(KdaPrepSmem<D>::kr1) - sizeof(u64)) % 1024 == 0,
                "kr1 1024-byte aligned");
  static_assert(CULA_KDA_PREP_THREADS == 512 && CULA_CHUNK == 64 && D <= 128, "16 warps (kda_prep_task)");
  const CulaGdnParams& p = lp.p;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  KdaPrepSmem<D>& sm = KdaPrepSmem<D>::get(smem_raw);
  const int hv = blockIdx.y, n = longest_first(p.seqs, blockIdx.z, p.total_tokens), h = hv / (p.v_heads / p.heads);
  long long bos, len;
  clamped_seq_bounds(p.seqs, n, p.total_tokens, bos, len);
  const InGate ig = in_gate(p, hv);
  const float bias =  // (the per-key gate's dt_bias of the thread's key column; the scalar gate's is in ig)
      PerKey && p.dt_bias ? load_scalar(p.dt_bias, p.dt_bias_dtype, (long long)hv * D + threadIdx.x % D) : 0.f;
  const long long nchunks = (len + CULA_CHUNK - 1) / CULA_CHUNK;
  KdaAhead<D, PerKey> ah;
  const auto load = [&](long long c, KdaLoadPart part) {
    kda_prep_load<D, PerKey>(sm, lp, bos + c * CULA_CHUNK, chunk_rows(len, c), h, hv, ah, part);
  };
  if (threadIdx.x == 0) {
    mbar_init(&sm.bar, 1);
    mbar_init_fence();
  }
  __syncthreads();  // (the barrier, before its first copies)
  // The state kernel (launched early on this one) may start its CTAs once every CTA of this grid is
  // here: they take SMs as this grid's last CTAs leave, and wait for its results there.
  grid_dependents_launch();
  if (blockIdx.x < nchunks) load(blockIdx.x, KdaLoadAll);
  u32 parity = 0;  // (the CTA's j-th chunk completes phase j of sm.bar)
  for (long long c = blockIdx.x; c < nchunks; c += p.kda.pieces, parity ^= 1u) {
    const long long next = c + p.kda.pieces;
    kda_prep_chunk<T, D, PerKey, Inv>(sm, lp, ig, bias, ah, bos + c * CULA_CHUNK, chunk_rows(len, c),
                                      bos / CULA_CHUNK + n + c, hv, parity, [&](KdaLoadPart part) {
                                        if (next < nchunks) load(next, part);
                                      });
  }
  if (threadIdx.x == 0) bulk_wait();  // (the last tensor copies have read shared memory before the CTA ends)
}

template <int D>
struct KdaStateSmem {  // 16-bit tiles, multiples of 1 KiB
  u16 w[2][CULA_CHUNK * D];              // chunk c's W and Kl in [c % 2] (the chain's)
  u16 kl[2][CULA_CHUNK * D];
  u16 qg[3][CULA_CHUNK * D];             // chunk c's Qg and Aqk in [c % 3] (the output's)
  u16 aqk[3][CULA_CHUNK * CULA_CHUNK];
  u16 s[2][D * CULA_BLOCK_V];            // 16-bit copies of the state at chunk c's start in s[c % 2]
  u16 u[2][CULA_CHUNK * CULA_BLOCK_V];   // chunk c's U in u[c % 2]
  u16 u0[2][CULA_CHUNK * CULA_BLOCK_V];  // chunk c's U0 slice in u0[c % 2] (the chain's)
  float egl[2][D];                       // exp(G_L) of chunk c in egl[c % 2]
  u64 bar[2];                            // chunk c's W, Kl, U0 and exp(G_L) have landed: bar[c % 2]
  u64 obar[3];                           // chunk c's Qg and Aqk have landed: obar[c % 3]
  static __device__ KdaStateSmem& get(unsigned char* raw) { return smem_aligned_1024<KdaStateSmem>(raw); }
};

// Chunk c's workspace rows into the state kernel's buffers by the tensor-copy engine, issued by
// one thread of the warpgroup that reads them: the chain's W, Kl, the U0 slice and exp(G_L)
// (kda_state_load, completing on bar[c % 2]); the output's Qg and Aqk (kda_state_load_output, on
// obar[c % 3]). Whole boxes: rows past the sequence's end are the next sequence's (or, past a
// plane's, the next plane's) and are not used: the chain writes zeros to those rows of U and of
// Kl (kda_state_chain*), and the output's rows there are not stored.
template <int D>
__device__ __forceinline__ void kda_state_load(KdaStateSmem<D>& sm, const CulaKdaLaunchParams& sp, long long bos,
                                               long long c, long long chunk, int hv, int vb) {
  constexpr int C = CULA_CHUNK, BV = CULA_BLOCK_V;
  static_assert(BV == 64, "a U0 slice is one box");
  const int b2 = (int)(c & 1), x = hv * D, y = (int)(bos + c * C), tokens = (int)sp.p.total_tokens;
  const u32 bar = smem_addr(&sm.bar[b2]);
  mbar_expect_tx(bar, 2 * C * D * 2 + C * BV * 2 + D * 4);
#pragma unroll
  for (int j = 0; j < D / 64; ++j) {
    tma_load_2d(&sm.w[b2][j * C * 64], &sp.planes, x + 64 * j, y, bar);
    tma_load_2d(&sm.kl[b2][j * C * 64], &sp.planes, x + 64 * j, 2 * tokens + y, bar);
  }
  tma_load_2d(sm.u0[b2], &sp.planes, x + vb * BV, 3 * tokens + y, bar);
  bulk_load(sm.egl[b2], sp.p.kda.egl + (chunk * sp.p.v_heads + hv) * D, D * 4, bar);
}
template <int D>
__device__ __forceinline__ void kda_state_load_output(KdaStateSmem<D>& sm, const CulaKdaLaunchParams& sp, long long bos,
                                                      long long c, int hv) {
  constexpr int C = CULA_CHUNK;
  const int b3 = (int)(c % 3), y = (int)(bos + c * C), tokens = (int)sp.p.total_tokens;
  const u32 bar = smem_addr(&sm.obar[b3]);
  mbar_expect_tx(bar, C * D * 2 + C * C * 2);
#pragma unroll
  for (int j = 0; j < D / 64; ++j) tma_load_2d(&sm.qg[b3][j * C * 64], &sp.planes, hv * D + 64 * j, tokens + y, bar);
  tma_load_2d(sm.aqk[b3], &sp.aqk, hv * C, y, bar);
}

// What both chain warpgroups of the state kernel do around a chunk: wait for chunk c's rows (kda_state_rows: Kl's rows past the sequence's end, in its last chunk,
// become zeros; FENCE: the wgmma read Kl) and, at the end, meet the output warpgroup's arrivals of
// the last LAG chunks (kda_state_last: the chain meets chunk c's at chunk c + LAG).
template <int D, bool FENCE>
__device__ __forceinline__ void kda_state_rows(KdaStateSmem<D>& sm, long long c, int rows) {
  constexpr int C = CULA_CHUNK;
  const int slot = (int)(c & 1);
  mbar_wait(&sm.bar[slot], (u32)(c >> 1) & 1u);
  if (rows < C) {
    const SwizzledTile tkl{sm.kl[slot], C};
    for (int i = threadIdx.x; i < (C - rows) * (D / 2); i += CULA_GATED_CHAIN_THREADS)
      sts_u32(tkl.at(rows + i / (D / 2), 2 * (i % (D / 2))), 0u);
    if constexpr (FENCE) fence_async_smem();
  }
}
template <int LAG>
__device__ __forceinline__ void kda_state_last(long long nchunks) {
#pragma unroll
  for (int i = LAG; i >= 1; --i)
    if (nchunks >= i) handover_sync(CULA_CHUNK_DONE_BAR + (int)((nchunks - i) & 1));
}

// The chain warpgroup of the generic state kernel (S in registers, warp w rows 64 mt + 16 w +
// {g, g+8}), by warp-level mma.sync: per chunk U = U0 - W S into u[c % 2], handed to the output
// warpgroup, then the state update; its 16-bit copy for chunk c+1 waits until the output
// warpgroup is done with chunk c-1.
template <typename T, int D>
__device__ __forceinline__ void kda_state_chain(KdaStateSmem<D>& sm, const CulaKdaLaunchParams& sp, long long bos,
                                                long long len, int n, int hv, int vb, long long state) {
  constexpr int C = CULA_CHUNK, MT = D / 64;
  const CulaGdnParams& p = sp.p;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
  const auto row0 = [w](int mt) { return mt * 64 + w * 16; };
  float S[MT][32];
  for_state_pairs(S, row0, [&](int row, int col, float& x, float& y) {
    const float2 s = p.h0 ? *(const float2*)&p.h0[state + (long long)row * D + col] : make_float2(0.f, 0.f);
    x = s.x;
    y = s.y;
  });
  grid_dependency_wait();  // (launched early on the prep: h0 read meanwhile, then the prep's workspace)
  const long long nchunks = (len + C - 1) / C, chunk0 = bos / C + n;
  if (nchunks > 0) {
    if (tid == 0) kda_state_load<D>(sm, sp, bos, 0, chunk0, hv, vb);
    copy_stmatrix<T>(S, row0, SwizzledTile{sm.s[0], D});
  }
  for (long long c = 0; c < nchunks; ++c) {
    const int slot = (int)(c & 1), rows = chunk_rows(len, c);
    kda_state_rows<D, false>(sm, c, rows);
    chain_sync();  // chunk c's rows and state copy are in; the chain is done with chunk c-1
    const SwizzledTile tw{sm.w[slot], C}, ts{sm.s[slot], D}, tu{sm.u[slot], C};
    float WS[8][4] = {};
    mma_rows_times_tile<T, D / 16>(WS, tw, 16 * w, ts, lane);
    // The next chunk's loads (one thread) and the lane's U0 values (into registers, all loads in
    // flight at once, then the stores of U)
    if (tid == 0 && c + 1 < nchunks) kda_state_load<D>(sm, sp, bos, c + 1, chunk0 + c + 1, hv, vb);
    const SwizzledTile tu0{sm.u0[slot], C};
    float2 u0[8][2];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) u0[nt][hf] = tile_pair<T>(tu0, 16 * w + g + 8 * hf, nt * 8 + 2 * t);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = 16 * w + g + 8 * hf, col = nt * 8 + 2 * t;
        const float2 x = u0[nt][hf];
        sts_u32(tu.at(row, col), row < rows ? pack2<T>(x.x - WS[nt][2 * hf], x.y - WS[nt][2 * hf + 1]) : 0u);
      }
    chain_sync();  // all of U
    handover_arrive(CULA_CHUNK_READY_BAR + slot);

    // S <- diag(exp(G_L)) S + Kl^T U
    const float* egl = sm.egl[slot];
    for_state_pairs(S, row0, [&](int row, int, float& x, float& y) {
      x *= egl[row];
      y *= egl[row];
    });
    const SwizzledTile tkl{sm.kl[slot], C};
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
      u32 a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldsm_x4_trans(a[mt], tkl.at(kk * 16 + (lane & 7) + ((lane >> 4) & 1) * 8, row0(mt) + ((lane >> 3) & 1) * 8));
      mma_state_rows<T>(S, a, tu, kk, lane);
    }
    if (c >= 1) handover_sync(CULA_CHUNK_DONE_BAR + (slot ^ 1));  // the output of chunk c-1 is done
    if (c + 1 < nchunks) copy_stmatrix<T>(S, row0, SwizzledTile{sm.s[slot ^ 1], D});
  }
  kda_state_last<1>(nchunks);
  if (p.ht_mode == CULA_HT_FINAL)
    for_state_pairs(S, row0, [&](int row, int col, float& x, float& y) {
      *(float2*)&p.ht[state + (long long)row * D + col] = make_float2(x, y);
    });
}

// The chain warpgroup of the sm_90a state kernel, on the transposed state X = S^T (value rows x
// key columns; warp w holds value rows 16 w + {g, g+8}, X[ns][4 j + 2 hf + e] at value row
// 16 w + g + 8 hf, key column 64 ns + 8 j + 2 t + e) in registers, by warpgroup-level wgmma whose
// A operand comes from registers (an accumulator's layout is the A fragment's): per chunk
//   U^T = U0^T - X W^T     (A: X's 16-bit fragments; B: W, k-major)
//   X <- X diag(exp(G_L)) + U^T Kl   (A: U^T's fragments; B: Kl, mn-major)
// so that neither product waits for shared memory the chain writes. The output warpgroup gets
// the state at the chunk's start and U^T as 16-bit [V x K] and [V x C] tiles (stmatrix of the
// same fragments, while the products run), into s[c % 2] and u[c % 2] once it is done with chunk
// c - 2.
template <typename T, int D>
__device__ __forceinline__ void kda_state_chain_wg(KdaStateSmem<D>& sm, const CulaKdaLaunchParams& sp, long long bos,
                                                   long long len, int n, int hv, int vb, long long state) {
  constexpr int C = CULA_CHUNK, V = CULA_BLOCK_V, NS = D / 64;
  const CulaGdnParams& p = sp.p;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
  // The offset in a [K, V] state of X[ns][i] (key column, value row)
  const auto x_at = [&](int ns, int i) {
    return (64 * ns + 8 * (i >> 2) + 2 * t + (i & 1)) * D + 16 * w + g + 8 * ((i >> 1) & 1);
  };
  float X[NS][32];
#pragma unroll
  for (int ns = 0; ns < NS; ++ns)
#pragma unroll
    for (int i = 0; i < 32; ++i) X[ns][i] = p.h0 ? p.h0[state + x_at(ns, i)] : 0.f;
  grid_dependency_wait();  // (launched early on the prep: h0 read meanwhile, then the prep's workspace)
  const long long nchunks = (len + C - 1) / C, chunk0 = bos / C + n;
  if (nchunks > 0 && tid == 0) kda_state_load<D>(sm, sp, bos, 0, chunk0, hv, vb);
  // Addresses, as offsets from a tile's start that the loop adds constants to: the lane's part of
  // the stmatrix of an A fragment (rows 16 w .., columns 16 kk ..) into a tile of V rows, kk % 4
  // (panel kk / 4: V 128 bytes on); the lane's row of the ldmatrix.trans that gives U0^T's
  // fragments from a U0 tile (token rows): matrix m = lane / 8 of four, tokens 8 (m / 2) .. and
  // value columns 16 w + 8 (m % 2) .., each step of 16 tokens 2048 bytes on (the swizzle's phase
  // unchanged).
  u32 st_off[4], u0_off;
  {
    const SwizzledTile tile{sm.s[0], V}, tu0{sm.u0[0], C};
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      st_off[kk] = tile.at(16 * w + (lane & 7) + ((lane >> 3) & 1) * 8, 16 * kk + (lane >> 4) * 8) - tile.base;
    u0_off = tu0.at((lane & 7) + ((lane >> 4) & 1) * 8, 16 * w + ((lane >> 3) & 1) * 8) - tu0.base;
  }
  const auto frag_at = [&](const u16* tile, int kk) { return smem_addr(tile) + st_off[kk & 3] + (kk >> 2) * V * 128; };
  for (long long c = 0; c < nchunks; ++c) {
    const int slot = (int)(c & 1), rows = chunk_rows(len, c);
    kda_state_rows<D, true>(sm, c, rows);
    chain_sync();  // chunk c's rows are in; the chain is done with chunk c-1's
    u32 xa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) score_fragment<T>(xa[kk], *reinterpret_cast<float(*)[8][4]>(X[kk / 4]), kk % 4);
    float UT[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) UT[i] = 0.f;
    const u64 dw = smem_desc(sm.w[slot]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) WgmmaRS<T, 0>::run(UT, xa[kk], desc_at(dw, kmajor_step(kk, C)), 1);
    wgmma_commit();
    // While it runs: the next chunk's loads (one thread), the state copy for the output warpgroup,
    // the lane's U0 values (U0^T's entries: token 8 j + 2 t + e, value row 16 w + g + 8 hf)
    if (tid == 0 && c + 1 < nchunks) kda_state_load<D>(sm, sp, bos, c + 1, chunk0 + c + 1, hv, vb);
    if (c >= 2) handover_sync(CULA_CHUNK_DONE_BAR + slot);  // the output warpgroup is done with chunk c-2
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) stmatrix_x4(frag_at(sm.s[slot], kk), xa[kk]);
    const u32 tu0 = smem_addr(sm.u0[slot]) + u0_off;
    float u0[32];  // U0^T's fragments: u0[8 jj + 2 m + e] at token 8 (2 jj + m / 2) + 2 t + e, value row
                   // 16 w + g + 8 (m % 2)
#pragma unroll
    for (int jj = 0; jj < C / 16; ++jj) {
      u32 r[4];
      ldsm_x4_trans(r, tu0 + 2048 * jj);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const float2 f = unpack2<T>(r[m]);
        u0[8 * jj + 2 * m] = f.x, u0[8 * jj + 2 * m + 1] = f.y;
      }
    }
    wgmma_wait<0>();
    if (rows == C) {
#pragma unroll
      for (int i = 0; i < 32; ++i) UT[i] = u0[i] - UT[i];
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) UT[i] = 8 * (i >> 2) + 2 * t + (i & 1) < rows ? u0[i] - UT[i] : 0.f;
    }

    // X <- X diag(exp(G_L)) + U^T Kl
    const float* egl = sm.egl[slot];
#pragma unroll
    for (int ns = 0; ns < NS; ++ns)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 e = *(const float2*)&egl[64 * ns + 8 * j + 2 * t];
        X[ns][4 * j] *= e.x, X[ns][4 * j + 1] *= e.y, X[ns][4 * j + 2] *= e.x, X[ns][4 * j + 3] *= e.y;
      }
    u32 ua[C / 16][4];
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) score_fragment<T>(ua[kk], *reinterpret_cast<float(*)[8][4]>(UT), kk);
    const u64 dkl = smem_desc(sm.kl[slot]);
    wgmma_fence();
#pragma unroll
    for (int ns = 0; ns < NS; ++ns)
#pragma unroll
      for (int kk = 0; kk < C / 16; ++kk)
        WgmmaRS<T, 1>::run(X[ns], ua[kk], desc_at(dkl, ns * C * 64 + mnmajor_step(kk)), 1);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) stmatrix_x4(frag_at(sm.u[slot], kk), ua[kk]);
    fence_async_smem();  // (the state copy and U^T: the output warpgroup's wgmma read them)
    handover_arrive(CULA_CHUNK_READY_BAR + slot);
    wgmma_wait<0>();
  }
  kda_state_last<2>(nchunks);
  if (p.ht_mode == CULA_HT_FINAL)
#pragma unroll
    for (int ns = 0; ns < NS; ++ns)
#pragma unroll
      for (int i = 0; i < 32; ++i) p.ht[state + x_at(ns, i)] = X[ns][i];
}

// The output warpgroup of the state kernel: o = Qg S + Aqk U per chunk (warp w: rows 16 w + {g, g+8});
// WG: by wgmma, as the chain (its fence covers the zeros it writes into Aqk; the chain's, the
// state copy and U). Its first thread loads Qg and Aqk two chunks ahead: chunk c+2's into the
// buffers of chunk c-1, which all its warps are done with once they have met at chunk c's
// handover. o of a whole chunk leaves by TMA from chunk c's Qg buffer (free once the products
// are done; the thread that stores it waits until the store has read it before it loads chunk
// c+3 there); a sequence's last, partial chunk by the threads' stores (a box would write the
// next sequence's rows).
template <typename T, int D, bool WG>
__device__ __forceinline__ void kda_state_output(KdaStateSmem<D>& sm, const CulaKdaLaunchParams& sp, u16* o,
                                                 long long v_stride, long long bos, long long len, int hv, int vb) {
  constexpr int C = CULA_CHUNK;
  const int tid = threadIdx.x - CULA_GATED_CHAIN_THREADS, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
  const long long nchunks = (len + C - 1) / C;
  grid_dependency_wait();  // (launched early on the prep: its workspace)
  if (tid == 0)
    for (long long c = 0; c < 2 && c < nchunks; ++c) kda_state_load_output<D>(sm, sp, bos, c, hv);
  for (long long c = 0; c < nchunks; ++c) {
    const long long tok0 = c * C;
    const int rows = chunk_rows(len, c), b3 = (int)(c % 3), slot = (int)(c & 1);
    const SwizzledTile tq{sm.qg[b3], C}, ta{sm.aqk[b3], C}, ts{sm.s[slot], D}, tu{sm.u[slot], C};
    mbar_wait(&sm.obar[b3], (u32)(c / 3) & 1u);
    if constexpr (WG) {  // Aqk's blocks above the diagonal, which the prep leaves unwritten: zeros
      for (int i = tid; i < 6 * 16 * 2; i += CULA_GATED_CHUNK_THREADS - CULA_GATED_CHAIN_THREADS) {
        const int blk = i >> 5, r = ((0x211000 >> (4 * blk)) & 15) * 16 + ((i >> 1) & 15);  // blocks (r, m > r)
        sts_zero16(ta.at(r, ((0x332321 >> (4 * blk)) & 15) * 16 + (i & 1) * 8));
      }
      fence_async_smem();
    }
    handover_sync(CULA_CHUNK_READY_BAR + slot);
    if (tid == 0 && c + 2 < nchunks) {
      bulk_wait_read();  // (chunk c-1's o, from the buffer chunk c+2 goes into)
      kda_state_load_output<D>(sm, sp, bos, c + 2, hv);
    }
    float O[8][4] = {};
    if constexpr (WG) {  // (all k-major: Qg, Aqk, the state copy as S^T, U as U^T)
      wgmma_fence();
      wgmma_kmajor_times_kmajor<T, D / 16, C, CULA_BLOCK_V>(&O[0][0], smem_desc(tq.base), smem_desc(ts.base));
      wgmma_kmajor_times_kmajor<T, C / 16, C, CULA_BLOCK_V>(&O[0][0], smem_desc(ta.base), smem_desc(tu.base));
      wgmma_commit();
      wgmma_wait<0>();
    } else {
      mma_rows_times_tile<T, D / 16>(O, tq, 16 * w, ts, lane);
      mma_rows_times_tile<T, C / 16>(O, ta, 16 * w, tu, lane, w);  // (Aqk's blocks past the diagonal one: not read)
    }
    handover_arrive(CULA_CHUNK_DONE_BAR + slot);
    if (rows == C) {
      output_sync();  // (every warp is done with chunk c's Qg)
      copy_stmatrix<T>(*reinterpret_cast<float(*)[1][32]>(O), [w](int) { return 16 * w; }, tq);
      fence_async_smem();
      output_sync();
      if (tid == 0) tma_store_2d(&sp.o, sm.qg[b3], hv * D + vb * CULA_BLOCK_V, (int)(bos + tok0));
    } else {
      store_o<T, 8>(o, O, tok0, 16 * w, g, t, rows, v_stride, 1.f);
    }
  }
  if (tid == 0) bulk_wait();  // (the stores have read shared memory before the CTA ends)
}

template <typename T, int D, bool WG>
__device__ __forceinline__ void kda_chunk_state(const CulaKdaLaunchParams& sp) {
  static_assert(sizeof(KdaStateSmem<D>) + 1024 <= CULA_KDA_STATE_SMEM_BYTES(D), "shared memory size");
  static_assert(CULA_GATED_CHUNK_THREADS == 256 && CULA_BLOCK_V == 64 && CULA_CHUNK == 64, "two warpgroups");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  KdaStateSmem<D>& sm = KdaStateSmem<D>::get(smem_raw);
  const CulaGdnParams& p = sp.p;
  const int vb = blockIdx.x, hv = blockIdx.y, n = blockIdx.z, HV = p.v_heads;
  long long bos, len;
  clamped_seq_bounds(p.seqs, n, p.total_tokens, bos, len);
  if (threadIdx.x == 0) {  // (the load barriers, before the roles run apart)
    for (int i = 0; i < 2; ++i) mbar_init(&sm.bar[i], 1);
    for (int i = 0; i < 3; ++i) mbar_init(&sm.obar[i], 1);
    mbar_init_fence();
  }
  __syncthreads();
  const long long v_stride = (long long)HV * D;
  const bool chain = in_first_threads<WG, CULA_GATED_CHAIN_THREADS>();
  const long long state = state_slice_at<D>(HV, n, hv, vb);
  if (chain) {
    if constexpr (WG)
      kda_state_chain_wg<T, D>(sm, sp, bos, len, n, hv, vb, state);
    else
      kda_state_chain<T, D>(sm, sp, bos, len, n, hv, vb, state);
  } else {
    kda_state_output<T, D, WG>(sm, sp, (u16*)p.o + bos * v_stride + (long long)hv * D + vb * CULA_BLOCK_V, v_stride, bos,
                               len, hv, vb);
  }
}

// The entry points of the two launches (extern "C", looked up by name from the host): PREP over a
// (pieces, HV, N) grid of CULA_KDA_PREP_THREADS (PER_KEY: KDA's per-key gate, else the scalar gate
// of the gated delta rule; INV: W and U0 through the inverse, scalar gate only), then STATE
// (mma.sync, every target) or STATE_sm90a (wgmma, its body in the sm_90a cubin only) over
// (D / CULA_BLOCK_V, HV, N) of CULA_GATED_CHUNK_THREADS. The state kernel reads only the workspace,
// so one serves both gates.
#define CULA_CHUNK_PREP_KERNEL(NAME, T, D, PER_KEY, INV)                                               \
  extern "C" __global__ void __launch_bounds__(CULA_KDA_PREP_THREADS)                                 \
      NAME(const __grid_constant__ CulaKdaLaunchParams p) {                                           \
    kda_chunk_prep<T, D, PER_KEY, INV>(p);                                                            \
  }
#define CULA_CHUNK_STATE_KERNEL(NAME, T, D)                                                            \
  extern "C" __global__ void __launch_bounds__(CULA_GATED_CHUNK_THREADS)                              \
      NAME(const __grid_constant__ CulaKdaLaunchParams p) {                                            \
    kda_chunk_state<T, D, false>(p);                                                                  \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(CULA_GATED_CHUNK_THREADS)                              \
      NAME##_sm90a(const __grid_constant__ CulaKdaLaunchParams p) {                                    \
    CULA_SM90A_ONLY((kda_chunk_state<T, D, true>(p)));                                                \
  }
