// The token-by-token recurrence of gated linear attention, with or without the delta rule, with a
// scalar or a per-key gate (CulaGdnParams): fused_recurrent and serving decode of the gated delta
// rule and of KDA (per-key gate), and simple_gla with a per-token gate. A family's kernel file
// declares its entry points with CULA_GATED_RECURRENCE_KERNEL (gated_recurrence<T, D, DELTA, PER_KEY,
// V_FIRST, VERIFY, ONE>).
//
// Layout: a CTA of CULA_GDN_THREADS = 128 threads covers CULA_GDN_BLOCK_V = 32 value columns of one
// (sequence n, value head hv) for all K rows; a thread keeps R = K / 16 rows of 4 columns in fp32
// registers (RecLayout). Key-first states: the 4 warps lie along the rows, and lane (row lane
// lane / 8, column lane lane % 8) of warp w keeps rows (4 w + lane / 8) R .. + R - 1 of columns
// 4 (lane % 8) .. + 3, so each warp access of the state is 4 rows of 128 contiguous bytes, and a
// thread's rows of q and k are one vector load. Value-first states (state_v_first, [.., V, K]: the
// V_FIRST kernels) are read and written a column at a time, 16 bytes of 4 rows each: the warps are
// 2 x 2 (K / 2 rows x 16 columns each), and lane (row lane lane % 8, column lane lane / 8) keeps
// rows 4 (lane % 8) .. + 3 of its warp's rows (at K = 128, and 32 rows on: GAP) of 4 columns, so
// that a warp's access is 4 columns of 128 contiguous bytes. (The value-first kernels had warps
// along the rows too, a warp's access 8 columns of 64 bytes: 71% of the copy bandwidth on the H200
// at 5 CTAs an SM where this reaches 94%, the access alone timed.) The rows' sums come in another
// order than the key-first kernel's.
// Per token there is one reduction over the rows, of the state before the token: S^T k, S^T q,
// |k|^2, |q|^2 and k.q (o = scale (alpha S^T q + u (k.q)) needs no second pass over the updated
// state; a per-key gate decays the thread's rows of S before the sums: token 0 by each thread for
// its own rows, later tokens from a table of exp(gate) per key row that the CTA fills a token
// ahead, one row per thread). Lanes reduce by shuffles, the warps of a column through shared memory
// double-buffered by token parity: one barrier per token.
#pragma once

#include "common/ptx.cuh"
#include "common/seqs.cuh"
#include "params.h"

// A float32 / bfloat16 / float16 scalar (dtype CULA_*) in two steps: its bits, loaded without being
// used (so that every load of a prologue is in flight before the first is waited on), then its value.
__device__ __forceinline__ u32 load_bits(const void* p, int dtype, long long i) {
  return dtype == CULA_F32 ? ((const u32*)p)[i] : (u32)((const u16*)p)[i];
}
__device__ __forceinline__ float bits_value(u32 x, int dtype) {
  if (dtype == CULA_F32) return __uint_as_float(x);
  return dtype == CULA_BF16 ? to_float<bf16_tag>((u16)x) : to_float<f16_tag>((u16)x);
}
__device__ __forceinline__ float load_scalar(const void* p, int dtype, long long i) {
  return bits_value(load_bits(p, dtype, i), dtype);
}

