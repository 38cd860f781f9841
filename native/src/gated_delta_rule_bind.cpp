// Bindings of the gated recurrence launcher (the gated delta rule, KDA; simple_gla with a per-token gate).
#include <pybind11/pybind11.h>

#include <string>

#include "bindings.h"
#include "gated_delta_rule_ops.h"

namespace py = pybind11;

namespace cula {

void bind_gated_delta_rule(py::module_& m) {
  m.def(
      "gated",
      [](std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o, std::uintptr_t g, int g_dtype,
         std::uintptr_t beta, int beta_dtype, std::uintptr_t a_log, int a_log_dtype, std::uintptr_t dt_bias,
         int dt_bias_dtype, int gate_mode, float lower_bound, bool per_key, std::uintptr_t h0, std::uintptr_t ht,
         int ht_mode, bool state_v_first, std::uintptr_t state_indices,
         bool indices_int64, long long indices_stride, std::uintptr_t num_accepted, bool accepted_int64,
         long long num_slots, long long q_stride, long long k_stride, long long v_stride, long long h0_pitch,
         long long ht_pitch, std::uintptr_t cache,
         std::uintptr_t cache_indices, bool cache_indices_int64, long long cache_steps, long long cache_slots,
         std::uintptr_t parents, bool parents_int64, long long parents_stride, std::uintptr_t cu_seqlens, bool cu_int64,
         int num_seqs, long long seq_len,
         long long total_tokens, long long longest, int longest_at, long long longest_bos, long long second,
         int heads, int v_heads, int head_dim, DType dtype, float scale, bool l2norm, bool beta_sigmoid,
         float beta_scale, bool delta, bool chunked, std::uintptr_t workspace,
         const std::string& variant, std::uintptr_t stream, int device) {
        GdnArgs a;
        a.q = q, a.k = k, a.v = v, a.o = o;
        a.g = {g, g_dtype}, a.beta = {beta, beta_dtype}, a.a_log = {a_log, a_log_dtype};
        a.dt_bias = {dt_bias, dt_bias_dtype};
        a.gate_mode = gate_mode, a.lower_bound = lower_bound, a.per_key = per_key;
        a.h0 = h0, a.ht = ht, a.ht_mode = ht_mode, a.state_v_first = state_v_first;
        a.state_indices = state_indices, a.state_indices_int64 = indices_int64, a.indices_stride = indices_stride;
        a.num_accepted = num_accepted, a.num_accepted_int64 = accepted_int64, a.num_slots = num_slots;
        a.q_stride = q_stride, a.k_stride = k_stride, a.v_stride = v_stride;
        a.h0_pitch = h0_pitch, a.ht_pitch = ht_pitch;
        a.cache = cache, a.cache_indices = cache_indices, a.cache_indices_int64 = cache_indices_int64;
        a.cache_steps = cache_steps, a.cache_slots = cache_slots;
        a.parents = parents, a.parents_int64 = parents_int64, a.parents_stride = parents_stride;
        a.heads = heads, a.v_heads = v_heads, a.head_dim = head_dim, a.dtype = dtype, a.scale = scale;
        a.l2norm = l2norm, a.beta_sigmoid = beta_sigmoid, a.beta_scale = beta_scale, a.delta = delta;
        a.workspace = workspace, a.variant = variant.c_str();
        const SeqArgs seqs{cu_seqlens, cu_int64, num_seqs, seq_len, total_tokens, longest, longest_at, longest_bos,
                           second};
        (chunked ? chunk_gated : recurrent_gated)(a, seqs, stream, device);
      },
      "Gated recurrence launch on raw device pointers (validated by cula): the gated delta rule (per_key=True: "
      "KDA's per-key gate), or with delta=False simple_gla with a per-token gate; gate_mode: CULA_GATE_*; "
      "state_v_first: h0 / ht [.., V, K], not [.., K, V]; chunked=True: the chunked prefill kernel (a state "
      "pool only with [N] indices: ht_mode NONE, FINAL or SLOT) of the device's variant ('sm90a' or "
      "'generic'); the delta rule's takes a workspace of chunk_workspace(...) bytes (none: 0). longest: with "
      "cu_seqlens, the longest sequence's tokens where known (0: unknown), and then its index (the first of that "
      "length; -1 or -2: not read), its first row and the longest of the others' tokens. h0_pitch, ht_pitch: "
      "floats from one state (pool slot) of h0 / ht to the next, 0 for contiguous states. q_stride, k_stride, "
      "v_stride: elements from one token's row to the next (0: contiguous; the token loop only). cache "
      "(cache_indices, cache_steps, cache_slots) and parents (parents_stride): a speculative verify's per-token "
      "states and an EAGLE tree's parent tokens, for the token loop only (chunked=False); 0 for none.");
  m.def(
      "chunk_workspace",
      [](bool per_key, bool delta, long long total_tokens, long long num_seqs, long long seq_len, long long longest,
         int longest_at, int v_heads, int head_dim, const std::string& variant, int device, bool state_v_first,
         bool pooled, bool pool_final, long long second) {
        // (cu_seqlens: a marker where seq_len is 0; the sizes never read them)
        const SeqArgs seqs{seq_len == 0 ? 1u : 0u, false, static_cast<int>(num_seqs), seq_len, total_tokens, longest,
                           longest_at, 0, second};
        ChunkStates st;
        st.v_first = state_v_first, st.pooled = pooled, st.pool_final = pooled && pool_final;
        return chunk_workspace_bytes(per_key, delta, seqs, v_heads, head_dim, st, variant.c_str(), device);
      },
      py::arg("per_key"), py::arg("delta"), py::arg("total_tokens"), py::arg("num_seqs"), py::arg("seq_len"),
      py::arg("longest"), py::arg("longest_at"), py::arg("v_heads"), py::arg("head_dim"), py::arg("variant"),
      py::arg("device"), py::arg("state_v_first") = false, py::arg("pooled") = false, py::arg("pool_final") = false,
      py::arg("second") = 0,
      "Bytes of device memory the chunked prefill needs as its workspace (0: none), on a device of the variant "
      "('sm90a' or 'generic'); seq_len: the tokens of each sequence, 0 with cu_seqlens, and then longest the "
      "longest sequence's tokens where known (0: unknown), longest_at its index (-1: not read yet, the size then "
      "covering whatever the lengths turn out to be; -2: never read) and second the longest of the others' "
      "tokens; state_v_first: value-first states, pooled: a state pool read at slots (a key-first copy of the "
      "states in the workspace), pool_final: its final states to [N, ..] rather than to the pool.");
}

}  // namespace cula
