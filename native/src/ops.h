// Host launchers of the simple_gla kernels. Arguments arrive already validated by the Python
// layer (packages/cula/src/cula/_checks.py); these functions only choose a kernel and launch it.
#pragma once

#include <cstdint>
#include <string>

namespace cula {

enum class DType : int { bf16 = 0, f16 = 1 };

struct SeqArgs {
  std::uintptr_t cu_seqlens = 0;  // device pointer or 0
  bool cu_seqlens_int64 = false;
  int num_seqs = 0;
  long long seq_len = 0;
  long long total_tokens = 0;  // rows of q/k/v: B*T, or T with cu_seqlens
};

struct TensorArgs {
  std::uintptr_t q = 0, k = 0, v = 0, o = 0, g_gamma = 0, h0 = 0, ht = 0;
  int heads = 0, head_dim = 0;
  DType dtype = DType::bf16;
  float scale = 1.f;
};

// variant: "sm90a" or "generic"
void chunk_simple_gla(const TensorArgs& t, const SeqArgs& s, const std::string& variant, std::uintptr_t stream,
                      int device);

void recurrent_simple_gla(const TensorArgs& t, const SeqArgs& s, std::uintptr_t state_indices,
                          bool state_indices_int64, long long num_slots, std::uintptr_t stream, int device);

}  // namespace cula