// The gates as the kernels use them (both the token loop and the chunked kernel): the in-kernel
// gate of gate_mode (CULA_GATE_*; softplus as FLA's: linear above 20), beta's (scaled) sigmoid when
// asked. InGate holds the value head's constants: the factor a of the gate, and dt_bias (the
// per-key gate reads its dt_bias per row instead).
struct InGate {
  float a, dt_bias;
};
// From the bits of A_log[hv] and dt_bias[hv] (load_bits; 0 where absent).
__device__ __forceinline__ InGate in_gate(const CulaGdnParams& p, u32 a_log, u32 dt_bias) {
  const float e = p.a_log ? __expf(bits_value(a_log, p.a_log_dtype)) : 1.f;
  return {p.gate_mode == CULA_GATE_SOFTPLUS ? -e : e, p.dt_bias ? bits_value(dt_bias, p.dt_bias_dtype) : 0.f};
}
__device__ __forceinline__ InGate in_gate(const CulaGdnParams& p, int hv) {
  return in_gate(p, p.a_log ? load_bits(p.a_log, p.a_log_dtype, hv) : 0u,
                 p.dt_bias ? load_bits(p.dt_bias, p.dt_bias_dtype, hv) : 0u);
}
__device__ __forceinline__ float softplus_fla(float x) { return x > 20.f ? x : log1pf(__expf(x)); }  // (linear above 20)
// The log decay of a gate input g with bias b (dt_bias).
__device__ __forceinline__ float gate_of(const CulaGdnParams& p, float a, float g, float b) {
  if (p.gate_mode == CULA_GATE_RAW) return g;
  const float x = g + b;
  // (__fdividef: no IEEE division's slow-path call; a denominator past 2^126 gives 0, sigmoid's limit)
  if (p.gate_mode == CULA_GATE_LOWER_BOUND) return __fdividef(p.lower_bound, 1.f + __expf(-a * x));
  return a * softplus_fla(x);
}
// gate_of for gate mode MODE in log2 units, the constants of a column (a, b) folded once: for a
// scan over the tokens of one column (equal up to float rounding).
template <int MODE>
struct Log2Gate {
  float m, c, l;
  __device__ __forceinline__ Log2Gate(float lower_bound, float a, float b)
      : m(MODE == CULA_GATE_LOWER_BOUND ? -a * CULA_LOG2E : 1.f),
        c(MODE == CULA_GATE_LOWER_BOUND ? -a * CULA_LOG2E * b : b),
        l(MODE == CULA_GATE_RAW             ? CULA_LOG2E
          : MODE == CULA_GATE_LOWER_BOUND ? CULA_LOG2E * lower_bound
                                          : CULA_LOG2E * a) {}
  __device__ __forceinline__ float operator()(float g) const {
    if (MODE == CULA_GATE_RAW) return l * g;
    if (MODE == CULA_GATE_LOWER_BOUND) return l * fast_rcp(1.f + fast_exp2(fmaf(m, g, c)));  // (rcp: 0 past 2^126)
    return l * softplus_fla(g + c);
  }
};
__device__ __forceinline__ float gate_of(const CulaGdnParams& p, const InGate& ig, float g) {
  return gate_of(p, ig.a, g, ig.dt_bias);
}
__device__ __forceinline__ float beta_of(const CulaGdnParams& p, float beta) {
  return p.beta_sigmoid ? __fdividef(p.beta_scale, 1.f + __expf(-beta)) : beta;
}

// R 16-bit values at p (R = 4 or 8: one 8- or 16-byte load; GAP > 0: two groups of 4, at p and
// p + GAP), as R / 2 packed pairs.
template <int R, int GAP = 0>
__device__ __forceinline__ void load_u16s(const u16* p, u32 (&out)[R / 2]) {
  static_assert(R == 4 || R == 8, "rows per thread");
  if constexpr (GAP > 0 && R == 8) {
    const uint2 x = *(const uint2*)p, y = *(const uint2*)(p + GAP);
    out[0] = x.x, out[1] = x.y, out[2] = y.x, out[3] = y.y;
  } else if constexpr (R == 8) {
    const uint4 x = *(const uint4*)p;
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
  } else {
    const uint2 x = *(const uint2*)p;
    out[0] = x.x, out[1] = x.y;
  }
}

