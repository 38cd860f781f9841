// CTAs that walk several (sequence n, value head hv, value slice vb) items of a chunked prefill, one
// after the other, so that a CTA's pipeline runs on from one item's last chunk into the next item's
// first. A CTA that walks one item pays its pipeline's fill and drain (the first chunk's loads
// before any product, the last chunk's output after the state is done) each time, and a serving
// batch of 64 sequences of 128 tokens on average is 4096 items of 2 chunks. The kernels that walk:
// the gated delta rule's one-launch kernel (common/chunk_gated.cuh, its _walk entry points). (The
// two-launch state kernel walking was tried, branch exp/kda-walk: its chunk loop's control went to
// the vector pipe, notes/gated-delta-rule.md, session 31.)
//
// A launch of G CTAs (blockIdx.x; the host sizes G so that no CTA takes more than CULA_WALK_ITEMS
// items) orders the items u = (rank of the sequence, longest first: longest_first) HV NV + hv NV +
// vb, and CTA b takes u = k G + b in rounds k = 0, 2, ... and k G + G - 1 - b in rounds 1, 3, ...
// (a snake): the long sequences start first, and the rounds' differences even out. (Planned in a
// model of G = 132 CTAs, each item its chunks plus two for the fill and drain: on 20 random
// lengths summing to 8192 tokens, 72 chunk times against 88 for a CTA an item in index order.)
// With G = items, each CTA takes item b alone.
//
// The CTA's items are worked out once, into shared memory (walk_table_fill); the roles walk the
// table. An item without chunks (an empty sequence) gets its final state there, and no role stops
// at it (walk_skip).
#pragma once

#include "common/ptx.cuh"
#include "common/seqs.cuh"
#include "params.h"

struct WalkItem {
  long long bos, len;
  int n, hv, vb, nchunks;
};
// qk0[j], v0[j]: the offsets of item j's first token in q and k (its head) and in v and o (its value
// slice), worked out once here (by the loader at each chunk, from the item, they cost a walking
// CTA's chunk 5-8% at sm_90a, session 52). Arrays of their own: a WalkItem of 24 or 48 bytes made
// ptxas serialise the walk's wgmma (C7520).
struct WalkTable {
  WalkItem items[CULA_WALK_ITEMS];
  long long qk0[CULA_WALK_ITEMS], v0[CULA_WALK_ITEMS];
  int count;
};

// The CTA's k-th item of the walk. Every lane of a warp calls it (longest_first).
template <int D>
__device__ __forceinline__ WalkItem walk_item(const CulaGdnParams& p, int k) {
  constexpr int NV = D / CULA_BLOCK_V;
  const int G = (int)gridDim.x, b = (int)blockIdx.x, per = p.v_heads * NV;
  const long long u = (long long)k * G + (k & 1 ? G - 1 - b : b);
  WalkItem it;
  const int rem = (int)(u % per);
  it.n = longest_first(p.seqs, (int)(u / per), p.total_tokens);
  it.hv = rem / NV;
  it.vb = rem % NV;
  clamped_seq_bounds(p.seqs, it.n, p.total_tokens, it.bos, it.len);
  it.nchunks = (int)((it.len + CULA_CHUNK - 1) / CULA_CHUNK);
  return it;
}

// The offset of an item's state slice in h0 / ht (state_slice_at).
template <int D>
__device__ __forceinline__ long long walk_state_at(const CulaGdnParams& p, const WalkItem& it) {
  return state_slice_at<D>(p.v_heads, it.n, it.hv, it.vb);
}

// The item's state slice of h0 into L2 (N threads, tid among them). A walking CTA's chain loads each
// later item's state between the previous item's last chunk and this item's first, with nothing
// else to wait on (the one-item kernel's chain loads its one state while the loader's first boxes
// come in), so the output warpgroup prefetches the next item's as it starts an item. Session 51
// (H200, 16384 tokens at H=16 HV=32 walked, ms): 256 sequences of 64 tokens 0.683 -> 0.598 at
// sm90a, 0.904 -> 0.722 generic; 64 random lengths 1.00x / 0.93x; few or long items unchanged.
// (Prefetched by the chain at an item's last chunk, or by the loader at an item's first, it gained
// as much at many items, but every chunk at sm90a took 7-10% longer, with one item a CTA too:
// those roles' code laid out anew.)
template <int D, int N>
__device__ __forceinline__ void walk_prefetch_state(const CulaGdnParams& p, const WalkItem& it, int tid) {
  if (p.h0 == nullptr) return;
  const float* s0 = p.h0 + walk_state_at<D>(p, it);
  for (int i = tid; i < 2 * D; i += N) prefetch_l2(s0 + (long long)(i >> 1) * D + (i & 1) * 32);  // (128-byte lines)
}

// Every warp of the CTA of THREADS threads (all threads call it, before the roles part): the table,
// warp w the items w, w + W, ...; a warp that finds an item without chunks writes its final state
// (its initial one). A CTA barrier ends it.
template <int D, int THREADS>
__device__ __forceinline__ void walk_table_fill(WalkTable& walk, const CulaGdnParams& p) {
  constexpr int W = THREADS / 32;
  const int G = (int)gridDim.x, b = (int)blockIdx.x, lane = threadIdx.x & 31;
  const long long all = (long long)p.seqs.num_seqs * p.v_heads * (D / CULA_BLOCK_V);
  const int rounds = (int)(all / G), rest = (int)(all % G);  // (the last round's CTAs: b < rest, or G - 1 - b)
  const int count = rounds + ((rounds & 1 ? G - 1 - b : b) < rest ? 1 : 0);
  for (int k = threadIdx.x >> 5; k < count; k += W) {
    const WalkItem it = walk_item<D>(p, k);
    if (lane == 0) {
      walk.items[k] = it;
      walk.qk0[k] = qk_row_at<D>(p.heads, p.v_heads, it.bos, it.hv);
      walk.v0[k] = v_slice_at<D>(p.v_heads, it.bos, it.hv, it.vb);
    }
    if (it.nchunks == 0 && p.ht_mode == CULA_HT_FINAL) {
      const long long s0 = walk_state_at<D>(p, it);
      for (int i = lane; i < D * CULA_BLOCK_V; i += 32) {
        const long long at = s0 + (long long)(i / CULA_BLOCK_V) * D + i % CULA_BLOCK_V;
        p.ht[at] = p.h0 ? p.h0[at] : 0.f;
      }
    }
  }
  if (threadIdx.x == 0) walk.count = count;
  __syncthreads();
}

// The first item with chunks from the table's j-th on (count: none).
__device__ __forceinline__ int walk_skip(const WalkTable& walk, int j) {
  while (j < walk.count && walk.items[j].nchunks == 0) ++j;
  return j;
}

// The chunks of the CTA's items, all told.
__device__ __forceinline__ int walk_chunks(const WalkTable& walk) {
  int n = 0;
  for (int j = 0; j < walk.count; ++j) n += walk.items[j].nchunks;
  return n;
}

// A place in a walking CTA's chunks: chunk c of the table's j-th item (j = count: past the end).
struct WalkPos {
  int j, c;
};
__device__ __forceinline__ WalkPos walk_first(const WalkTable& walk) { return {walk_skip(walk, 0), 0}; }
__device__ __forceinline__ WalkPos walk_next(const WalkTable& walk, WalkPos x) {
  if (++x.c < walk.items[x.j].nchunks) return x;
  return {walk_skip(walk, x.j + 1), 0};
}
