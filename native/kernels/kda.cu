// Kimi Delta Attention (KDA: Kimi Linear; FLA's kda): the gated delta rule with a per-key gate.
// Compiled by NVRTC for each real target of the fat binary; no CUDA headers.
//
// Per sequence and value head, with S a K x V fp32 state and for each token t (CulaGdnParams), g_t
// a vector [K] of log decays:
//     S' = diag(exp(g_t)) S_{t-1},   S_t = S' + beta_t k_t (v_t - S'^T k_t)^T,   o_t = scale S_t^T q_t
//
// Kernels (extern "C", looked up by name from the host):
//   cula_kda_recurrent_<dtype>_d<D>   token-by-token recurrence (fused_recurrent_kda and the serving
//                                     decode with state pools and speculative tokens):
//                                     common/recurrence.cuh; every architecture runs it (_vfirst:
//                                     value-first states; _verify: a speculative verify's state
//                                     cache and trees; _one, K = 64: one token a sequence)
//   cula_kda_chunk_prep_<dtype>_d<D>, chunked prefill (chunk_kda without state pools), two launches:
//   cula_kda_chunk_state_<dtype>_d<D> common/chunk_kda.cuh, warp-level mma.sync, every target (the
//                                     state kernel also runs the gated delta rule's prefill);
//   cula_kda_chunk_state_<dtype>_d<D>_sm90a  the state kernel by warpgroup wgmma (sm_90a only)
#include "common/chunk_kda.cuh"
#include "common/recurrence.cuh"

#define CULA_KDA_KERNELS(TAG, T, D)                                                           \
  CULA_DELTA_RECURRENCE_KERNELS(cula_kda_recurrent_##TAG##_d##D, T, D, true)                  \
  CULA_CHUNK_PREP_KERNEL(cula_kda_chunk_prep_##TAG##_d##D, T, D, true, false)                 \
  CULA_CHUNK_STATE_KERNEL(cula_kda_chunk_state_##TAG##_d##D, T, D)

CULA_KDA_KERNELS(bf16, bf16_tag, 64)
CULA_DELTA_ONE_TOKEN_KERNELS(cula_kda_recurrent_bf16_d64, bf16_tag, true)
CULA_KDA_KERNELS(bf16, bf16_tag, 128)
CULA_KDA_KERNELS(f16, f16_tag, 64)
CULA_DELTA_ONE_TOKEN_KERNELS(cula_kda_recurrent_f16_d64, f16_tag, true)
CULA_KDA_KERNELS(f16, f16_tag, 128)