// R consecutive values of a float32 / bfloat16 / float16 array (dtype CULA_*) from element i on
// (a 16-byte aligned row piece: one or two vector loads; GAP > 0: groups of 4 at i + GAP j), in two
// steps as load_bits / bits_value: the bits (R words of float32, or R / 2 packed 16-bit pairs), then
// the floats.
template <int R, int GAP = 0>
__device__ __forceinline__ void load_row_bits(const void* p, int dtype, long long i, u32 (&x)[R]) {
  if (dtype == CULA_F32) {
#pragma unroll
    for (int j = 0; j < R / 4; ++j) {
      const uint4 a = GAP > 0 ? *(const uint4*)((const u32*)p + i + GAP * j) : ((const uint4*)((const u32*)p + i))[j];
      x[4 * j] = a.x, x[4 * j + 1] = a.y, x[4 * j + 2] = a.z, x[4 * j + 3] = a.w;
    }
  } else {
    load_u16s<R, GAP>((const u16*)p + i, *(u32(*)[R / 2])x);
  }
}
template <int R>
__device__ __forceinline__ void row_values(const u32 (&x)[R], int dtype, float (&out)[R]) {
  if (dtype == CULA_F32) {
#pragma unroll
    for (int j = 0; j < R; ++j) out[j] = __uint_as_float(x[j]);
    return;
  }
#pragma unroll
  for (int j = 0; j < R / 2; ++j) {
    const u16 lo = (u16)(x[j] & 0xffffu), hi = (u16)(x[j] >> 16);
    out[2 * j] = dtype == CULA_BF16 ? to_float<bf16_tag>(lo) : to_float<f16_tag>(lo);
    out[2 * j + 1] = dtype == CULA_BF16 ? to_float<bf16_tag>(hi) : to_float<f16_tag>(hi);
  }
}

// One token's inputs as loaded (the next token's are loaded while this one is computed).
template <int R>
struct RecurrentToken {
  u32 q[R / 2], k[R / 2];  // the thread's R rows
  uint2 v;                 // its 4 value columns
  u32 g, beta;             // bits (load_bits) of the scalar gate and beta (the per-key gate is loaded apart)
};

// What one token reduces over the rows, per thread and then per CTA: S^T k and S^T q of the
// state before the token (4 columns each), |k|^2, |q|^2 and k.q.
constexpr int kRecSums = 11;

// Where a thread of the token loop sits (the layout: the top). Its R rows are r0 + row(i), its 4
// columns c0 .. c0 + 3 of the CTA's; the rows' sums reduce over the lanes of one column lane
// (shuffles xor first_xor, 2 first_xor, .. last_xor), then over the RW warps of one warp column
// through shared memory at [warp][column lane].
template <int D, bool V_FIRST>
struct RecLayout {
  static constexpr int R = D / 16;
  static constexpr int RW = V_FIRST ? 2 : 4;                  // warps along the rows
  static constexpr int GAP = V_FIRST && R == 8 ? 32 : 0;      // the second group of 4 rows, from the first
  static constexpr int first_xor = V_FIRST ? 1 : 8, last_xor = V_FIRST ? 4 : 16;
  int row_lane, col_lane, rw, cw, r0, c0;
  __device__ __forceinline__ explicit RecLayout(int tid) {
    const int lane = tid & 31, warp = tid >> 5;
    row_lane = V_FIRST ? lane & 7 : lane >> 3;
    col_lane = V_FIRST ? lane >> 3 : lane & 7;
    rw = warp % RW, cw = warp / RW;
    r0 = V_FIRST ? rw * (D / 2) + 4 * row_lane : (4 * warp + row_lane) * R;
    c0 = 4 * (col_lane + cw * (V_FIRST ? 4 : 8));
  }
  __device__ __forceinline__ static int row(int i) { return GAP ? GAP * (i >> 2) + (i & 3) : i; }
  // One thread per column writes o (and a padding slot's zeros).
  __device__ __forceinline__ bool writes_o() const { return rw == 0 && row_lane == 0; }
};

