// The token-by-token recurrence of gated linear attention, with or without the delta rule
// (CulaGdnParams): fused_recurrent and serving decode of the gated delta rule, and simple_gla with
// a per-token gate. A family's kernel file declares its entry points with
// CULA_GATED_RECURRENCE_KERNEL (gated_recurrence<T, D, DELTA>).
//
// Layout: a CTA of CULA_GDN_WARPS warps covers CULA_GDN_BLOCK_V value columns of one (sequence n,
// value head hv); each warp owns CULA_GDN_WARP_V = 8 of them for all D rows, lane l the rows
// l + 32 i (R = D / 32 of them) in fp32 registers. A reduction over the rows (S^T k, S^T q) is then a
// warp's alone: no barrier anywhere, each warp runs its tokens on its own. The 8 column sums of a
// warp are reduce-scattered (9 shuffles: lane l ends with column warp_column(l)) instead of 8
// butterflies of 5.
#pragma once

#include "common/ptx.cuh"
#include "common/seqs.cuh"
#include "params.h"

__device__ __forceinline__ float load_scalar(const void* p, int dtype, long long i) {
  if (dtype == CULA_F32) return ((const float*)p)[i];
  const u16 x = ((const u16*)p)[i];
  return dtype == CULA_BF16 ? to_float<bf16_tag>(x) : to_float<f16_tag>(x);
}

// The column (0..7) a lane holds after warp_reduce_scatter8: lane bits 4, 3, 2 are its bits 2, 1, 0.
__device__ __forceinline__ int warp_column(int lane) {
  return ((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1);
}

// Sum of x[c] over the warp for the lane's column warp_column(lane).
__device__ __forceinline__ float warp_reduce_scatter8(const float (&x)[8]) {
  const int lane = threadIdx.x & 31;
  const bool b16 = lane & 16, b8 = lane & 8, b4 = lane & 4;
  float a[4], b[2];
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // halves 0-3 / 4-7 between lanes l and l ^ 16
    const float mine = b16 ? x[j + 4] : x[j], theirs = b16 ? x[j] : x[j + 4];
    a[j] = mine + __shfl_xor_sync(0xffffffffu, theirs, 16);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float mine = b8 ? a[j + 2] : a[j], theirs = b8 ? a[j] : a[j + 2];
    b[j] = mine + __shfl_xor_sync(0xffffffffu, theirs, 8);
  }
  float c = (b4 ? b[1] : b[0]) + __shfl_xor_sync(0xffffffffu, b4 ? b[0] : b[1], 4);
  c += __shfl_xor_sync(0xffffffffu, c, 2);
  c += __shfl_xor_sync(0xffffffffu, c, 1);
  return c;
}

