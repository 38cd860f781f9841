// Host launchers of the simple_gla kernels. Arguments arrive already validated by the Python
// layer (packages/cula/src/cula/_checks.py); these functions only choose a kernel and launch it.
#pragma once

#include <cstdint>
#include <string>

#include "launch.h"

namespace cula {

struct TensorArgs {
  std::uintptr_t q = 0, k = 0, v = 0, o = 0, g_gamma = 0, h0 = 0, ht = 0;
  int heads = 0, head_dim = 0;
  DType dtype = DType::bf16;
  float scale = 1.f;
  std::uintptr_t g = 0;  // chunk_simple_gla only: a per-token log decay [tokens, H] in place of g_gamma
  int g_dtype = 0;       // CULA_F32 / CULA_BF16 / CULA_F16
};

// How the chunked prefill splits each sequence: {parts, tokens per part}; {1, 0} for no split.
// Fixed-length batches whose grid would leave SMs idle are cut into pieces of whole chunks (at
// least 4 each), up to one CTA per SM: both variants' CTAs fill an SM's shared memory (H200, B=1
// H=8 T=2048 with 8 pieces: 0.072 -> 0.051 ms sm_90a, measured before the kernel was
// warp-specialised). CULA_SPLIT_PARTS=N asks for N pieces (tests, benchmarks).
struct Split {
  int parts = 1;
  long long part_len = 0;
};
//
// variant: the device's kernel variant, "sm90a" or "generic" (cula._loader.check_device); both
// functions run the generic kernels instead of sm90a ones when CULA_FORCE_GENERIC=1. (The split
// is the same for both variants today; the argument stays so that it can differ again.)
Split chunk_split(bool varlen, int num_seqs, long long seq_len, int heads, int head_dim, const std::string& variant,
                  int device);

// part_states: with split.parts > 1, a float32 scratch buffer of
// num_seqs * (parts-1) * heads * head_dim^2 elements. With a per-token gate (t.g) the sequences
// are never split (split must be {1, 0}).
void chunk_simple_gla(const TensorArgs& t, const SeqArgs& s, const Split& split, std::uintptr_t part_states,
                      const std::string& variant, std::uintptr_t stream, int device);

// state_pitch: floats from one state of h0 and ht (a pool slot) to the next; 0: contiguous
// (heads * head_dim^2). The in-place decode passes the pool as both.
void recurrent_simple_gla(const TensorArgs& t, const SeqArgs& s, std::uintptr_t state_indices,
                          bool state_indices_int64, long long num_slots, std::uintptr_t stream, int device,
                          long long state_pitch = 0);

}  // namespace cula