// ONE: a kernel for calls whose sequences have at most one token each (a decode step; the host's
// choice, recurrent_gated): the loop runs once, so ptxas keeps no next token's registers.
template <typename T, int D, bool DELTA, bool PER_KEY, bool V_FIRST, bool VERIFY, bool ONE>
__device__ __forceinline__ void gated_recurrence(const CulaGdnParams& p) {
  using L = RecLayout<D, V_FIRST>;
  constexpr int R = L::R, C = 4, GAP = L::GAP;
  const auto row_at = L::row;  // S[i]'s row, from r0
  __shared__ __align__(16) float red[2][CULA_GDN_THREADS / 32][8][12];  // [token parity][warp][column lane][sum]
  const int tid = threadIdx.x, warp = tid >> 5;
  const L at(tid);
  const int hv = blockIdx.y, n = blockIdx.z, HV = p.v_heads, H = p.heads;
  const int h = hv / (HV / H);
  const int c0 = blockIdx.x * CULA_GDN_BLOCK_V + at.c0;  // the thread's first value column
  const int r0 = at.r0;                                  // and first row
  long long bos, len;
  clamped_seq_bounds(p.seqs, n, p.total_tokens, bos, len);
  if (ONE) len = len > 0 ? 1 : 0;

  const long long q_stride = p.q_stride, k_stride = p.k_stride, v_stride = p.v_stride, o_stride = (long long)HV * D;
  const u16* q = (const u16*)p.q + bos * q_stride + (long long)h * D + r0;
  const u16* k = (const u16*)p.k + bos * k_stride + (long long)h * D + r0;
  const u16* v = (const u16*)p.v + bos * v_stride + (long long)hv * D + c0;
  u16* o = (u16*)p.o + bos * o_stride + (long long)hv * D + c0;
  const long long gb0 = bos * HV + hv;  // g and beta of the sequence's first token

  // Where the state comes from; a padding slot writes zeros and leaves the pool alone.
  long long slot = n;
  if (p.state_indices) {
    long long col = 0;
    if (p.num_accepted) col = load_index(p.num_accepted, p.num_accepted_int64, n) - 1;
    slot = col >= 0 && col < p.indices_stride
               ? load_index(p.state_indices, p.state_indices_int64, (long long)n * p.indices_stride + col)
               : -1;
    if (slot < 0 || slot >= p.num_slots) {
      if (at.writes_o())
        for (long long t = 0; t < len; ++t) *(uint2*)&o[t * o_stride] = make_uint2(0u, 0u);
      return;
    }
  }
  // + slot * pitch (HV * D * D in a contiguous pool), then + i * D (key-first) or + c * D + row_at(i) (value-first)
  const long long state_rows = (long long)hv * D * D + (V_FIRST ? (long long)c0 * D + r0 : (long long)r0 * D + c0);
  float S[R][C];
  // The thread's part of the state that starts at `from` (null: zeros), and its store to `to`.
  auto load_state = [&](const float* from) {
    const float* src = from ? from + state_rows : nullptr;
    if constexpr (V_FIRST) {
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int i = 0; i < R; i += 4) {
          const float4 a = src ? *(const float4*)&src[c * D + row_at(i)] : make_float4(0.f, 0.f, 0.f, 0.f);
          S[i][c] = a.x, S[i + 1][c] = a.y, S[i + 2][c] = a.z, S[i + 3][c] = a.w;
        }
    } else {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const float4 a = src ? *(const float4*)&src[i * D] : make_float4(0.f, 0.f, 0.f, 0.f);
        S[i][0] = a.x, S[i][1] = a.y, S[i][2] = a.z, S[i][3] = a.w;
      }
    }
  };
  load_state(p.h0 ? p.h0 + slot * p.h0_pitch : nullptr);
  auto store_state_at = [&](float* to) {
    float* dst = to + state_rows;
    if constexpr (V_FIRST) {
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int i = 0; i < R; i += 4)
          *(float4*)&dst[c * D + row_at(i)] = make_float4(S[i][c], S[i + 1][c], S[i + 2][c], S[i + 3][c]);
    } else {
#pragma unroll
      for (int i = 0; i < R; ++i) *(float4*)&dst[i * D] = make_float4(S[i][0], S[i][1], S[i][2], S[i][3]);
    }
  };
  auto store_state = [&](long long to) { store_state_at(p.ht + to * p.ht_pitch); };
  // Where the state after token t goes (null: nowhere): per token with CULA_HT_SLOT_TOKEN /
  // CULA_HT_TOKEN, and into the sequence's states of a speculative verify's cache (params.h). A
  // tree's token reads its parent's back from the cache if there is one, else from the first. Each
  // thread reads back only what it wrote itself, so no barrier is needed between store and load.
  auto token_state = [&](long long t) -> float* {
    if (p.ht_mode == CULA_HT_TOKEN) return p.ht + (bos + t) * p.ht_pitch;
    if (p.ht_mode != CULA_HT_SLOT_TOKEN || t >= p.indices_stride) return nullptr;
    const long long to = load_index(p.state_indices, p.state_indices_int64, (long long)n * p.indices_stride + t);
    return to >= 0 && to < p.num_slots ? p.ht + to * p.ht_pitch : nullptr;
  };
  const long long state_size = (long long)HV * D * D;
  const long long cache_slot = VERIFY && p.cache ? load_index(p.cache_indices, p.cache_indices_int64, n) : -1;
  float* const cache =
      cache_slot >= 0 && cache_slot < p.cache_slots ? p.cache + cache_slot * p.cache_steps * state_size : nullptr;
  auto cached_state = [&](long long t) -> float* {
    return cache && t < p.cache_steps ? cache + t * state_size : nullptr;
  };
  auto load_token = [&](RecurrentToken<R>& x, long long t) {
    load_u16s<R, GAP>(q + t * q_stride, x.q);
    load_u16s<R, GAP>(k + t * k_stride, x.k);
    x.v = *(const uint2*)&v[t * v_stride];
    x.g = p.g && !PER_KEY ? load_bits(p.g, p.g_dtype, gb0 + t * HV) : 0u;
    x.beta = DELTA && p.beta ? load_bits(p.beta, p.beta_dtype, gb0 + t * HV) : 0u;
  };
  // The per-key gate. Token 0: each thread decays its own rows (so a decode step has no barrier
  // more). Tokens t >= 1: thread tid < D computes exp(gate) of key row tid for the whole CTA a token
  // ahead, into decay[t & 1] (read after token t-1's barrier; its raw input loaded a token earlier).
  __shared__ __align__(16) float decay[2][PER_KEY ? D : 4];
  const bool key_gate = PER_KEY && p.g, gate_row = key_gate && tid < D;
  float key_bias = 0.f, g_ahead = 0.f;  // dt_bias of row tid; the raw gate of token t + 1
  auto load_key_gate = [&](long long t) { return load_scalar(p.g, p.g_dtype, (gb0 + t * HV) * D + tid); };

  // Every load of the first token is issued (after the state's) before any of them is used: a
  // decode step is this prologue, one token and the state's store. The token's own loads come
  // last: ptxas may keep its beta (one value for the CTA) in a uniform register, and the move there
  // waits for the load (KDA's value-first decode issued the per-key gate's rows after that wait,
  // a second memory round trip: 79% of the copy bandwidth; session 39).
  u32 g0_bits[R] = {}, b0_bits[R] = {};
  if (PER_KEY && key_gate && len > 0) {
    load_row_bits<R, GAP>(p.g, p.g_dtype, gb0 * D + r0, g0_bits);
    if (p.dt_bias) load_row_bits<R, GAP>(p.dt_bias, p.dt_bias_dtype, (long long)hv * D + r0, b0_bits);
  }
  const u32 a_log_bits = p.a_log ? load_bits(p.a_log, p.a_log_dtype, hv) : 0u;
  const u32 bias_bits = p.dt_bias && !PER_KEY ? load_bits(p.dt_bias, p.dt_bias_dtype, hv) : 0u;
  RecurrentToken<R> cur, nxt;
  if (len > 0) load_token(cur, 0);
  const InGate ig = in_gate(p, a_log_bits, bias_bits);
  if constexpr (PER_KEY) {
    if (key_gate && len > 0) {
      float g0[R], b0[R] = {};
      row_values<R>(g0_bits, p.g_dtype, g0);
      if (p.dt_bias) row_values<R>(b0_bits, p.dt_bias_dtype, b0);
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const float a = __expf(gate_of(p, ig.a, g0[i], b0[i]));
#pragma unroll
        for (int c = 0; c < C; ++c) S[i][c] *= a;
      }
    }
    if (gate_row && len > 1) {
      if (p.dt_bias) key_bias = load_scalar(p.dt_bias, p.dt_bias_dtype, (long long)hv * D + tid);
      g_ahead = load_key_gate(1);
    }
  }

  for (long long t = 0; t < len; ++t) {
    if (t + 1 < len) load_token(nxt, t + 1);
    if (VERIFY && p.parents && t > 0 && t < p.parents_stride) {  // a tree: from the parent's state (before its decay)
      const long long parent = load_index(p.parents, p.parents_int64, (long long)n * p.parents_stride + t);
      const bool known = parent >= 0 && parent < t;
      if (const float* from = known ? (p.cache ? cached_state(parent) : token_state(parent)) : nullptr)
        load_state(from);
    }
    float qf[R], kf[R];
#pragma unroll
    for (int i = 0; i < R / 2; ++i) {
      qf[2 * i] = to_float<T>((u16)(cur.q[i] & 0xffffu));
      qf[2 * i + 1] = to_float<T>((u16)(cur.q[i] >> 16));
      kf[2 * i] = to_float<T>((u16)(cur.k[i] & 0xffffu));
      kf[2 * i + 1] = to_float<T>((u16)(cur.k[i] >> 16));
    }
    if (key_gate) {
      if (t > 0) {  // S' = diag(exp(g_t)) S: the sums below are of S' (token 0's: before the loop)
#pragma unroll
        for (int i = 0; i < R; i += 4) {
          const float4 a = *(const float4*)&decay[t & 1][r0 + row_at(i)];
          const float ai[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int c = 0; c < C; ++c) S[i + j][c] *= ai[j];
        }
      }
      if (gate_row && t + 1 < len) {  // the next token's, visible after this token's barrier
        decay[(t + 1) & 1][tid] = __expf(gate_of(p, ig.a, g_ahead, key_bias));
        if (t + 2 < len) g_ahead = load_key_gate(t + 2);
      }
    }
    // The thread's share of the sums, then the warp's (the lanes of one column lane), then the CTA's.
    float x[kRecSums] = {};
#pragma unroll
    for (int i = 0; i < R; ++i) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (DELTA) x[c] += S[i][c] * kf[i];
        x[C + c] += S[i][c] * qf[i];
      }
      x[8] += kf[i] * kf[i];
      x[9] += qf[i] * qf[i];
      x[10] += kf[i] * qf[i];
    }