// Every lane gets all 8 columns back from the lanes holding them.
__device__ __forceinline__ void warp_gather8(float (&out)[8], float mine) {
#pragma unroll
  for (int c = 0; c < 8; ++c) out[c] = __shfl_sync(0xffffffffu, mine, ((c >> 2) << 4) | (((c >> 1) & 1) << 3) | ((c & 1) << 2));
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// The gates as the kernels use them (both the token loop and the chunked kernel): the in-kernel
// gate -exp(A_log) softplus(g + dt_bias) (softplus as FLA's: linear above 20) when A_log is given,
// beta's (scaled) sigmoid when asked. InGate holds the value head's constants.
struct InGate {
  float a_neg, dt_bias;
};
__device__ __forceinline__ InGate in_gate(const CulaGdnParams& p, int hv) {
  return {p.a_log ? -__expf(load_scalar(p.a_log, p.a_log_dtype, hv)) : 0.f,
          p.dt_bias ? load_scalar(p.dt_bias, p.dt_bias_dtype, hv) : 0.f};
}
__device__ __forceinline__ float gate_of(const CulaGdnParams& p, const InGate& ig, float g) {
  if (!p.a_log) return g;
  const float x = g + ig.dt_bias;
  return ig.a_neg * (x > 20.f ? x : log1pf(__expf(x)));
}
__device__ __forceinline__ float beta_of(const CulaGdnParams& p, float beta) {
  return p.beta_sigmoid ? p.beta_scale / (1.f + __expf(-beta)) : beta;
}

// One token's inputs as loaded (the next token's are loaded while this one is computed).
template <int R>
struct RecurrentToken {
  u16 q[R], k[R];
  uint4 v;  // the warp's 8 value columns
  float g, beta;
};

template <typename T, int D, bool DELTA>
__device__ __forceinline__ void gated_recurrence(const CulaGdnParams& p) {
  constexpr int R = D / 32, W = CULA_GDN_WARP_V;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hv = blockIdx.y, n = blockIdx.z, HV = p.v_heads, H = p.heads;
  const int h = hv / (HV / H);
  const int c0 = blockIdx.x * CULA_GDN_BLOCK_V + warp * W;  // the warp's first value column
  long long bos, len;
  clamped_seq_bounds(p.seqs, n, p.total_tokens, bos, len);

  const long long qk_stride = (long long)H * D, v_stride = (long long)HV * D;
  const u16* q = (const u16*)p.q + bos * qk_stride + (long long)h * D + lane;
  const u16* k = (const u16*)p.k + bos * qk_stride + (long long)h * D + lane;
  const u16* v = (const u16*)p.v + bos * v_stride + (long long)hv * D + c0;
  u16* o = (u16*)p.o + bos * v_stride + (long long)hv * D + c0;
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
      if (lane < W / 2)
        for (long long t = 0; t < len; ++t) *(u32*)&o[t * v_stride + 2 * lane] = 0u;
      return;
    }
  }
  const long long state_rows = ((long long)hv) * D * D + c0;  // + slot * HV * D * D + row * D
  float S[R][W];
  {
    const float* h0 = p.h0 ? p.h0 + slot * HV * (long long)D * D + state_rows : nullptr;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const long long r = (long long)(lane + 32 * i) * D;
      const float4 a = h0 ? *(const float4*)&h0[r] : make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 b = h0 ? *(const float4*)&h0[r + 4] : make_float4(0.f, 0.f, 0.f, 0.f);
      S[i][0] = a.x, S[i][1] = a.y, S[i][2] = a.z, S[i][3] = a.w;
      S[i][4] = b.x, S[i][5] = b.y, S[i][6] = b.z, S[i][7] = b.w;
    }
  }
  auto store_state = [&](long long to) {
    float* dst = p.ht + to * HV * (long long)D * D + state_rows;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const long long r = (long long)(lane + 32 * i) * D;
      *(float4*)&dst[r] = make_float4(S[i][0], S[i][1], S[i][2], S[i][3]);
      *(float4*)&dst[r + 4] = make_float4(S[i][4], S[i][5], S[i][6], S[i][7]);
    }
  };
  auto load_token = [&](RecurrentToken<R>& x, long long t) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      x.q[i] = q[t * qk_stride + 32 * i];
      x.k[i] = k[t * qk_stride + 32 * i];
    }
    x.v = *(const uint4*)&v[t * v_stride];
    x.g = p.g ? load_scalar(p.g, p.g_dtype, gb0 + t * HV) : 0.f;
    x.beta = DELTA && p.beta ? load_scalar(p.beta, p.beta_dtype, gb0 + t * HV) : 1.f;
  };
  const InGate ig = in_gate(p, hv);

  RecurrentToken<R> cur, nxt;
  if (len > 0) load_token(cur, 0);
  for (long long t = 0; t < len; ++t) {
    if (t + 1 < len) load_token(nxt, t + 1);
    float qf[R], kf[R];
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      qf[i] = to_float<T>(cur.q[i]);
      kf[i] = to_float<T>(cur.k[i]);
      sq += qf[i] * qf[i];
      sk += kf[i] * kf[i];
    }
    float qs = p.scale;
    if (p.l2norm) {
      qs *= rsqrtf(warp_sum(sq) + 1e-6f);
      const float rk = rsqrtf(warp_sum(sk) + 1e-6f);
#pragma unroll
      for (int i = 0; i < R; ++i) kf[i] *= rk;
    }
#pragma unroll
    for (int i = 0; i < R; ++i) qf[i] *= qs;
    const float g = gate_of(p, ig, cur.g);
    const float alpha = p.g ? __expf(g) : 1.f;
    float vv[W];
    {
      const u32 w[4] = {cur.v.x, cur.v.y, cur.v.z, cur.v.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        vv[2 * c] = to_float<T>((u16)(w[c] & 0xffffu));
        vv[2 * c + 1] = to_float<T>((u16)(w[c] >> 16));
      }
    }
    if (DELTA) {
      const float beta = beta_of(p, cur.beta);
      float part[W];
#pragma unroll
      for (int c = 0; c < W; ++c) {
        part[c] = 0.f;
#pragma unroll
        for (int i = 0; i < R; ++i) part[c] += S[i][c] * kf[i];
      }
      float u[W];
      warp_gather8(u, warp_reduce_scatter8(part));
#pragma unroll
      for (int c = 0; c < W; ++c) vv[c] = beta * (vv[c] - alpha * u[c]);
    }
    float part[W];
#pragma unroll
    for (int c = 0; c < W; ++c) {
      part[c] = 0.f;
#pragma unroll
      for (int i = 0; i < R; ++i) {
        S[i][c] = alpha * S[i][c] + kf[i] * vv[c];
        part[c] += S[i][c] * qf[i];
      }
    }
    const float oc = warp_reduce_scatter8(part);
    if ((lane & 3) == 0) o[t * v_stride + warp_column(lane)] = (u16)(pack2<T>(oc, 0.f) & 0xffffu);
    if (p.ht_mode == CULA_HT_SLOT_TOKEN) {
      const long long to = t < p.indices_stride
                               ? load_index(p.state_indices, p.state_indices_int64, (long long)n * p.indices_stride + t)
                               : -1;
      if (to >= 0 && to < p.num_slots) store_state(to);
    } else if (p.ht_mode == CULA_HT_TOKEN) {
      store_state(bos + t);
    }
    cur = nxt;
  }
  if (p.ht_mode == CULA_HT_FINAL || p.ht_mode == CULA_HT_SLOT) store_state(slot);
}

// An entry point of the gated recurrence (extern "C", looked up by name from the host).
#define CULA_GATED_RECURRENCE_KERNEL(NAME, T, D, DELTA)                                                \
  extern "C" __global__ void __launch_bounds__(32 * CULA_GDN_WARPS)                                   \
      NAME(const __grid_constant__ CulaGdnParams p) {                                                 \
    gated_recurrence<T, D, DELTA>(p);                                                                 \
  }
