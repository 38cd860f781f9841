// Where the tokens of a sequence lie (CulaSeqs: fixed-length batches or cu_seqlens), and entries of
// the index arrays (state pool slots, accepted-token counts) that come as int32 or int64.
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