#pragma unroll
    for (int j = DELTA ? 0 : C; j < kRecSums; ++j)
#pragma unroll
      for (int m = L::first_xor; m <= L::last_xor; m *= 2) x[j] += __shfl_xor_sync(0xffffffffu, x[j], m);
    float(*buf)[8][12] = red[t & 1];
    if (at.row_lane == 0) {
      float4* dst = (float4*)buf[warp][at.col_lane];
      dst[0] = make_float4(x[0], x[1], x[2], x[3]);
      dst[1] = make_float4(x[4], x[5], x[6], x[7]);
      dst[2] = make_float4(x[8], x[9], x[10], 0.f);
    }
    // One barrier per token: the buffer of this parity is next written two tokens on, after every
    // thread has passed the next token's barrier (so after these reads).
    __syncthreads();
    float y[12] = {};
#pragma unroll
    for (int w = 0; w < L::RW; ++w) {
      const float4* src = (const float4*)buf[at.cw * L::RW + w][at.col_lane];
#pragma unroll
      for (int j = DELTA ? 0 : 1; j < 3; ++j) {
        const float4 a = src[j];
        y[4 * j] += a.x, y[4 * j + 1] += a.y, y[4 * j + 2] += a.z, y[4 * j + 3] += a.w;
      }
    }
    const float rk = p.l2norm ? rsqrtf(y[8] + 1e-6f) : 1.f;
    const float rq = p.l2norm ? rsqrtf(y[9] + 1e-6f) : 1.f;
    const float alpha = p.g && !PER_KEY ? __expf(gate_of(p, ig, bits_value(cur.g, p.g_dtype))) : 1.f;
    const float beta = beta_of(p, DELTA && p.beta ? bits_value(cur.beta, p.beta_dtype) : 1.f);
    const float vv[C] = {to_float<T>((u16)(cur.v.x & 0xffffu)), to_float<T>((u16)(cur.v.x >> 16)),
                         to_float<T>((u16)(cur.v.y & 0xffffu)), to_float<T>((u16)(cur.v.y >> 16))};
    // S_t = alpha S + k u^T with u = beta (v - alpha S^T k) (u = v without the delta rule), so
    // o = scale S_t^T q = scale (alpha S^T q + u (k.q)): both from the sums of the state before
    // (with the per-key gate, S is S' already and alpha = 1).
    float u[C], oc[C];
    const float kq = y[10] * rk * rq, qs = p.scale * rq;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      u[c] = DELTA ? beta * (vv[c] - alpha * rk * y[c]) : vv[c];
      oc[c] = p.scale * u[c] * kq + qs * alpha * y[C + c];
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const float kn = kf[i] * rk;
#pragma unroll
      for (int c = 0; c < C; ++c) S[i][c] = alpha * S[i][c] + kn * u[c];
    }
    if (at.writes_o()) *(uint2*)&o[t * o_stride] = make_uint2(pack2<T>(oc[0], oc[1]), pack2<T>(oc[2], oc[3]));
    if (float* to = token_state(t)) store_state_at(to);
    if (float* to = cached_state(t)) store_state_at(to);
    cur = nxt;
  }
  if (p.ht_mode == CULA_HT_FINAL || p.ht_mode == CULA_HT_SLOT) store_state(slot);
}

