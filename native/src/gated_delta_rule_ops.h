// Host launcher of the gated delta rule's recurrence (and of KDA, the same with a per-key gate, and
// of simple_gla with a per-token gate, which runs the same recurrence without the delta rule).
// Arguments arrive validated by the Python layer (cula/_gated.py); this only fills CulaGdnParams
// and launches.
#pragma once

#include <cstdint>

#include "launch.h"

namespace cula {

// A scalar input read as it comes: its pointer and CULA_F32 / CULA_BF16 / CULA_F16.
struct ScalarArg {
  std::uintptr_t ptr = 0;
  int dtype = 0;
};

struct GdnArgs {
  std::uintptr_t q = 0, k = 0, v = 0, o = 0;
  ScalarArg g, beta, a_log, dt_bias;
  std::uintptr_t h0 = 0, ht = 0;
  int ht_mode = 0;  // CULA_HT_*
  bool state_v_first = false;  // h0 / ht [.., V, K] (FLA's state_v_first), not [.., K, V]: the token loop's
                               // _vfirst kernels; the chunked kernels on key-first copies in the workspace
  std::uintptr_t state_indices = 0;
  bool state_indices_int64 = false;
  long long indices_stride = 1;
  std::uintptr_t num_accepted = 0;
  bool num_accepted_int64 = false;
  long long num_slots = 0;
  long long q_stride = 0, k_stride = 0, v_stride = 0;  // elements from one token's row to the next; 0:
                                                      // contiguous. The token loop only.
  long long h0_pitch = 0, ht_pitch = 0;  // floats from one state of h0 / ht (a pool slot) to the next; 0:
                                         // contiguous (v_heads * head_dim^2). Contiguous but for pools.
  // Speculative verify (the token loop only; CulaGdnParams' fields of the same names): the states
  // after each token also to cache [cache_slots, cache_steps, v_heads, ..] at cache_indices [N];
  // parents [N, parents_stride] (an EAGLE tree): each token from its parent token's state.
  std::uintptr_t cache = 0, cache_indices = 0;
  bool cache_indices_int64 = false;
  long long cache_steps = 0, cache_slots = 0;
  std::uintptr_t parents = 0;
  bool parents_int64 = false;
  long long parents_stride = 0;
  int heads = 0, v_heads = 0, head_dim = 0;
  DType dtype = DType::bf16;
  float scale = 1.f;
  bool l2norm = false, beta_sigmoid = false;
  float beta_scale = 1.f;
  int gate_mode = 0;         // CULA_GATE_*
  float lower_bound = 0.f;   // CULA_GATE_LOWER_BOUND's
  bool delta = true;         // false: simple_gla with a per-token gate
  bool per_key = false;      // a per-key gate g [..., HV, K] (KDA; with the delta rule)
  std::uintptr_t workspace = 0;  // the chunked prefill's: chunk_workspace_bytes() of device memory
  const char* variant = "generic";  // the device's kernel variant (chunk_gated without delta: "sm90a" or "generic")
};

// The token-by-token recurrence (any ht_mode), and the chunked prefill (ht_mode CULA_HT_NONE or
// CULA_HT_FINAL, or with a state pool read at the slots state_indices [N] also CULA_HT_SLOT); without
// the delta rule the chunked prefill is simple_gla's (chunk_simple_gla's kernels with the per-token
// gate, in a.variant); with a per-key gate (KDA) it is KDA's chunked prefill, two launches through
// a.workspace (the gated delta rule's too when given one). With the delta rule, sequences of a few
// tokens run the token loop (chunk_workspace_bytes says when).
void recurrent_gated(const GdnArgs& a, const SeqArgs& s, std::uintptr_t stream, int device);
void chunk_gated(const GdnArgs& a, const SeqArgs& s, std::uintptr_t stream, int device);

// How a chunk_gated call holds its states: value-first ([.., V, K]); in a pool read at slots
// (GdnArgs::state_indices, SGLang's initial_state_indices), with pool_final its final states to
// [N, ..] (CULA_HT_FINAL, which the token loop cannot write from a pool: such calls always run the
// chunked kernels). Both forms run the chunked kernels on a key-first copy in the workspace.
struct ChunkStates {
  bool v_first = false, pooled = false, pool_final = false;
};
ChunkStates chunk_states_of(const GdnArgs& a);

// The workspace chunk_gated needs (bytes, a multiple of 16), 0 for none: the delta rule's prefill in
// two launches, KDA's always, the gated delta rule's where the one-launch kernel is not the faster;
// for value-first states or a pool also the key-first copy of the states; none where sequences of a
// few tokens run the token loop instead (both ops); for one long sequence split into segments run
// side by side, the segments' joins (common/split.cuh). With key-first states and no pool
// chunk_gated runs the gated delta rule in two launches, or split, exactly when it is given a
// workspace.
// variant: the device's ("sm90a" or "generic"), as GdnArgs::variant.
long long chunk_workspace_bytes(bool per_key, bool delta, const SeqArgs& s, int v_heads, int head_dim,
                                const ChunkStates& states, const char* variant, int device);

}  // namespace cula
