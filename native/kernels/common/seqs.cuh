// Where the tokens of a sequence lie (CulaSeqs: fixed-length batches or cu_seqlens), for every family.
#pragma once

#include "params.h"

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
