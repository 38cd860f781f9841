// Kimi Delta Attention (KDA: Kimi Linear; FLA's kda): the gated delta rule with a per-key gate.
// Compiled by NVRTC for each real target of the fat binary; no CUDA headers.
//
// Per sequence and value head, with S a K x V fp32 state and for each token t (CulaGdnParams), g_t
// a vector [K] of log decays:
//     S' = diag(exp(g_t)) S_{t-1},   S_t = S' + beta_t k_t (v_t - S'^T k_t)^T,   o_t = scale S_t^T q_t
//
// Kernels (extern "C", looked up by name from the host):
//   cula_kda_recurrent_<dtype>_d<D>   token-by-token recurrence (fused_recurrent_kda, chunk_kda for
//                                     now, and the serving decode with state pools and speculative
//                                     tokens): common/recurrence.cuh; every architecture runs it
#include "common/recurrence.cuh"

CULA_GATED_RECURRENCE_KERNEL(cula_kda_recurrent_bf16_d64, bf16_tag, 64, true, true)
CULA_GATED_RECURRENCE_KERNEL(cula_kda_recurrent_bf16_d128, bf16_tag, 128, true, true)
CULA_GATED_RECURRENCE_KERNEL(cula_kda_recurrent_f16_d64, f16_tag, 64, true, true)
CULA_GATED_RECURRENCE_KERNEL(cula_kda_recurrent_f16_d128, f16_tag, 128, true, true)
