// Where the tokens of a sequence lie (CulaSeqs: fixed-length batches or cu_seqlens) and where a state
// slice of it lies in h0 / ht, and entries of the index arrays (state pool slots, accepted-token
// counts) that come as int32 or int64.
#pragma once

#include "params.h"

__device__ __forceinline__ long long load_index(const void* p, int int64, long long i) {
  return int64 ? ((const long long*)p)[i] : (long long)((const int*)p)[i];
}

__device__ __forceinline__ void seq_bounds(const CulaSeqs& s, int n, long long& bos, long long& len) {
  if (s.cu_seqlens) {
    long long a, b;
    if (s.cu_seqlens_int64) {  // (both loads in one branch: load_index twice made every kernel longer)
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

// The tokens of chunk c (CULA_CHUNK a chunk) of a sequence of len tokens: CULA_CHUNK, or fewer in the last.
__device__ __forceinline__ int chunk_rows(long long len, long long c) {
  const long long left = len - c * CULA_CHUNK;
  return left < CULA_CHUNK ? (int)left : CULA_CHUNK;
}

// seq_bounds with the values clamped to [0, total) rows: cu_seqlens are range-checked on the host
// unless the caller skipped it (CUDA-graph capture), and whatever they hold, no row outside is touched.
__device__ __forceinline__ void clamped_seq_bounds(const CulaSeqs& s, int n, long long total, long long& bos,
                                                   long long& len) {
  seq_bounds(s, n, bos, len);
  if (bos < 0) bos = 0;
  if (bos > total) bos = total;
  if (len < 0) len = 0;
  if (len > total - bos) len = total - bos;
}

// Longest first: the sequence that the CTAs of grid index z take when a kernel's CTA walks one
// whole sequence (the two-launch prep of a varlen call, one piece a sequence), so that the long
// sequences start first and the short ones fill in behind them. The GPU starts CTAs in the order
// of their index: this is list scheduling, longest first (on the bench's 20 random lengths the prep
// takes 3.5% less time than in order). Lengths clamped as clamped_seq_bounds, ties in order. Each
// warp works it out for itself from the lengths in its lanes (all 32 lanes call it), so up to 32
// sequences; more of them, and fixed-length batches, keep z.
__device__ __forceinline__ int longest_first(const CulaSeqs& s, int z, long long total) {
  const int count = s.num_seqs;
  if (s.cu_seqlens == nullptr || count > 32) return z;
  const int lane = threadIdx.x & 31;
  long long bos, len = -1;
  if (lane < count) clamped_seq_bounds(s, lane, total, bos, len);
  int rank = 0;  // (the sequences before the lane's in that order)
  for (int j = 0; j < count; ++j) {
    const long long other = __shfl_sync(~0u, len, j);
    rank += other > len || (other == len && j < lane);
  }
  const unsigned at = __ballot_sync(~0u, lane < count && rank == z);
  return at ? __ffs(at) - 1 : z;
}

// The offset of the state slice of sequence n, value head hv of HV, value slice vb (CULA_BLOCK_V
// columns) in h0 / ht ([N, HV, D, D]; element (key, column) at key D + column).
template <int D>
__device__ __forceinline__ long long state_slice_at(int HV, int n, int hv, int vb) {
  return ((long long)n * HV + hv) * D * D + vb * CULA_BLOCK_V;
}

// The offsets of token tok's row in q and k ([tokens, H, D]: the query / key head of value head hv
// of HV, H dividing HV) and in v and o ([tokens, HV, D]: value head hv, value slice vb).
template <int D>
__device__ __forceinline__ long long qk_row_at(int H, int HV, long long tok, int hv) {
  return tok * ((long long)H * D) + (long long)(hv / (HV / H)) * D;
}
template <int D>
__device__ __forceinline__ long long v_slice_at(int HV, long long tok, int hv, int vb) {
  return tok * ((long long)HV * D) + ((long long)hv * D + vb * CULA_BLOCK_V);
}
