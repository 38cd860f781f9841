// Linear attention with a per-head scalar decay (FLA's simple_gla with g_gamma, Lightning
// Attention). Compiled by NVRTC for each real target of the fat binary; no CUDA headers.
//
// Recurrence for one (sequence, head), with gamma = exp(g_gamma[h]) and S a D x D fp32 state:
//     S_t = gamma * S_{t-1} + k_t^T v_t,      o_t = scale * q_t S_t
//
// Kernels (extern "C", looked up by name from the host):
//   cula_chunk_<dtype>_d<D>_generic  chunked prefill, warp-level mma.sync + cp.async (sm_80+;
//                                    this is what the sm_100 family runs for now)
//   cula_chunk_<dtype>_d<D>_sm90a    the same math, tiles brought in by the Hopper tensor-copy
//                                    engine (TMA boxes + mbarrier); body only in sm_90a code
//   cula_recurrent_<dtype>_d<D>      token-by-token recurrence (fused_recurrent, decode)
#include "params.h"

typedef unsigned int u32;
typedef unsigned short u16;

struct bf16_tag {};
struct f16_tag {};

// ---------------------------------------------------------------------------------------------
// Small PTX helpers
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

template <typename T> __device__ __forceinline__ u32 pack2(float lo, float hi);
template <> __device__ __forceinline__ u32 pack2<bf16_tag>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <> __device__ __forceinline__ u32 pack2<f16_tag>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <typename T> __device__ __forceinline__ float to_float(u16 x);
template <> __device__ __forceinline__ float to_float<bf16_tag>(u16 x) {
  return __uint_as_float(((u32)x) << 16);
}
template <> __device__ __forceinline__ float to_float<f16_tag>(u16 x) {
  float r;
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x));
  return r;
}

template <typename T> __device__ __forceinline__ u32 scale2(u32 x, float lo, float hi) {
  return pack2<T>(to_float<T>((u16)(x & 0xffffu)) * lo, to_float<T>((u16)(x >> 16)) * hi);
}