// An entry point of the gated recurrence (extern "C", looked up by name from the host); V_FIRST:
// value-first states (h0, ht and pools [.., V, K]); ONE: one token a sequence (the _one kernels).
// A loop kernel keeps the next token's loads in registers (96 a thread: 5 CTAs an SM). A one-token
// kernel at K = 64 fits 64 registers, so 8 CTAs an SM: a decode step's state of 8 KB a CTA is then
// as many bytes in flight as at K = 128 (H200, N=256 HV=32, kernels alone: GDN 77% -> 94% of the
// copy bandwidth, KDA 70% -> 92%, value-first 80% -> 94% and 71% -> 94%). The loop kernels cannot
// take 8: they spill, and long loops ran up to 2.3x slower (GDN B=2 T=4096). At K = 128 one token
// gains nothing (92-95% of the copy either way, at 5, 6 or 7 CTAs an SM), so only K = 64 has _one
// kernels (session 40).
#define CULA_GATED_RECURRENCE_KERNEL(NAME, T, D, DELTA, PER_KEY, V_FIRST, VERIFY, ONE)                 \
  extern "C" __global__ void __launch_bounds__(CULA_GDN_THREADS, ONE && D == 64 ? 8 : 5)              \
      NAME(const __grid_constant__ CulaGdnParams p) {                                                 \
    gated_recurrence<T, D, DELTA, PER_KEY, V_FIRST, VERIFY, ONE>(p);                                  \
  }

