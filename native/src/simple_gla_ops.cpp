#include "simple_gla_ops.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "params.h"
#include "runtime.h"

namespace cula {
namespace {

// The fields both parameter blocks share.
template <typename Params>
void fill_common(Params& p, const TensorArgs& t, const SeqArgs& s) {
  p.q = reinterpret_cast<const void*>(t.q);
  p.k = reinterpret_cast<const void*>(t.k);
  p.v = reinterpret_cast<const void*>(t.v);
  p.o = reinterpret_cast<void*>(t.o);
  p.g_gamma = reinterpret_cast<const float*>(t.g_gamma);
  p.h0 = reinterpret_cast<const float*>(t.h0);
  p.ht = reinterpret_cast<float*>(t.ht);
  p.seqs = seqs_of(s);
  // (the rows the kernels clamp cu_seqlens to; fixed-length callers may leave it to num_seqs * seq_len)
  p.total_tokens = given_or(s.total_tokens, static_cast<long long>(s.num_seqs) * s.seq_len);
  if (s.cu_seqlens != 0 && s.total_tokens <= 0) throw std::invalid_argument("cula: a varlen launch needs total_tokens");
  p.heads = t.heads;
  p.scale = t.scale;
}

}  // namespace

Split chunk_split(bool varlen, int num_seqs, long long seq_len, int heads, int head_dim, const std::string& variant,
                  int device) {
  (void)variant;  // both variants fill an SM with one CTA (shared memory): the same split
  constexpr long long kMinChunks = 4;  // per piece: the states pass and the prologue must pay off
  Split split;
  if (varlen || num_seqs == 0 || heads == 0) return split;
  const long long chunks = (seq_len + CULA_CHUNK - 1) / CULA_CHUNK;
  long long parts = 1;
  if (const char* forced = std::getenv("CULA_SPLIT_PARTS")) {
    parts = std::max(1LL, std::min(std::atoll(forced), chunks));
  } else {
    const long long ctas = static_cast<long long>(head_dim / CULA_BLOCK_V) * heads * num_seqs;
    const long long slots = multiprocessor_count(device);
    while (ctas * parts * 2 <= slots && chunks >= parts * 2 * kMinChunks) parts *= 2;
  }
  if (parts <= 1) return split;
  const long long per = (chunks + parts - 1) / parts;  // chunks per piece; no piece left empty:
  split.parts = static_cast<int>((chunks + per - 1) / per);
  if (split.parts > 1) split.part_len = per * CULA_CHUNK;
  return split;
}

void chunk_simple_gla(const TensorArgs& t, const SeqArgs& s, const Split& split, std::uintptr_t part_states,
                      const std::string& variant, std::uintptr_t stream, int device) {
  CulaChunkParams p{};
  fill_common(p, t, s);
  if (s.num_seqs == 0 || t.heads == 0) return;
  if (t.g && split.parts != 1) throw std::logic_error("cula: a per-token gate takes no sequence split");
  p.g = reinterpret_cast<const void*>(t.g);
  p.g_dtype = t.g_dtype;
  p.parts = split.parts;
  p.part_len = split.part_len;
  p.part_states = reinterpret_cast<float*>(part_states);
  DeviceGuard guard(device);
  const bool sm90a = use_sm90a(variant);
  const std::string base = std::string("cula_chunk_") + dtype_name(t.dtype) + "_d" + std::to_string(t.head_dim) +
                           (sm90a ? "_sm90a" : "_generic") + (t.g ? "_gated" : "");
  // [tokens, H*D] views; boxes of 64 tokens x 64 columns (one head's half row, or a V slice).
  const unsigned long long cols = static_cast<unsigned long long>(t.heads) * t.head_dim;
  const int dt = dtype_code(t.dtype);
  encode_tensor_map_2d(&p.tma_q, dt, p.q, cols, s.total_tokens, cols * 2, 64, CULA_CHUNK);
  encode_tensor_map_2d(&p.tma_k, dt, p.k, cols, s.total_tokens, cols * 2, 64, CULA_CHUNK);
  encode_tensor_map_2d(&p.tma_v, dt, p.v, cols, s.total_tokens, cols * 2, CULA_BLOCK_V, CULA_CHUNK);
  // o leaves by whole chunks (sm90a) or by each warp's 16 rows (generic).
  encode_tensor_map_2d(&p.tma_o, dt, p.o, cols, s.total_tokens, cols * 2, CULA_BLOCK_V, sm90a ? CULA_CHUNK : 16);
  void* args[] = {&p};
  const dim3 block(sm90a ? CULA_SM90A_THREADS : CULA_GENERIC_THREADS);
  const unsigned smem = t.g ? CULA_CHUNK_GATED_SMEM_BYTES(t.head_dim) : CULA_CHUNK_SMEM_BYTES(t.head_dim);
  const cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const long long pairs = static_cast<long long>(t.head_dim / CULA_BLOCK_V) * t.heads * s.num_seqs;
  const int ctas = persistent_ctas(device);
  if (split.parts > 1)  // the pieces' own state contributions first
    launch(base + "_states", device, dim3(grid_for(pairs * (split.parts - 1), ctas)), block, smem, st, args);
  launch(base, device, dim3(grid_for(pairs * split.parts, ctas)), block, smem, st, args);
}

void recurrent_simple_gla(const TensorArgs& t, const SeqArgs& s, std::uintptr_t state_indices,
                          bool state_indices_int64, long long num_slots, std::uintptr_t stream, int device,
                          long long state_pitch) {
  CulaRecurrentParams p{};
  fill_common(p, t, s);
  p.state_indices = reinterpret_cast<const void*>(state_indices);
  p.state_indices_int64 = state_indices_int64 ? 1 : 0;
  p.num_slots = num_slots;
  p.h0_pitch = p.ht_pitch = given_or(state_pitch, static_cast<long long>(t.heads) * t.head_dim * t.head_dim);
  if (s.num_seqs == 0 || t.heads == 0) return;
  const std::string name = std::string("cula_recurrent_") + dtype_name(t.dtype) + "_d" + std::to_string(t.head_dim);
  DeviceGuard guard(device);
  void* args[] = {&p};
  launch(name, device, dim3(t.head_dim / CULA_REC_BLOCK_V, t.heads, s.num_seqs), dim3(CULA_THREADS), 0,
         reinterpret_cast<cudaStream_t>(stream), args);
}

}  // namespace cula