// D = A * B + D, m16n8k16, fp32 accumulate.
template <typename T> __device__ __forceinline__ void mma(float* c, const u32* a, u32 b0, u32 b1);
template <> __device__ __forceinline__ void mma<bf16_tag>(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma<f16_tag>(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(u32* r, const u16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(u32* r, const u16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// 16-byte asynchronous copy; zero-fills the destination when valid is false.
__device__ __forceinline__ void cp_async16(u16* dst, const u16* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void seq_bounds(const CulaSeqs& s, int n, long long& bos, long long& len) {
  if (s.cu_seqlens) {
    long long a, b;
    if (s.cu_seqlens_int64) {
      a = ((const long long*)s.cu_seqlens)[n];
      b = ((const long long*)s.cu_seqlens)[n + 1];
    } else {
      a = ((const int*)s.cu_seqlens)[n];
      b = ((const int*)s.cu_seqlens)[n + 1];
    }
    bos = a;
    len = b - a;
  } else {
    bos = (long long)n * s.seq_len;
    len = s.seq_len;
  }
}

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
  seq_bounds(p.seqs, n, r.bos, r.len);
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
// One CTA of 4 warps owns (sequence n, head h, value slice vb of CULA_BLOCK_V columns) and walks
// the sequence chunk by chunk, keeping its D x BV slice of the state in fp32 registers. For a
// chunk of L <= C tokens with in-chunk positions i, j and g = log2(gamma):
//   A_ij = (q_i . k_j) 2^{g (i-j)}  for j <= i
//   o_i  = scale * (2^{g (i+1)} q_i S + sum_j A_ij v_j)
//   S   <- 2^{g L} S + sum_j 2^{g (L-1-j)} k_j^T v_j
// Warp w computes rows [16w, 16w+16) of A and o, and rows [w D/4, (w+1) D/4) of S.
//
// The two variants differ only in how tiles reach shared memory and how they are laid out there:
//   generic: cp.async 16-byte copies into rows padded by 16 bytes (conflict-free ldmatrix);
//   sm90a:   one TMA tensor copy per 64 x 64 box (cp.async.bulk.tensor + mbarrier), boxes stored
//            densely in the 128-byte swizzle, which is conflict-free for ldmatrix as well.

// Tile addressing: element (r, c) of a tile, c a multiple of 8 where ldmatrix reads.
struct PaddedTile {
  u16* base;
  int pitch;
  __device__ __forceinline__ u16* at(int r, int c) const { return base + r * pitch + c; }
};
struct SwizzledTile {  // boxes of 64 columns x CULA_CHUNK rows, 128-byte swizzle
  u16* base;
  __device__ __forceinline__ u16* at(int r, int c) const {
    return base + (c >> 6) * (CULA_CHUNK * 64) + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
  }
};

template <int D, bool TMA>
struct ChunkSmem;

template <int D>
struct ChunkSmem<D, false> {
  static constexpr int P = D + 8, PV = CULA_BLOCK_V + 8;
  u16 q[2][CULA_CHUNK * P];
  u16 k[2][CULA_CHUNK * P];
  u16 v[2][CULA_CHUNK * PV];
  u16 s[D * PV];  // bf16/fp16 copy of the state, operand of q S
  __device__ PaddedTile q_tile(int b) { return {q[b], P}; }
  __device__ PaddedTile k_tile(int b) { return {k[b], P}; }
  __device__ PaddedTile v_tile(int b) { return {v[b], PV}; }
  static __device__ ChunkSmem& get(unsigned char* raw) { return *reinterpret_cast<ChunkSmem*>(raw); }
};

template <int D>
struct ChunkSmem<D, true> {
  static constexpr int PV = CULA_BLOCK_V + 8;
  u16 q[2][CULA_CHUNK * D];  // every tile is a multiple of 1 KiB: all stay 1024-byte aligned
  u16 k[2][CULA_CHUNK * D];
  u16 v[2][CULA_CHUNK * CULA_BLOCK_V];
  u16 s[D * PV];
  unsigned long long bar[2];
  __device__ SwizzledTile q_tile(int b) { return {q[b]}; }
  __device__ SwizzledTile k_tile(int b) { return {k[b]}; }
  __device__ SwizzledTile v_tile(int b) { return {v[b]}; }
  static __device__ ChunkSmem& get(unsigned char* raw) {  // the swizzle needs 1024-byte alignment
    const u32 a = smem_addr(raw);
    return *reinterpret_cast<ChunkSmem*>(raw + (((a + 1023u) & ~1023u) - a));
  }
};

// Asynchronously load chunk rows [tok0, tok0 + rows) of q, k and v into buffer `buf`.
// (hr: the sequence's rows; h, vb: head and value slice, which the TMA coordinates need.)
template <int D>
__device__ __forceinline__ void chunk_load(ChunkSmem<D, false>& sm, const CulaChunkParams&, const HeadRows& hr,
                                           int, int, int buf, long long tok0, int rows) {
  constexpr int C = CULA_CHUNK, BV = CULA_BLOCK_V, P = ChunkSmem<D, false>::P, PV = ChunkSmem<D, false>::PV;
  const u16 *q = hr.q, *k = hr.k, *v = hr.v;
  const long long row_stride = hr.row_stride;
  const int tid = threadIdx.x;
  for (int i = tid; i < C * (D / 8); i += CULA_THREADS) {
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    const bool ok = r < rows;
    const long long off = ok ? (tok0 + r) * row_stride + c : 0;
    cp_async16(&sm.q[buf][r * P + c], q + off, ok);
    cp_async16(&sm.k[buf][r * P + c], k + off, ok);
  }
  for (int i = tid; i < C * (BV / 8); i += CULA_THREADS) {
    const int r = i / (BV / 8), c = (i % (BV / 8)) * 8;
    const bool ok = r < rows;
    cp_async16(&sm.v[buf][r * PV + c], v + (ok ? (tok0 + r) * row_stride + c : 0), ok);
  }
  cp_async_commit();
}

__device__ __forceinline__ void tma_load_2d(void* dst, const CulaTensorMap* map, int x, int y, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_addr(dst)),
      "l"(map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

template <int D>
__device__ __forceinline__ void chunk_load(ChunkSmem<D, true>& sm, const CulaChunkParams& p, const HeadRows& hr,
                                           int h, int vb, int buf, long long tok0, int) {
  constexpr int C = CULA_CHUNK, BV = CULA_BLOCK_V;
  if (threadIdx.x == 0) {
    const u32 bar = smem_addr(&sm.bar[buf]);
    const u32 bytes = (2 * C * D + C * BV) * 2;  // whole boxes, rows past the tensor's end included
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
    const int y = (int)(hr.bos + tok0);
#pragma unroll
    for (int j = 0; j < D / 64; ++j) {
      tma_load_2d(&sm.q[buf][j * C * 64], &p.tma_q, h * D + j * 64, y, bar);
      tma_load_2d(&sm.k[buf][j * C * 64], &p.tma_k, h * D + j * 64, y, bar);
    }
    tma_load_2d(sm.v[buf], &p.tma_v, h * D + vb * BV, y, bar);
  }
}

// Wait for chunk `chunk` (rows valid rows); rows past the sequence end are zeroed.
template <int D>
__device__ __forceinline__ void chunk_wait(ChunkSmem<D, false>&, int, int, bool more_in_flight) {
  // cp.async already zero-filled the rows past the end of the sequence.
  if (more_in_flight) cp_async_wait<1>();
  else cp_async_wait<0>();
  __syncthreads();
}

template <int D>
__device__ __forceinline__ void chunk_wait(ChunkSmem<D, true>& sm, int chunk, int rows, bool) {
  constexpr int C = CULA_CHUNK;
  const int buf = chunk & 1;
  const u32 bar = smem_addr(&sm.bar[buf]);
  const u32 parity = (chunk >> 1) & 1;
  u32 done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
  if (rows < C) {
    // The boxes hold whatever follows the sequence in memory (the next sequence, or zeros past
    // the tensor): clear those rows. A row of a box is 128 contiguous bytes whatever the swizzle.
    const int n = (C - rows) * 8;  // 16-byte pieces per box
    for (int i = threadIdx.x; i < n * (2 * (D / 64) + 1); i += CULA_THREADS) {
      const int box = i / n, piece = i % n;
      u16* base = box < D / 64 ? sm.q[buf] + box * C * 64
                 : box < 2 * (D / 64) ? sm.k[buf] + (box - D / 64) * C * 64 : sm.v[buf];
      *(uint4*)(base + rows * 64 + piece * 8) = make_uint4(0, 0, 0, 0);
    }
  }
  __syncthreads();
}

template <typename T, int D, bool TMA>
__device__ __forceinline__ void chunk_fwd(const CulaChunkParams& p) {
  constexpr int C = CULA_CHUNK, BV = CULA_BLOCK_V, PV = ChunkSmem<D, TMA>::PV;
  constexpr int MT = D / 64;  // 16-row tiles of the state per warp
  extern __shared__ __align__(128) unsigned char smem_raw[];
  ChunkSmem<D, TMA>& sm = ChunkSmem<D, TMA>::get(smem_raw);
  const PaddedTile ts{sm.s, PV};

  const int vb = blockIdx.x, h = blockIdx.y, n = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const HeadRows hr = head_rows<D, BV>(p, n, h, vb);
  u16* o = hr.o;
  const long long len = hr.len, row_stride = hr.row_stride;
  const int H = p.heads;
  const float glog2 = p.g_gamma ? p.g_gamma[h] * 1.4426950408889634f : 0.f;
  const long long state_off = ((long long)n * H + h) * D * D + vb * BV;

  if constexpr (TMA) {
    if (tid == 0) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&sm.bar[0])) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&sm.bar[1])) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
  }

  const int nchunks = (int)((len + C - 1) / C);
  if (nchunks > 0) chunk_load<D>(sm, p, hr, h, vb, 0, 0, (int)(len < C ? len : C));

  // State slice of this warp: rows warp*D/4 + mt*16 + {g, g+8}, columns nt*8 + 2t + {0, 1}.
  float S[MT][8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = warp * (D / 4) + mt * 16 + g + hf * 8, col = nt * 8 + 2 * t;
        float2 s0 = make_float2(0.f, 0.f);
        if (p.h0) s0 = *(const float2*)&p.h0[state_off + (long long)row * D + col];
        S[mt][nt][2 * hf] = s0.x;
        S[mt][nt][2 * hf + 1] = s0.y;
        *(u32*)ts.at(row, col) = pack2<T>(s0.x, s0.y);
      }

  for (int c = 0; c < nchunks; ++c) {
    const int buf = c & 1;
    const long long tok0 = (long long)c * C;
    const long long left = len - tok0;
    const int rows = (int)(left < C ? left : C);
    const bool prefetch = c + 1 < nchunks;
    if (prefetch) {
      const long long left1 = left - C;
      chunk_load<D>(sm, p, hr, h, vb, buf ^ 1, tok0 + C, (int)(left1 < C ? left1 : C));
    }
    chunk_wait<D>(sm, c, rows, prefetch);
    const auto tq = sm.q_tile(buf);
    const auto tk = sm.k_tile(buf);
    const auto tv = sm.v_tile(buf);

    // ---- A = (Q K^T) masked and decayed: rows [16 warp, +16), all C columns.
    float A[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) A[nt][0] = A[nt][1] = A[nt][2] = A[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      u32 a[4];
      ldsm_x4(a, tq.at(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        if (np * 16 > warp * 16 + 15) continue;  // above the diagonal: masked anyway
        u32 b[4];
        ldsm_x4(b, tk.at(np * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 16 + ((lane >> 3) & 1) * 8));
        mma<T>(A[2 * np], a, b[0], b[1]);
        mma<T>(A[2 * np + 1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = warp * 16 + g + (e >> 1) * 8, j = nt * 8 + 2 * t + (e & 1);
        A[nt][e] = j <= i ? A[nt][e] * fast_exp2(glog2 * (float)(i - j)) : 0.f;
      }

    // ---- O = 2^{g(i+1)} Q S + A V
    float O[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) O[nt][0] = O[nt][1] = O[nt][2] = O[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      u32 a[4];
      ldsm_x4(a, tq.at(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        u32 b[4];
        ldsm_x4_trans(b, ts.at(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, np * 16 + (lane >> 4) * 8));
        mma<T>(O[2 * np], a, b[0], b[1]);
        mma<T>(O[2 * np + 1], a, b[2], b[3]);
      }
    }
    {
      const float f0 = fast_exp2(glog2 * (float)(warp * 16 + g + 1));
      const float f1 = fast_exp2(glog2 * (float)(warp * 16 + g + 9));
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        O[nt][0] *= f0;
        O[nt][1] *= f0;
        O[nt][2] *= f1;
        O[nt][3] *= f1;
      }
    }
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
      if (kk > warp) continue;  // A is zero there
      u32 a[4] = {pack2<T>(A[2 * kk][0], A[2 * kk][1]), pack2<T>(A[2 * kk][2], A[2 * kk][3]),
                  pack2<T>(A[2 * kk + 1][0], A[2 * kk + 1][1]), pack2<T>(A[2 * kk + 1][2], A[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        u32 b[4];
        ldsm_x4_trans(b, tv.at(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, np * 16 + (lane >> 4) * 8));
        mma<T>(O[2 * np], a, b[0], b[1]);
        mma<T>(O[2 * np + 1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = warp * 16 + g + hf * 8;
      if (i < rows) {
        u16* orow = o + (tok0 + i) * row_stride + 2 * t;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          *(u32*)&orow[nt * 8] = pack2<T>(p.scale * O[nt][2 * hf], p.scale * O[nt][2 * hf + 1]);
      }
    }

    // ---- S = 2^{g L} S + sum_j 2^{g (L-1-j)} k_j^T v_j  (registers only; smem copy after the barrier)
    {
      const float gl = fast_exp2(glog2 * (float)rows);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) S[mt][nt][e] *= gl;
    }
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
      float f[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = kk * 16 + 2 * t + (e & 1) + (e >> 1) * 8;
        f[e] = j < rows ? fast_exp2(glog2 * (float)(rows - 1 - j)) : 0.f;
      }
      u32 b[4][4];
#pragma unroll
      for (int np = 0; np < 4; ++np)
        ldsm_x4_trans(b[np], tv.at(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, np * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int m0 = warp * (D / 4) + mt * 16;
        u32 a[4];
        ldsm_x4_trans(a, tk.at(kk * 16 + (lane & 7) + ((lane >> 4) & 1) * 8, m0 + ((lane >> 3) & 1) * 8));
        a[0] = scale2<T>(a[0], f[0], f[1]);
        a[1] = scale2<T>(a[1], f[0], f[1]);
        a[2] = scale2<T>(a[2], f[2], f[3]);
        a[3] = scale2<T>(a[3], f[2], f[3]);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          mma<T>(S[mt][2 * np], a, b[np][0], b[np][1]);
          mma<T>(S[mt][2 * np + 1], a, b[np][2], b[np][3]);
        }
      }
    }
    __syncthreads();  // every warp is done with the state copy and with this chunk's buffers
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int row = warp * (D / 4) + mt * 16 + g + hf * 8, col = nt * 8 + 2 * t;
          *(u32*)ts.at(row, col) = pack2<T>(S[mt][nt][2 * hf], S[mt][nt][2 * hf + 1]);
        }
  }

  if (p.ht) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int row = warp * (D / 4) + mt * 16 + g + hf * 8, col = nt * 8 + 2 * t;
          *(float2*)&p.ht[state_off + (long long)row * D + col] =
              make_float2(S[mt][nt][2 * hf], S[mt][nt][2 * hf + 1]);
        }
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
  const int H = p.heads;

  long long slot = n;
  if (p.state_indices)
    slot = p.state_indices_int64 ? ((const long long*)p.state_indices)[n] : ((const int*)p.state_indices)[n];
  if (slot < 0 || (p.state_indices && slot >= p.num_slots)) {  // padding slot: zero output, state untouched
    for (long long i = tid; i < len * (BV / 2); i += CULA_THREADS)
      *(u32*)&o[(i / (BV / 2)) * row_stride + (i % (BV / 2)) * 2] = 0u;
    return;
  }
  const long long state_off = (slot * H + h) * (long long)D * D + vb * BV + cg * 4;
  const float decay = p.g_gamma ? fast_exp2(p.g_gamma[h] * 1.4426950408889634f) : 1.f;

  float4 s[R];
#pragma unroll
  for (int i = 0; i < R; ++i)
    s[i] = p.h0 ? *(const float4*)&p.h0[state_off + (long long)(rg + 16 * i) * D] : make_float4(0.f, 0.f, 0.f, 0.f);

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
    const long long out_off = (slot * H + h) * (long long)D * D + vb * BV + cg * 4;
#pragma unroll
    for (int i = 0; i < R; ++i) *(float4*)&p.ht[out_off + (long long)(rg + 16 * i) * D] = s[i];
  }
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------
// The sm_90a variant exists in every cubin so that kernel lookup is uniform, but only the sm_90a
// cubin has its body; the host never launches it on another architecture.
template <typename T, int D>
__device__ __forceinline__ void chunk_fwd_sm90a(const CulaChunkParams& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  chunk_fwd<T, D, true>(p);
#else
  __trap();
#endif
}

#define CULA_CHUNK_KERNELS(TAG, T, D)                                                                 \
  extern "C" __global__ void __launch_bounds__(CULA_THREADS, 1)                                        \
      cula_chunk_##TAG##_d##D##_generic(const __grid_constant__ CulaChunkParams p) {                  \
    chunk_fwd<T, D, false>(p);                                                                         \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(CULA_THREADS, 1)                                        \
      cula_chunk_##TAG##_d##D##_sm90a(const __grid_constant__ CulaChunkParams p) {                    \
    chunk_fwd_sm90a<T, D>(p);                                                                          \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(CULA_THREADS)                                           \
      cula_recurrent_##TAG##_d##D(const CulaRecurrentParams p) {                                      \
    recurrent_fwd<T, D>(p);                                                                            \
  }

CULA_CHUNK_KERNELS(bf16, bf16_tag, 64)
CULA_CHUNK_KERNELS(bf16, bf16_tag, 128)
CULA_CHUNK_KERNELS(f16, f16_tag, 64)
CULA_CHUNK_KERNELS(f16, f16_tag, 128)

static_assert(sizeof(ChunkSmem<64, false>) <= CULA_CHUNK_SMEM_BYTES(64), "smem size out of sync with params.h");
static_assert(sizeof(ChunkSmem<128, false>) <= CULA_CHUNK_SMEM_BYTES(128), "smem size out of sync with params.h");
static_assert(sizeof(ChunkSmem<64, true>) + 1024 <= CULA_CHUNK_TMA_SMEM_BYTES(64), "smem size out of sync");
static_assert(sizeof(ChunkSmem<128, true>) + 1024 <= CULA_CHUNK_TMA_SMEM_BYTES(128), "smem size out of sync");
