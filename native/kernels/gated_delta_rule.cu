// The gated delta rule (Gated DeltaNet: Qwen3-Next, Qwen3.5; FLA's gated_delta_rule). Compiled by
// NVRTC for each real target of the fat binary; no CUDA headers.
//
// Per sequence and value head, with S a K x V fp32 state and for each token t (CulaGdnParams):
//     S' = exp(g_t) S_{t-1},   S_t = S' + beta_t k_t (v_t - S'^T k_t)^T,   o_t = scale S_t^T q_t
//
// Kernels (extern "C", looked up by name from the host):
//   cula_gdn_recurrent_<dtype>_d<D>   token-by-token recurrence (fused_recurrent, chunk for now, and
//                                     the serving decode with state pools and speculative tokens);
//                                     every architecture runs it (no arch-specific instructions);
//                                     _vfirst: with value-first states (state_v_first); _verify:
//                                     with a speculative verify's state cache and trees; _one,
//                                     K = 64 only: one token a sequence (a decode step)
//   cula_gdn_chunk_<dtype>_d<D>       chunked prefill (chunk_gated_delta_rule; pools through the stage) in
//                                     one launch: common/chunk_gated.cuh, warp-level mma.sync, every
//                                     target (and _walk: CTAs that walk several sequences)
//   cula_gdn_chunk_prep_<dtype>_d<D>  the same in two launches: this prep kernel (the scalar gate's,
//                                     common/chunk_kda.cuh), then KDA's state kernel (its sm_90a
//                                     variant where the GPU has it)
//   cula_gdn_chunk_prep_inv_<dtype>_d<D>  the prep kernel with W and U0 through the inverse of
//                                     I + A (CULA_GDN_PREP=inverse; every target)
//   cula_state_stage                  the chunked kernels' key-first copy of value-first states and
//                                     of pools read at slots, made before them and copied back after
//                                     (common/state_stage.cuh; KDA's chunked prefill too)
//   cula_split_identity, cula_split_step, cula_split_fix_<dtype>_d<D>
//                                     a long prefill split into segments run side by side, joined
//                                     (common/split.cuh)
#include "common/chunk_gated.cuh"
#include "common/chunk_kda.cuh"
#include "common/recurrence.cuh"
#include "common/split.cuh"
#include "common/state_stage.cuh"

#define CULA_GDN_KERNELS(TAG, T, D)                                                            \
  CULA_DELTA_RECURRENCE_KERNELS(cula_gdn_recurrent_##TAG##_d##D, T, D, false)                 \
  CULA_GATED_CHUNK_KERNEL(cula_gdn_chunk_##TAG##_d##D, T, D)                                  \
  CULA_CHUNK_PREP_KERNEL(cula_gdn_chunk_prep_##TAG##_d##D, T, D, false, false)                \
  CULA_CHUNK_PREP_KERNEL(cula_gdn_chunk_prep_inv_##TAG##_d##D, T, D, false, true)           \
  CULA_SPLIT_FIX_KERNEL(cula_split_fix_##TAG##_d##D, T, D)

CULA_STATE_STAGE_KERNEL(cula_state_stage)
CULA_SPLIT_KERNELS()

CULA_GDN_KERNELS(bf16, bf16_tag, 64)
CULA_DELTA_ONE_TOKEN_KERNELS(cula_gdn_recurrent_bf16_d64, bf16_tag, false)
CULA_GDN_KERNELS(bf16, bf16_tag, 128)
CULA_GDN_KERNELS(f16, f16_tag, 64)
CULA_DELTA_ONE_TOKEN_KERNELS(cula_gdn_recurrent_f16_d64, f16_tag, false)
CULA_GDN_KERNELS(f16, f16_tag, 128)