// A delta-rule family's token loops (DELTA; PER_KEY: KDA's gate): key-first and value-first
// (_vfirst) states, each without and with a speculative verify's state cache and trees (_verify:
// CulaGdnParams cache / parents). Those put a second state load and store in the token loop (808
// instructions against 646 at K = 128 on sm_90a), which made KDA's decode 1.3x and its long token
// loops 1.56x slower on the H200 (session 38): the host takes the _verify kernels only where a call
// has them.
#define CULA_DELTA_RECURRENCE_KERNELS(NAME, T, D, PER_KEY)                                     \
  CULA_GATED_RECURRENCE_KERNEL(NAME, T, D, true, PER_KEY, false, false, false)                 \
  CULA_GATED_RECURRENCE_KERNEL(NAME##_vfirst, T, D, true, PER_KEY, true, false, false)         \
  CULA_GATED_RECURRENCE_KERNEL(NAME##_verify, T, D, true, PER_KEY, false, true, false)         \
  CULA_GATED_RECURRENCE_KERNEL(NAME##_vfirst_verify, T, D, true, PER_KEY, true, true, false)

// A delta-rule family's one-token kernels (K = 64 only: see CULA_GATED_RECURRENCE_KERNEL).
#define CULA_DELTA_ONE_TOKEN_KERNELS(NAME, T, PER_KEY)                                         \
  CULA_GATED_RECURRENCE_KERNEL(NAME##_one, T, 64, true, PER_KEY, false, false, true)           \
  CULA_GATED_RECURRENCE_KERNEL(NAME##_vfirst_one, T, 64, true, PER_KEY, true, false, true)
