// Kernel parameter blocks shared by the host code (g++) and the device code (NVRTC).
// Plain C types only: both compilers must give these structs the same layout.
#pragma once

#define CULA_CHUNK 64        // tokens per chunk in the chunked prefill
#define CULA_BLOCK_V 64      // value columns per CTA in the chunked prefill
#define CULA_REC_BLOCK_V 32  // value columns per CTA in the recurrent kernel
#define CULA_THREADS 128     // the recurrent kernel

#define CULA_SM90A_THREADS 384  // sm_90a prefill: output and state warpgroups, a producer warp, 3 decay warps
#define CULA_GENERIC_OUT_WGS 2  // generic prefill: output warpgroups (taking alternate chunks), a state
#define CULA_GENERIC_THREADS (128 * CULA_GENERIC_OUT_WGS + 256)  // warpgroup, a producer warp (+ 3 idle)
#define CULA_STAGES 4           // chunks in the prefill's ring (both variants)

// Dynamic shared memory of the chunked prefill for head dim D (must match TmaSmem in the kernels):
// a ring of CULA_STAGES chunks of q, k (D/64 boxes each) and value boxes, all dense 64-column TMA
// boxes in the 128-byte swizzle; two 16-bit state copies, two decayed copies of the value box
// (sm_90a only) and two o boxes; 1024-byte aligned (hence the slack); the mbarriers.
#define CULA_CHUNK_SMEM_BYTES(D)                                                                     \
  (1024 + CULA_STAGES * (4 * CULA_CHUNK * (D) + 2 * CULA_CHUNK * CULA_BLOCK_V) +                     \
   8 * CULA_CHUNK * CULA_BLOCK_V + 4 * (D) * CULA_BLOCK_V + 8 * (2 * CULA_STAGES + 9))

// Opaque TMA descriptor (CUtensorMap: 128 bytes, 64-byte aligned), encoded by the host.
struct alignas(64) CulaTensorMap {
  unsigned long long opaque[16];
};

// Sequences are either B fixed-length sequences of T tokens (cu_seqlens == 0) or
// N variable-length sequences packed along the token axis (cu_seqlens has N+1 entries).
struct CulaSeqs {
  const void* cu_seqlens;  // int32 or int64 [N+1], or null
  int cu_seqlens_int64;    // 1 when cu_seqlens holds int64
  int num_seqs;            // N (or B)
  long long seq_len;       // T when cu_seqlens is null
};

struct CulaChunkParams {
  CulaTensorMap tma_q;     // [tokens, H*D] views with 64 x 64 boxes
  CulaTensorMap tma_k;
  CulaTensorMap tma_v;
  CulaTensorMap tma_o;     // stores of whole chunks: boxes like tma_v (sm90a), of 16 rows (generic)
  const void* q;           // [tokens, H, D]
  const void* k;           // [tokens, H, D]
  const void* v;           // [tokens, H, D]
  void* o;                 // [tokens, H, D]
  const float* g_gamma;    // [H] log decay, or null for no decay
  const float* h0;         // [N, H, D, D] or null
  float* ht;               // [N, H, D, D] or null
  CulaSeqs seqs;
  int heads;
  float scale;
  // Sequence split (fixed-length batches whose grid would leave SMs idle): each sequence is cut
  // into `parts` pieces of part_len tokens (a multiple of CULA_CHUNK; the last may be shorter).
  // A first launch (the *_states kernels) writes the state each piece but the last contributes
  // from a zero start into part_states ([N, parts-1, H, D, D]); the second starts each piece from
  // h0 and the contributions of the pieces before it.
  float* part_states;
  int parts;               // 1: no split
  long long part_len;
};

// Token-by-token recurrence (fused_recurrent and serving decode). The state of sequence n
// is read from h0[h0_index(n)] and written to ht[ht_index(n)]; both may be the same pool
// (in-place decode). An index < 0 marks a padding slot: its output is zero and no state
// is read or written.
struct CulaRecurrentParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  const float* g_gamma;
  const float* h0;           // may be null: zero initial state
  float* ht;                 // may be null: final state not stored
  const void* state_indices; // [N] int32/int64 or null (identity)
  int state_indices_int64;
  long long num_slots;       // pool size when state_indices is given: indices >= num_slots act as padding
  CulaSeqs seqs;
  int heads;
  float scale;
};
