#include "gated_delta_rule_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include "params.h"
#include "runtime.h"
#include "simple_gla_ops.h"

namespace cula {

namespace {

// A state array's pitch (GdnArgs::h0_pitch, ht_pitch): as given, or the contiguous one.
long long pitch_of(const GdnArgs& a, long long given) {
  return given_or(given, static_cast<long long>(a.v_heads) * a.head_dim * a.head_dim);
}

CulaGdnParams params_of(const GdnArgs& a, const SeqArgs& s) {
  CulaGdnParams p{};
  p.q = reinterpret_cast<const void*>(a.q);
  p.k = reinterpret_cast<const void*>(a.k);
  p.v = reinterpret_cast<const void*>(a.v);
  p.o = reinterpret_cast<void*>(a.o);
  p.g = reinterpret_cast<const void*>(a.g.ptr);
  p.beta = reinterpret_cast<const void*>(a.beta.ptr);
  p.a_log = reinterpret_cast<const void*>(a.a_log.ptr);
  p.dt_bias = reinterpret_cast<const void*>(a.dt_bias.ptr);
  p.g_dtype = a.g.dtype;
  p.beta_dtype = a.beta.dtype;
  p.a_log_dtype = a.a_log.dtype;
  p.dt_bias_dtype = a.dt_bias.dtype;
  p.gate_mode = a.gate_mode;
  p.lower_bound = a.lower_bound;
  p.h0 = reinterpret_cast<const float*>(a.h0);
  p.ht = reinterpret_cast<float*>(a.ht);
  p.ht_mode = a.ht_mode;
  p.state_indices = reinterpret_cast<const void*>(a.state_indices);
  p.state_indices_int64 = a.state_indices_int64 ? 1 : 0;
  p.indices_stride = a.indices_stride;
  p.num_accepted = reinterpret_cast<const void*>(a.num_accepted);
  p.num_accepted_int64 = a.num_accepted_int64 ? 1 : 0;
  p.num_slots = a.num_slots;
  p.q_stride = given_or(a.q_stride, static_cast<long long>(a.heads) * a.head_dim);
  p.k_stride = given_or(a.k_stride, static_cast<long long>(a.heads) * a.head_dim);
  p.v_stride = given_or(a.v_stride, static_cast<long long>(a.v_heads) * a.head_dim);
  p.h0_pitch = pitch_of(a, a.h0_pitch);
  p.ht_pitch = pitch_of(a, a.ht_pitch);
  p.cache = reinterpret_cast<float*>(a.cache);
  p.cache_indices = reinterpret_cast<const void*>(a.cache_indices);
  p.cache_indices_int64 = a.cache_indices_int64 ? 1 : 0;
  p.cache_steps = a.cache_steps;
  p.cache_slots = a.cache_slots;
  p.parents = reinterpret_cast<const void*>(a.parents);
  p.parents_int64 = a.parents_int64 ? 1 : 0;
  p.parents_stride = a.parents_stride;
  p.seqs = seqs_of(s);
  p.total_tokens = s.total_tokens;
  p.heads = a.heads;
  p.v_heads = a.v_heads;
  p.scale = a.scale;
  p.l2norm = a.l2norm ? 1 : 0;
  p.beta_sigmoid = a.beta_sigmoid ? 1 : 0;
  p.beta_scale = a.beta_scale;
  return p;
}

}  // namespace

void recurrent_gated(const GdnArgs& a, const SeqArgs& s, std::uintptr_t stream, int device) {
  if (s.num_seqs == 0 || a.v_heads == 0) return;
  if (a.state_v_first && !a.delta) throw std::invalid_argument("cula: simple_gla takes [N, H, K, V] states only");
  const bool verify = a.cache != 0 || a.parents != 0;  // (the _verify kernels: recurrence.cuh)
  if (verify && !a.delta) throw std::invalid_argument("cula: simple_gla has no speculative verify");
  CulaGdnParams p = params_of(a, s);
  const char* family = a.per_key ? "cula_kda_recurrent_"
                       : a.delta ? "cula_gdn_recurrent_"
                                 : "cula_gated_recurrent_";
  // At K = 64, sequences of one token at most (a decode step) take the _one kernels: 8 CTAs an SM
  // where the loop kernels fit 5 (recurrence.cuh).
  const bool one = a.head_dim == 64 && !verify && longest_tokens(s) == 1;
  const std::string name = std::string(family) + dtype_name(a.dtype) + "_d" + std::to_string(a.head_dim) +
                           (a.state_v_first ? "_vfirst" : "") + (verify ? "_verify" : "") + (one ? "_one" : "");
  DeviceGuard guard(device);
  void* args[] = {&p};
  launch(name, device, dim3(a.head_dim / CULA_GDN_BLOCK_V, a.v_heads, s.num_seqs), dim3(CULA_GDN_THREADS), 0,
         reinterpret_cast<cudaStream_t>(stream), args);
}

namespace {

// The one-launch kernel's CTAs (or walked items) for one sequence: a (value head, value slice) each.
long long sequence_ctas(int v_heads, int head_dim) {
  return static_cast<long long>(v_heads) * (head_dim / CULA_BLOCK_V);
}

// The two-launch workspace (CulaKdaChunk; byte offsets): four 16-bit [tokens, HV, D] planes W, Qg,
// Kl, U0 one after another (the state kernel reads them as one view), Aqk [tokens, HV, C] 16-bit,
// then float32 exp(G) rows, [chunks + sequences + 1, HV, D] at most.
struct TwoLaunchLayout {
  long long plane, aqk, egl, bytes;
};
TwoLaunchLayout two_launch_layout(long long total_tokens, long long num_seqs, int v_heads, int head_dim) {
  const long long rows = total_tokens * v_heads;
  TwoLaunchLayout l;
  l.plane = rows * head_dim * 2;
  l.aqk = 4 * l.plane;
  l.egl = l.aqk + rows * CULA_CHUNK * 2;
  l.bytes = l.egl + (total_tokens / CULA_CHUNK + num_seqs + 1) * v_heads * head_dim * 4;
  return l;
}

// Whether the gated delta rule's prefill runs in two launches. CULA_GDN_CHUNK_LAUNCHES=1 or 2 forces
// one way (tests, benchmarks). Otherwise two where they were measured the faster, both ways on the
// same inputs (notes/gated-delta-rule.md: sessions 11, 19 and 21). The one-launch kernel walks each
// (sequence, value head, 64 value columns) on a CTA of its own, one per SM; the two-launch prep
// spreads each chunk and value head over all the SMs, and its state kernel walks the chunks faster.
// So two launches win when the one-launch grid of G CTAs in W waves on S SMs leaves SMs idle (one
// long prompt, few value heads per GPU), and only for sequences of 8 chunks or more on average: a
// short call pays the second launch and the workspace for nothing. Session 21 measured both ways
// (H200, 132 SMs, B = 1, T = 16384 up to G = 64 and 8192 above, l2norm and states; session 20's
// one-launch kernel, 3.6 us a chunk on sm_90a at D = 128) and put the boundary at G / (W S) =
//   D = 128: about 0.39 on sm_90a (one launch 1.06x slower at 0.36, 1.28x faster at 0.48) and 0.45
//            for the generic kernels (1.22x slower at 0.36, 1.05x faster at 0.48): 5 G < 2 W S and
//            9 G < 4 W S;
//   D = 64:  about 0.22 for both (sm_90a: 1.22x slower at 0.18, 1.10x faster at 0.24; generic:
//            1.19x slower at 0.18, 1.03x faster at 0.24): 9 G < 2 W S.
// (Session 19's kernel, 4.3 us a chunk, had them at 0.45 / 0.75 and 0.3 / 0.4.)
bool gdn_two_launches(long long total_tokens, long long num_seqs, int v_heads, int head_dim, const char* variant,
                      int device) {
  if (const char* forced = std::getenv("CULA_GDN_CHUNK_LAUNCHES")) {
    if (std::strcmp(forced, "1") == 0) return false;
    if (std::strcmp(forced, "2") == 0) return true;
  }
  if (total_tokens < 8LL * CULA_CHUNK * num_seqs) return false;
  const long long sms = multiprocessor_count(device), ctas = num_seqs * sequence_ctas(v_heads, head_dim);
  const long long waves = (ctas + sms - 1) / sms;
  const long long ws = waves * sms;
  if (head_dim == 64) return 9 * ctas < 2 * ws;
  return use_sm90a(variant) ? 5 * ctas < 2 * ws : 9 * ctas < 4 * ws;
}

// One long sequence split into segments (chunk_split, common/split.cuh): `segments` (1: not split),
// each after the first of `later` tokens (whole chunks), the first of the rest. A fixed-length call
// of one sequence whose one-launch grid of G CTAs (value heads x value slices) fills at most half the
// SMs: each later segment takes 2 G CTAs beside the first's G. As many segments as fit one wave, of
// equal length, at least 16 chunks each; where only one more fits (G > S / 3), the first takes two
// thirds of the chunks (at least 96), and the later one's identity run follows its run from zero
// (chunk_split). Session 37 measured it against the unsplit call (H200, bf16, l2norm, states; ms, sm_90a):
//   H = 16 HV = 32 (G = 64; one launch unsplit), T = 6144 0.326 -> 0.290, 8192 0.431 -> 0.365,
//     16384 0.851 -> 0.667, 32768 1.679 -> 1.266 (generic 2.17 -> 1.77); at D = 64 (G = 32, two
//     segments) 1.466 -> 0.821;
//   H = 4 HV = 8 (G = 16; two launches unsplit), T = 4096 0.112 -> 0.112 (four segments of 16 chunks),
//     6144 0.166 -> 0.144, 8192 0.216 -> 0.172, 16384 0.416 -> 0.287, 32768 0.811 -> 0.524 (generic
//     1.18 -> 0.68).
// Not where CULA_GDN_CHUNK_LAUNCHES forces the launches. CULA_GDN_SPLIT=n >= 2 splits any such call
// into n segments of chunks / n chunks, the first taking the rest; 0 or 1 never (tests; read on every
// call). one_wave: the three runs' CTAs fit one wave side by side. busy: SMs that other CTAs of the
// call take meanwhile (long_one's), not counted as free.
struct SplitPlan {
  int segments = 1;
  long long later = 0;
  bool one_wave = false;
};
SplitPlan gdn_split_plan(bool per_key, bool delta, const SeqArgs& s, int v_heads, int head_dim, int device,
                         long long busy = 0) {
  SplitPlan plan;
  if (per_key || !delta || s.cu_seqlens != 0 || s.num_seqs != 1) return plan;
  const long long chunks = (s.seq_len + CULA_CHUNK - 1) / CULA_CHUNK;
  const long long ctas = sequence_ctas(v_heads, head_dim), sms = multiprocessor_count(device) - busy;
  long long segments, later;
  if (const char* forced = std::getenv("CULA_GDN_SPLIT")) {
    segments = std::atoll(forced);
    if (segments < 2) return plan;
    later = chunks / segments;
  } else {
    const char* launches = std::getenv("CULA_GDN_CHUNK_LAUNCHES");  // (a forced launch count: not split)
    if (launches != nullptr && (std::strcmp(launches, "1") == 0 || std::strcmp(launches, "2") == 0)) return plan;
    if (2 * ctas > sms) return plan;
    segments = 1 + (sms - ctas) / (2 * ctas);
    if (segments >= 2) {
      segments = std::min(segments, chunks / 16);
      later = segments >= 2 ? chunks / segments : 0;
    } else {
      segments = 2, later = chunks / 3 >= 32 ? chunks / 3 : 0;
    }
  }
  if (later < 1) return plan;
  plan.segments = static_cast<int>(segments), plan.later = later * CULA_CHUNK;
  plan.one_wave = (2 * segments - 1) * ctas <= sms;
  return plan;
}

// One long sequence among short ones: a varlen call of the gated delta rule whose cu_seqlens the host
// read (SeqArgs::longest_at), where the longest sequence has at least 96 chunks and twice the tokens
// of any other and, as a fixed-length call of its own (`seq`), splits (gdn_split_plan) on the SMs
// that the one-launch CTAs of the others leave free into segments no shorter than any other
// sequence. It then runs so (chunk_long_one), the others beside it: what engines pass when one long
// prompt shares a prefill batch (vLLM's chunked prefill). plan.segments 1: not so. Session 42
// measured it (H200, bench-style GPU ms of the varlen call with device cu_seqlens, split / unsplit):
// H = 4 HV = 8 [16384, 512 x 3] 0.38 / 0.88, [32768, 1000, 500, 200] 0.69-0.70 / 1.74-1.80,
// [8192, 300, 70] 0.226 / 0.274; H = 2 HV = 4 [8192, 500 x 3] 0.18-0.20 / 0.22; H = 8 HV = 16
// [8192, 1000, 200] 0.37-0.39 / 0.48. Its bounds come from two that lost to the unsplit call's two
// launches: [4096, 100] 0.167 / 0.155, and [300, 6000, 2000] 0.240 / 0.220, the 2000 tokens' one-launch
// run beside segments of about 2000 tokens (a first form that also read the lengths before sizing
// the workspace, which cost such calls up to 40 us more).
struct LongOne {
  SplitPlan plan;
  SeqArgs seq;
};
LongOne long_one(bool per_key, bool delta, const SeqArgs& s, int v_heads, int head_dim, int device) {
  LongOne l;
  if (per_key || !delta || s.cu_seqlens == 0 || s.longest_at < 0 || s.num_seqs < 2 ||
      s.longest < 96LL * CULA_CHUNK || 2 * s.second > s.longest)
    return l;
  l.seq = SeqArgs{0, false, 1, s.longest, s.longest};
  l.plan = gdn_split_plan(per_key, delta, l.seq, v_heads, head_dim, device,
                          (s.num_seqs - 1) * sequence_ctas(v_heads, head_dim));
  if (s.second > l.plan.later) l.plan = SplitPlan{};
  return l;
}

// The split's workspace (byte offsets): the identity runs' zero values and outputs ([rows, HV, D]
// 16-bit each, rows the later segments' tokens), then three float32 [segments - 1, HV, D, D] arrays:
// Phi (the identity runs' h0 and final states), N (the runs from zero's final states) and the later
// segments' first states.
struct SplitLayout {
  long long zero_v, oi, phi, n, starts, bytes;
};
// (`rows`: the later segments' tokens, or more: a bound)
SplitLayout split_layout(int segments, long long rows, int v_heads, int head_dim) {
  const long long later = segments - 1, row = static_cast<long long>(v_heads) * head_dim;
  const long long states = later * row * head_dim * 4;
  SplitLayout l;
  l.zero_v = 0;
  l.oi = rows * row * 2;
  l.phi = 2 * l.oi;
  l.n = l.phi + states;
  l.starts = l.n + states;
  l.bytes = l.starts + states;
  return l;
}
SplitLayout split_layout(const SplitPlan& plan, int v_heads, int head_dim) {
  return split_layout(plan.segments, (plan.segments - 1) * plan.later, v_heads, head_dim);
}

// The most bytes of split_layout that long_one could ask for once the host reads the lengths of a
// varlen call's sequences (SeqArgs::longest_at -1 where it has not yet: the ops size the workspace
// first, then check the values right before the launch), 0 where none could split: the plan of one
// sequence holding every token (segments grow with the tokens; later segments hold fewer). None for
// values never read (-2: CUDA-graph capture, CULA_CHECK_VALUES=0).
long long long_one_bound(const SeqArgs& s, int v_heads, int head_dim, int device) {
  if (s.cu_seqlens == 0 || s.longest_at != -1) return 0;
  SeqArgs most = s;
  most.longest = s.total_tokens, most.longest_at = 0, most.longest_bos = 0, most.second = 0;
  const SplitPlan plan = long_one(false, true, most, v_heads, head_dim, device).plan;
  return plan.segments > 1 ? split_layout(plan.segments, s.total_tokens, v_heads, head_dim).bytes : 0;
}

// The path of a chunked prefill with key-first states, stated once: chunk_workspace sizes the
// workspace for it and chunk_gated_keys_first runs it. The gated delta rule splits one long sequence
// (split) or one long sequence among short ones (long_one) where their rules say so, else runs one
// launch or two (gdn_two_launches); KDA always two; simple_gla's per-token gate its own kernel.
enum class ChunkPath { split, long_one, two_launches, one_launch, simple_gla };
struct ChunkPlan {
  ChunkPath path = ChunkPath::one_launch;
  SplitPlan split;  // split, long_one: the segments
  SeqArgs seq;      // long_one: the long sequence as a call of its own
};
ChunkPlan chunk_plan(bool per_key, bool delta, const SeqArgs& s, int v_heads, int head_dim, const char* variant,
                     int device) {
  ChunkPlan c;
  if (!delta) {
    c.path = ChunkPath::simple_gla;
  } else if (per_key) {
    c.path = ChunkPath::two_launches;
  } else if ((c.split = gdn_split_plan(per_key, delta, s, v_heads, head_dim, device)).segments > 1) {
    c.path = ChunkPath::split;
  } else if (const LongOne l = long_one(per_key, delta, s, v_heads, head_dim, device); l.plan.segments > 1) {
    c.path = ChunkPath::long_one, c.split = l.plan, c.seq = l.seq;
  } else if (gdn_two_launches(s.total_tokens, s.num_seqs, v_heads, head_dim, variant, device)) {
    c.path = ChunkPath::two_launches;
  }
  return c;
}

}  // namespace

// Whether the delta rule's chunked prefill runs the token loop (recurrent_gated) instead, because no
// sequence is longer than a few tokens: the token loop's time grows by about 1 us a token on a wave of
// CTAs, the chunked kernels' hardly moves below a chunk. Session 32 measured both (H100, kernel time
// under torch.profiler, bf16, l2norm, states, fixed-length batches B x HV from 1 x 4 to 64 x 32, up to
// 31 waves; notes/gated-delta-rule.md), chunked / token loop in us:
//   KDA (two launches, D = 128): T = 8   15.9 / 10.9 (1 x 4), 47.2 / 34.5 (4 x 64), 372 / 217 (64 x 32);
//                                T = 12  16.0 / 15.0,          47.7 / 46.5,          371 / 294;
//                                T = 14  16.1 / 17.0,          48.4 / 52.6,          375 / 346;
//   the gated delta rule (one launch, D = 128 and 64): T = 1 7.7 / 2.5 (1 x 4), 175 / 94 (64 x 32);
//                                T = 8   7.7 / 7.8,            175 / 174 (D = 64: 67 / 74).
// So KDA up to 12 tokens (which also saves a launch and the workspace: host time) and the gated delta
// rule up to 6 (the longest sequence as the host knows it: longest_tokens).
// CULA_CHUNK_TOKEN_LOOP=0 / 1 forces it off / on (read on every call, as CULA_GDN_CHUNK_LAUNCHES).
// A pool's final states to [N, ..] (st.pool_final) always take the chunked kernels.
bool chunk_as_token_loop(bool per_key, const SeqArgs& s, const ChunkStates& st) {
  if (st.pool_final) return false;  // (the token loop would write the final states to the pool's slots)
  if (const char* forced = std::getenv("CULA_CHUNK_TOKEN_LOOP")) {
    if (std::strcmp(forced, "0") == 0) return false;
    if (std::strcmp(forced, "1") == 0) return true;
  }
  return longest_tokens(s) <= (per_key ? 12 : 6);
}

namespace {

// The parts of chunk_gated's workspace: the products of the chunks between the two launches (none
// for the gated delta rule's one launch), then, with value-first states or a pool, the key-first copy
// of the states that the chunked kernels take, both h0 and the final states: every chunked kernel
// reads a state slice of h0 into registers and writes the same slice of ht from the same threads,
// after it (common/chunk_gated.cuh, chunk_kda.cuh, walk.cuh), so one copy serves as both (bytes).
struct ChunkWorkspace {
  long long products = 0, states = 0;
};
ChunkWorkspace chunk_workspace(bool per_key, bool delta, const SeqArgs& s, int v_heads, int head_dim,
                               const ChunkStates& st, const char* variant, int device) {
  ChunkWorkspace w;
  if (!delta || chunk_as_token_loop(per_key, s, st)) return w;
  const ChunkPlan plan = chunk_plan(per_key, delta, s, v_heads, head_dim, variant, device);
  switch (plan.path) {
    case ChunkPath::split:
    case ChunkPath::long_one:
      w.products = split_layout(plan.split, v_heads, head_dim).bytes;
      break;
    case ChunkPath::two_launches:
      w.products = two_launch_layout(s.total_tokens, s.num_seqs, v_heads, head_dim).bytes;
      [[fallthrough]];
    case ChunkPath::one_launch:
      // (room for long_one's split of lengths not read yet)
      if (!per_key) w.products = std::max(w.products, long_one_bound(s, v_heads, head_dim, device));
      break;
    case ChunkPath::simple_gla:
      break;
  }
  if (st.v_first || st.pooled) w.states = static_cast<long long>(s.num_seqs) * v_heads * head_dim * head_dim * 4;
  return w;
}

}  // namespace

ChunkStates chunk_states_of(const GdnArgs& a) {
  ChunkStates st;
  st.v_first = a.state_v_first;
  st.pooled = a.state_indices != 0;
  st.pool_final = st.pooled && a.ht_mode == CULA_HT_FINAL;
  return st;
}

long long chunk_workspace_bytes(bool per_key, bool delta, const SeqArgs& s, int v_heads, int head_dim,
                                const ChunkStates& states, const char* variant, int device) {
  const ChunkWorkspace w = chunk_workspace(per_key, delta, s, v_heads, head_dim, states, variant, device);
  return w.products + w.states;
}

namespace {

// Whether the gated delta rule's prep kernel forms W and U0 through the inverse of I + A
// (cula_gdn_chunk_prep_inv_*: common/chunk_kda.cuh, kda_prep_inverse) rather than by the solve of
// [W | U0]: CULA_GDN_PREP=inverse, an experiment kept for the prep's next form (as accurate, 2-6% slower
// on the H100: notes/gated-delta-rule.md, session 17). Read on every call, as CULA_GDN_CHUNK_LAUNCHES.
bool gdn_prep_inverse() {
  const char* prep = std::getenv("CULA_GDN_PREP");
  return prep != nullptr && std::strcmp(prep, "inverse") == 0;
}

// Whether the one-launch kernel's CTAs walk several items (the _walk kernels): with more items than
// multiprocessors and sequences of at most 8 chunks on average. A CTA an item pays the pipeline's
// fill and drain, about two chunks, for each item; a walking CTA pays them once, and its items are
// balanced longest first, but a chunk of a long item costs it more (about 10% with one item a CTA,
// H=4 HV=8 8 x 2048, most of it in instruction fetch: notes/gated-delta-rule.md, session 52).
// Session 52 (H200, cu_seqlens_cpu given, 16384 tokens in n equal sequences, H=16 HV=32 D=128 with
// states, walked / a CTA an item, ms): sm90a n = 8 0.457 / 0.415, 16 0.459 / 0.435, 32 0.463 /
// 0.487, 64 0.455 / 0.581, 256 0.572 / 1.185; generic 0.645 / 0.598, 0.645 / 0.613, 0.649 / 0.628,
// 0.632 / 0.719, 0.706 / 1.346. (Session 30, H100, the three-warpgroup kernels: 16 of 1024 480 ->
// 470 us walked, 8 of 2048 450 -> 458.) CULA_GDN_WALK=0 / 1 forces it (read on every call).
bool gdn_chunk_walk(long long total_tokens, long long num_seqs, long long items, int device) {
  if (const char* forced = std::getenv("CULA_GDN_WALK")) {
    if (std::strcmp(forced, "0") == 0) return false;
    if (std::strcmp(forced, "1") == 0) return true;
  }
  return items > multiprocessor_count(device) && total_tokens <= 8LL * CULA_CHUNK * num_seqs;
}

// The prep kernel's pieces: CTA (x, hv, n) takes chunks x, x + pieces, .. of sequence n (the
// chunks of a sequence are independent there), one CTA per SM at a time. A fixed-length batch of
// `chunks` chunks a sequence takes the pieces with the least waves x chunks a CTA (at B=1
// T=16384 H=64 on 132 SMs: 2 pieces, one wave of 128 chunks, where about four CTAs per SM made 9
// pieces, 4.4 waves of 29 chunks); cu_seqlens (lengths unknown here): about four CTAs per SM when
// sequences and heads alone are fewer, no more than the chunks of the longest possible sequence.
static int prep_pieces(long long items, const SeqArgs& s, long long sms) {
  if (s.cu_seqlens != 0 || items <= 0) {
    const long long longest = std::max(1LL, (s.total_tokens + CULA_CHUNK - 1) / CULA_CHUNK);
    return static_cast<int>(std::max(1LL, std::min((4 * sms + items - 1) / std::max(1LL, items), longest)));
  }
  const long long chunks = std::max(1LL, (s.seq_len + CULA_CHUNK - 1) / CULA_CHUNK);
  const long long most = std::min(chunks, 8 * sms / items + 1);  // (about eight waves at most)
  long long best = 1, cost = -1;
  const auto consider = [&](long long x) {
    const long long c = (x * items + sms - 1) / sms * ((chunks + x - 1) / x);
    if (cost < 0 || c < cost) best = x, cost = c;
  };
  // The least cost is at the most pieces that fit some number of waves, or at `most`: 10 tries
  // where one a piece took up to a thousand (host time).
  for (long long waves = 1; waves <= 9; ++waves) consider(std::max(1LL, std::min(most, waves * sms / items)));
  consider(most);
  return static_cast<int>(best);
}

// The chunked prefill in two launches (common/chunk_kda.cuh): the prep kernel of the gate (KDA's
// per-key gate, or the gated delta rule's scalar one) into the workspace (laid out as CulaKdaChunk,
// sized by chunk_workspace_bytes), then the state kernel.
void chunk_two_launches(const GdnArgs& a, const SeqArgs& s, std::uintptr_t stream, int device) {
  CulaGdnParams p = params_of(a, s);
  const TwoLaunchLayout l = two_launch_layout(s.total_tokens, s.num_seqs, a.v_heads, a.head_dim);
  char* ws = reinterpret_cast<char*>(a.workspace);
  // (the four planes: one tensor map's)
  p.kda.w = ws, p.kda.qg = ws + l.plane, p.kda.kl = ws + 2 * l.plane, p.kda.u0 = ws + 3 * l.plane;
  p.kda.aqk = ws + l.aqk;
  p.kda.egl = reinterpret_cast<float*>(ws + l.egl);
  p.kda.pieces = prep_pieces(static_cast<long long>(a.v_heads) * s.num_seqs, s, multiprocessor_count(device));
  const std::string suffix = std::string(dtype_name(a.dtype)) + "_d" + std::to_string(a.head_dim);
  DeviceGuard guard(device);
  const auto st = reinterpret_cast<cudaStream_t>(stream);
  const char* prep = a.per_key             ? "cula_kda_chunk_prep_"
                     : gdn_prep_inverse() ? "cula_gdn_chunk_prep_inv_"
                                          : "cula_gdn_chunk_prep_";
  // Both kernels take the tensor maps: the prep loads q, k, v (and g) through three (four) and stores
  // W and U0 of whole chunks through the workspace's; the state kernel reads the four 16-bit planes
  // W, Qg, Kl, U0 as one [4 tokens, HV D] view (consecutive in the workspace), Aqk as [tokens, HV C],
  // and stores o through another.
  CulaKdaLaunchParams sp{};
  sp.p = p;
  const unsigned long long cols = static_cast<unsigned long long>(a.v_heads) * a.head_dim;
  const unsigned long long tokens = std::max(1LL, s.total_tokens);  // (a map has rows; no chunk reads them)
  encode_tensor_map_2d(&sp.planes, dtype_code(a.dtype), p.kda.w, cols, 4 * tokens, cols * 2, 64, CULA_CHUNK);
  const unsigned long long aqk_cols = static_cast<unsigned long long>(a.v_heads) * CULA_CHUNK;
  encode_tensor_map_2d(&sp.aqk, dtype_code(a.dtype), p.kda.aqk, aqk_cols, tokens, aqk_cols * 2, 64, CULA_CHUNK);
  encode_tensor_map_2d(&sp.o, dtype_code(a.dtype), p.o, cols, tokens, cols * 2, CULA_BLOCK_V, CULA_CHUNK);
  const unsigned long long qk_cols = static_cast<unsigned long long>(a.heads) * a.head_dim;
  encode_tensor_map_2d(&sp.q, dtype_code(a.dtype), p.q, qk_cols, tokens, qk_cols * 2, 64, CULA_CHUNK);
  encode_tensor_map_2d(&sp.k, dtype_code(a.dtype), p.k, qk_cols, tokens, qk_cols * 2, 64, CULA_CHUNK);
  encode_tensor_map_2d(&sp.v, dtype_code(a.dtype), p.v, cols, tokens, cols * 2, 64, CULA_CHUNK);
  if (a.per_key && p.g) {
    const int g_bytes = a.g.dtype == CULA_F32 ? 4 : 2;
    encode_tensor_map_2d(&sp.g, a.g.dtype, p.g, cols, tokens, cols * g_bytes, 128 / g_bytes, CULA_CHUNK);
  }
  void* args[] = {&sp};
  launch(prep + suffix, device, dim3(p.kda.pieces, a.v_heads, s.num_seqs), dim3(CULA_KDA_PREP_THREADS),
         CULA_KDA_PREP_SMEM_BYTES(a.head_dim), st, args);
  // (early: its CTAs start as the prep's last ones leave, and wait there for the workspace)
  launch("cula_kda_chunk_state_" + suffix + (use_sm90a(a.variant) ? "_sm90a" : ""), device,
         dim3(a.head_dim / CULA_BLOCK_V, a.v_heads, s.num_seqs), dim3(CULA_GATED_CHUNK_THREADS),
         CULA_KDA_STATE_SMEM_BYTES(a.head_dim), st, args, true);
}

// One pass of cula_state_stage (CulaStateStage: the fields that say which way).
void stage_states(const CulaStateStage& p, std::uintptr_t stream, int device) {
  CulaStateStage q = p;
  void* args[] = {&q};
  const int blocks = (p.dim / 64) * (p.dim / 64);
  launch("cula_state_stage", device, dim3(blocks, static_cast<unsigned>(std::min<long long>(p.count, 65535))),
         dim3(256), 0, reinterpret_cast<cudaStream_t>(stream), args);
}

// The gated delta rule's one-launch kernel (common/chunk_gated.cuh).
void chunk_one_launch(const GdnArgs& a, const SeqArgs& s, cudaStream_t stream, int device) {
  CulaGdnParams p = params_of(a, s);
  // A CTA a (sequence, value head, value slice) item; or, for many items of few chunks
  // (gdn_chunk_walk), one a multiprocessor that walks several: the _walk kernels
  // (common/chunk_gated.cuh; the shared memory fits one CTA a multiprocessor), in whole waves
  // where one would take more than CULA_WALK_ITEMS items each: the CTAs of a part wave start when
  // the first wave ends, each with as many items. Session 51 (H200, 256 sequences of 64 tokens at
  // H=16 HV=32, 16384 items): 171 CTAs 0.98 ms, two waves of 132 0.68 (generic 1.27 -> 0.90).
  const long long items = s.num_seqs * sequence_ctas(a.v_heads, a.head_dim), sms = multiprocessor_count(device);
  const bool walk = gdn_chunk_walk(s.total_tokens, s.num_seqs, items, device);
  const dim3 grid = walk ? dim3(static_cast<unsigned>(
                               std::min(items, sms * ((items + sms * CULA_WALK_ITEMS - 1) / (sms * CULA_WALK_ITEMS)))))
                         : dim3(a.head_dim / CULA_BLOCK_V, a.v_heads, s.num_seqs);
  const std::string name = std::string("cula_gdn_chunk_") + dtype_name(a.dtype) + "_d" + std::to_string(a.head_dim) +
                           (walk ? "_walk" : "") + (use_sm90a(a.variant) ? "_sm90a" : "");
  void* args[] = {&p};
  launch(name, device, grid, dim3(CULA_GDN_CHUNK_THREADS),
         CULA_GATED_CHUNK_SMEM_BYTES(a.head_dim), stream, args);
}

// `x` moved on by `rows` token rows of `row_bytes` (0 stays 0).
std::uintptr_t rows_on(std::uintptr_t x, long long rows, long long row_bytes) {
  return x == 0 ? 0 : x + static_cast<std::uintptr_t>(rows * row_bytes);
}

// `a` from token row `first` on: q, k, v, o, g and beta moved on by `first` rows of their own.
GdnArgs rows_from(const GdnArgs& a, long long first) {
  GdnArgs r = a;
  const long long qk_row = static_cast<long long>(a.heads) * a.head_dim * 2;
  const long long row = static_cast<long long>(a.v_heads) * a.head_dim * 2;
  const auto scalar_row = [&](const ScalarArg& x) { return a.v_heads * (x.dtype == CULA_F32 ? 4LL : 2LL); };
  r.q = rows_on(a.q, first, qk_row), r.k = rows_on(a.k, first, qk_row);
  r.v = rows_on(a.v, first, row), r.o = rows_on(a.o, first, row);
  r.g.ptr = rows_on(a.g.ptr, first, scalar_row(a.g)), r.beta.ptr = rows_on(a.beta.ptr, first, scalar_row(a.beta));
  return r;
}

// One long sequence in segments (gdn_split_plan, common/split.cuh), key-first states, the workspace
// laid out as split_layout says. On three streams side by side (SideStreams): the first
// segment from h0; the later ones, as one fixed-length batch, from zero with their values; and the
// same from the identity with zero values. `beside` (long_one's other sequences), where given,
// launches on the caller's stream meanwhile. Then, on the caller's stream, in order, each later
// segment's first state and the final state (split_step), and the later segments' outputs
// (split_fix).
void chunk_split(const GdnArgs& a, const SeqArgs& s, const SplitPlan& plan, cudaStream_t stream, int device,
                 const std::function<void()>& beside = nullptr) {
  const long long later = plan.segments - 1, rows = later * plan.later, first = s.seq_len - rows;
  const long long row = static_cast<long long>(a.v_heads) * a.head_dim, state = row * a.head_dim;
  const SplitLayout l = split_layout(plan, a.v_heads, a.head_dim);
  char* ws = reinterpret_cast<char*>(a.workspace);
  char* zero_v = ws + l.zero_v;
  char* oi = ws + l.oi;
  float* phi = reinterpret_cast<float*>(ws + l.phi);
  float* n = reinterpret_cast<float*>(ws + l.n);
  float* starts = reinterpret_cast<float*>(ws + l.starts);
  // The identity runs' zero values and first states, before the fork: beside the segments' kernels
  // (a CTA an SM each) a memset would wait for free SMs.
  check_cuda(cudaMemsetAsync(zero_v, 0, rows * row * 2, stream), "cudaMemsetAsync");
  CulaSplit p{};
  p.out = phi, p.count = later * a.v_heads, p.dim = a.head_dim, p.v_heads = a.v_heads;
  void* args[] = {&p};
  launch("cula_split_identity", device,
         dim3(static_cast<unsigned>(std::min<long long>(4096, (p.count * a.head_dim * a.head_dim + 255) / 256))),
         dim3(256), 0, stream, args);
  SideStreams side(device, stream);
  GdnArgs head = a;
  head.workspace = 0, head.ht = reinterpret_cast<std::uintptr_t>(starts), head.ht_mode = CULA_HT_FINAL;
  head.ht_pitch = 0;
  SeqArgs s0 = s;
  s0.seq_len = s0.total_tokens = first;
  chunk_one_launch(head, s0, side[0], device);
  GdnArgs zero = rows_from(a, first);
  zero.workspace = 0, zero.h0 = 0, zero.ht = reinterpret_cast<std::uintptr_t>(n), zero.ht_mode = CULA_HT_FINAL;
  zero.h0_pitch = zero.ht_pitch = 0;
  SeqArgs sl = s;
  sl.num_seqs = static_cast<int>(later), sl.seq_len = plan.later, sl.total_tokens = rows;
  chunk_one_launch(zero, sl, side[1], device);
  GdnArgs ident = zero;
  ident.v = reinterpret_cast<std::uintptr_t>(zero_v), ident.o = reinterpret_cast<std::uintptr_t>(oi);
  ident.h0 = ident.ht = reinterpret_cast<std::uintptr_t>(phi);
  // Where all the CTAs fit one wave, beside the others; else after the later segments' run from zero,
  // on its stream, so that its CTAs never take an SM from the first segment's (the kernels reach the
  // GPU's scheduler in no set order).
  chunk_one_launch(ident, sl, plan.one_wave ? side[2] : side[1], device);
  if (beside) beside();
  side.join();
  const dim3 blocks(static_cast<unsigned>((a.head_dim / 32) * (a.head_dim / 32)), static_cast<unsigned>(a.v_heads));
  for (long long i = 0; i < later; ++i) {  // (the last only for the final state)
    p.phi = phi + i * state, p.s = starts + i * state, p.n = n + i * state;
    p.out = i + 1 < later ? starts + (i + 1) * state : a.ht_mode == CULA_HT_FINAL ? reinterpret_cast<float*>(a.ht) : nullptr;
    if (p.out != nullptr) launch("cula_split_step", device, blocks, dim3(256), 0, stream, args);
  }
  p.oi = oi, p.o = reinterpret_cast<void*>(zero.o), p.starts = starts, p.rows_per_seg = plan.later;
  // A CTA a group of 128-row blocks of one segment, about two CTAs an SM in all (each rounds its S once).
  const long long row_blocks = (plan.later + 127) / 128, ctas = 2LL * multiprocessor_count(device);
  p.group_rows = 128 * std::max(1LL, (later * a.v_heads * row_blocks + ctas - 1) / ctas);
  p.groups = static_cast<int>((plan.later + p.group_rows - 1) / p.group_rows);
  launch(std::string("cula_split_fix_") + dtype_name(a.dtype) + "_d" + std::to_string(a.head_dim), device,
         dim3(static_cast<unsigned>(later * p.groups), static_cast<unsigned>(a.v_heads)), dim3(256), 0, stream, args);
}

// long_one's call: the long sequence split (chunk_split, its workspace a's), the sequences before it
// and those after it each a varlen run of the one-launch kernel beside it (their cu_seqlens a view of
// the call's; h0 and ht [N, ..] key-first, moved on to each run's first sequence).
void chunk_long_one(const GdnArgs& a, const SeqArgs& s, const ChunkPlan& plan, cudaStream_t stream, int device) {
  const long long state = static_cast<long long>(a.v_heads) * a.head_dim * a.head_dim * 4;
  const auto states_from = [&](std::uintptr_t x, long long n) { return x == 0 ? x : x + n * state; };
  GdnArgs one = rows_from(a, s.longest_bos);
  one.h0 = states_from(a.h0, s.longest_at), one.ht = states_from(a.ht, s.longest_at);
  const auto others = [&] {
    GdnArgs r = a;
    r.workspace = 0;
    SeqArgs before = s;
    before.num_seqs = s.longest_at;
    if (before.num_seqs > 0) chunk_one_launch(r, before, stream, device);
    SeqArgs after = before;
    after.num_seqs = s.num_seqs - s.longest_at - 1;
    after.cu_seqlens = s.cu_seqlens + static_cast<std::uintptr_t>(s.longest_at + 1) * (s.cu_seqlens_int64 ? 8 : 4);
    r.h0 = states_from(a.h0, s.longest_at + 1), r.ht = states_from(a.ht, s.longest_at + 1);
    if (after.num_seqs > 0) chunk_one_launch(r, after, stream, device);
  };
  chunk_split(one, plan.seq, plan.split, stream, device, others);
}

// chunk_gated with key-first states, on chunk_plan's path.
void chunk_gated_keys_first(const GdnArgs& a, const SeqArgs& s, std::uintptr_t stream, int device) {
  // (the path by its rules, not by the workspace's presence: it may be long_one_bound's, sized before
  // the lengths were read)
  const ChunkPlan plan = chunk_plan(a.per_key, a.delta, s, a.v_heads, a.head_dim, a.variant, device);
  const auto st = reinterpret_cast<cudaStream_t>(stream);
  switch (plan.path) {
    case ChunkPath::split:
    case ChunkPath::long_one: {
      if (a.workspace == 0) throw std::invalid_argument("cula: a split prefill needs its workspace");
      DeviceGuard guard(device);
      if (plan.path == ChunkPath::split)
        chunk_split(a, s, plan.split, st, device);
      else
        chunk_long_one(a, s, plan, st, device);
      return;
    }
    case ChunkPath::two_launches:
      if (a.workspace == 0)
        throw std::invalid_argument(a.per_key ? "cula: chunk_kda needs its workspace"
                                              : "cula: the two-launch prefill needs its workspace");
      chunk_two_launches(a, s, stream, device);
      return;
    case ChunkPath::simple_gla: {  // simple_gla's chunked prefill with the per-token gate (H == HV there)
      TensorArgs t;
      t.q = a.q, t.k = a.k, t.v = a.v, t.o = a.o, t.h0 = a.h0;
      t.ht = a.ht_mode == CULA_HT_FINAL ? a.ht : 0;
      t.g = a.g.ptr, t.g_dtype = a.g.dtype;
      t.heads = a.v_heads, t.head_dim = a.head_dim, t.dtype = a.dtype, t.scale = a.scale;
      chunk_simple_gla(t, s, Split{}, 0, a.variant, stream, device);
      return;
    }
    case ChunkPath::one_launch: {
      DeviceGuard guard(device);
      chunk_one_launch(a, s, st, device);
      return;
    }
  }
}

// The chunked prefill with value-first states or a pool read at slots: the chunked kernels take
// key-first [N, HV, D, D] ones, so h0 is copied (transposed, gathered from the slots) into the
// workspace's copy first and the final states back from it after them (transposed, scattered to the
// slots); two passes over the states, small beside the prefill's reads of q, k and v. With a pool the
// second pass also zeroes the o of padding sequences (slot -1), as the token loop leaves it.
void chunk_gated_staged(const GdnArgs& a, const SeqArgs& s, const ChunkStates& st, std::uintptr_t stream,
                        int device) {
  const ChunkWorkspace w = chunk_workspace(a.per_key, a.delta, s, a.v_heads, a.head_dim, st, a.variant, device);
  if (a.workspace == 0 || w.states == 0)
    throw std::invalid_argument("cula: value-first states and state pools need the workspace");
  float* copy = reinterpret_cast<float*>(a.workspace + w.products);
  DeviceGuard guard(device);
  GdnArgs k = a;
  k.state_v_first = false, k.state_indices = 0, k.num_slots = 0, k.h0_pitch = k.ht_pitch = 0;
  k.workspace = w.products != 0 ? a.workspace : 0;
  k.h0 = a.h0 != 0 ? reinterpret_cast<std::uintptr_t>(copy) : 0;
  k.ht = reinterpret_cast<std::uintptr_t>(copy), k.ht_mode = a.ht_mode == CULA_HT_NONE ? CULA_HT_NONE : CULA_HT_FINAL;
  CulaStateStage p{};
  p.indices = reinterpret_cast<const void*>(a.state_indices);
  p.indices_int64 = a.state_indices_int64 ? 1 : 0;
  p.num_slots = a.num_slots;
  p.transpose = a.state_v_first ? 1 : 0;
  p.dim = a.head_dim, p.v_heads = a.v_heads;
  p.count = static_cast<long long>(s.num_seqs) * a.v_heads;
  p.seqs = seqs_of(s), p.total_tokens = s.total_tokens;
  if (a.h0 != 0) {
    CulaStateStage in = p;
    in.src = reinterpret_cast<const float*>(a.h0), in.dst = copy, in.src_at_slots = st.pooled ? 1 : 0;
    in.pool_pitch = pitch_of(a, a.h0_pitch);
    stage_states(in, stream, device);
  }
  chunk_gated_keys_first(k, s, stream, device);
  if (a.ht_mode != CULA_HT_NONE || st.pooled) {
    CulaStateStage out = p;
    out.src = copy, out.dst = a.ht_mode != CULA_HT_NONE ? reinterpret_cast<float*>(a.ht) : nullptr;
    out.dst_at_slots = a.ht_mode == CULA_HT_SLOT ? 1 : 0;
    out.pool_pitch = pitch_of(a, a.ht_pitch);
    out.o = st.pooled ? reinterpret_cast<void*>(a.o) : nullptr;
    stage_states(out, stream, device);
  }
}

}  // namespace

void chunk_gated(const GdnArgs& a, const SeqArgs& s, std::uintptr_t stream, int device) {
  if (s.num_seqs == 0 || a.v_heads == 0) return;
  if (a.cache || a.parents) throw std::invalid_argument("cula: a speculative verify runs the token loop only");
  if (a.q_stride || a.k_stride || a.v_stride)
    throw std::invalid_argument("cula: the chunked prefill takes contiguous q, k and v");
  const ChunkStates st = chunk_states_of(a);
  if (a.delta && chunk_as_token_loop(a.per_key, s, st)) {
    recurrent_gated(a, s, stream, device);  // (value-first states and pools too)
    return;
  }
  if (st.v_first || st.pooled) {
    if (!a.delta) throw std::invalid_argument("cula: chunk_simple_gla takes [N, H, K, V] states and no pool");
    chunk_gated_staged(a, s, st, stream, device);
    return;
  }
  if (a.ht_mode != CULA_HT_NONE && a.ht_mode != CULA_HT_FINAL)
    throw std::invalid_argument("cula: the chunked prefill writes final states to [N, ..] or to the pool it read");
  chunk_gated_keys_first(a, s, stream, device);
}

}  // namespace cula
