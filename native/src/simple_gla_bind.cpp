// Bindings of the simple_gla launchers (per-head decay: simple_gla, Lightning Attention).
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "simple_gla_ops.h"

namespace py = pybind11;

namespace cula {

void bind_simple_gla(py::module_& m) {
  m.def(
      "chunk_simple_gla",
      [](std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o, std::uintptr_t g_gamma,
         std::uintptr_t h0, std::uintptr_t ht, std::uintptr_t cu_seqlens, bool cu_int64, int num_seqs,
         long long seq_len, long long total_tokens, int heads, int head_dim, cula::DType dtype, float scale,
         int parts, long long part_len, std::uintptr_t part_states, const std::string& variant,
         std::uintptr_t stream, int device) {
        cula::chunk_simple_gla({q, k, v, o, g_gamma, h0, ht, heads, head_dim, dtype, scale},
                               {cu_seqlens, cu_int64, num_seqs, seq_len, total_tokens}, {parts, part_len},
                               part_states, variant, stream, device);
      },
      "Chunked prefill launch on raw device pointers (validated by cula); split as chunk_split says.");
  m.def(
      "chunk_split",
      [](bool varlen, int num_seqs, long long seq_len, int heads, int head_dim, const std::string& variant,
         int device) {
        const cula::Split s = cula::chunk_split(varlen, num_seqs, seq_len, heads, head_dim, variant, device);
        return py::make_tuple(s.parts, s.part_len);
      },
      "(parts, tokens per part) the chunked prefill splits each sequence into; (1, 0): no split.");
  m.def(
      "recurrent_simple_gla",
      [](std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o, std::uintptr_t g_gamma,
         std::uintptr_t h0, std::uintptr_t ht, std::uintptr_t state_indices, bool idx_int64,
         std::uintptr_t cu_seqlens, bool cu_int64, int num_seqs, long long seq_len, int heads, int head_dim,
         cula::DType dtype, float scale, std::uintptr_t stream, int device, long long num_slots,
         long long state_pitch, long long total_tokens) {
        cula::recurrent_simple_gla({q, k, v, o, g_gamma, h0, ht, heads, head_dim, dtype, scale},
                                   {cu_seqlens, cu_int64, num_seqs, seq_len, total_tokens}, state_indices, idx_int64,
                                   num_slots, stream, device, state_pitch);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("g_gamma"), py::arg("h0"), py::arg("ht"),
      py::arg("state_indices"), py::arg("idx_int64"), py::arg("cu_seqlens"), py::arg("cu_int64"),
      py::arg("num_seqs"), py::arg("seq_len"), py::arg("heads"), py::arg("head_dim"), py::arg("dtype"),
      py::arg("scale"), py::arg("stream"), py::arg("device"), py::arg("num_slots"), py::arg("state_pitch") = 0,
      py::arg("total_tokens") = 0,
      "Token-by-token recurrence launch on raw device pointers (validated by cula); state_pitch: floats from one "
      "state of h0 / ht (a pool slot) to the next, 0 for contiguous states; total_tokens: the rows of q, which "
      "cu_seqlens values are clamped to (needed with cu_seqlens; 0: num_seqs * seq_len).");
}

}  // namespace cula
