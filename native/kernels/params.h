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
// (sm_90a only) and two o boxes; 1024-byte aligned (hence the slack); the mbarriers. The *_gated
// kernels (per-token gate) have the ring's gates after that, and the generic kernel's output
// warpgroups' tables of CULA_GATE_COLS gate factors: with them the g_gamma kernels' static tables
// would not fit beside (D = 128: 232,336 of the 232,448 bytes a CTA may have, beside the 1,024 the
// system keeps; the static tables take 896 with alignment).
#define CULA_GATE_COLS 96
#define CULA_CHUNK_SMEM_BYTES(D)                                                                     \
  (1024 + CULA_STAGES * (4 * CULA_CHUNK * (D) + 2 * CULA_CHUNK * CULA_BLOCK_V) +                     \
   8 * CULA_CHUNK * CULA_BLOCK_V + 4 * (D) * CULA_BLOCK_V + 8 * (2 * CULA_STAGES + 10))
#define CULA_CHUNK_GATED_SMEM_BYTES(D) \
  (CULA_CHUNK_SMEM_BYTES(D) + 4 * CULA_STAGES * CULA_CHUNK + 4 * CULA_GENERIC_OUT_WGS * CULA_GATE_COLS)

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
  const void* g;           // the *_gated kernels: [tokens, H] per-token log decay (g_gamma unused, no split)
  int g_dtype;             // CULA_F32 / CULA_BF16 / CULA_F16
  const float* h0;         // [N, H, D, D] or null
  float* ht;               // [N, H, D, D] or null
  CulaSeqs seqs;
  long long total_tokens;  // rows of q (cu_seqlens values are clamped to it)
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
  long long h0_pitch, ht_pitch;  // floats from one state (pool slot) of h0 / ht to the next: H * K * V when
                                 // contiguous, more in a pool whose slots sit in larger pages (vLLM's)
  CulaSeqs seqs;
  long long total_tokens;  // rows of q (cu_seqlens values are clamped to it)
  int heads;
  float scale;
};

// ---- gated delta rule (GDN) ------------------------------------------------------------------
// Token-by-token recurrence (fused_recurrent, serving decode): a CTA of CULA_GDN_THREADS threads
// owns CULA_GDN_BLOCK_V value columns of one (sequence, value head) for all K rows.
#define CULA_GDN_THREADS 128
#define CULA_GDN_BLOCK_V 32

// The chunked gated kernel (common/chunk_gated.cuh): chain, system, output and loader warpgroups
// per (sequence, value head, value slice of CULA_BLOCK_V), CULA_CHUNK tokens per chunk; its shared
// memory (GatedChunkSmem<D> and 1 KiB for the alignment): q, k, v boxes three times, two state
// copies, two U, A and the diagonal inverses twice (a walking CTA's table of items in the second
// A), twelve per-token arrays (G, 1 / |k| and beta four times).
#define CULA_GATED_CHAIN_THREADS 128
#define CULA_GATED_CHUNK_THREADS 256  // (KDA's state kernel, common/chunk_kda.cuh: chain and output)
#define CULA_GDN_CHUNK_THREADS 512  // the gated delta rule's kernels: chain, system, output, loader
#define CULA_GDN_CHAIN_REGS 232     // their registers a thread (setmaxnreg), 128 x the sum <= 65536:
#define CULA_GDN_SYSTEM_REGS 120    // 232 + 120 + 128 + 32 in the one-item kernel
#define CULA_GDN_FED_OUTPUT_REGS 128
#define CULA_GDN_LOADER_REGS 32
// The walking kernel's, role r (chain, system, output, loader) of the sm_90a variant (WG) or the
// generic one: the loader's position walks the table (32 and 40 registers spill), and the wgmma
// output spills at 128 (NVRTC 13.0, D = 128).
#define CULA_GDN_WALK_REGS(WG, r) \
  ((r) == 0 ? ((WG) ? 216 : 224) : (r) == 1 ? 112 : (r) == 2 ? ((WG) ? 136 : 128) : 48)
#define CULA_WALK_ITEMS 96  // the most (sequence, value head, value slice) items a walking CTA takes
#define CULA_GATED_CHUNK_SMEM_BYTES(D)                                                                 \
  (1024 + 3 * (2 * CULA_CHUNK * (D) + CULA_CHUNK * CULA_BLOCK_V) * 2 + 2 * (D) * CULA_BLOCK_V * 2 +    \
   2 * CULA_CHUNK * CULA_BLOCK_V * 2 + 2 * (CULA_CHUNK * (CULA_CHUNK + 4) + CULA_CHUNK * 36) * 4 +   \
   12 * CULA_CHUNK * 4)

// KDA's chunked prefill (common/chunk_kda.cuh; the gated delta rule's too where it takes two
// launches), two launches: the prep kernel (CULA_KDA_PREP_THREADS:
// 16 warps at <= 128 registers, one CTA per SM; chunks are independent) writes each chunk's
// state-independent products into the workspace (CulaKdaChunk), the state kernel (a chain and an
// output warpgroup per sequence, value head and value slice, as the gated chunk kernel) walks the
// chunks. Shared memory (the structs KdaPrepSmem<D> / KdaStateSmem<D> and 1 KiB for the alignment):
// prep: q, k, v and the key tiles (2.5 boxes), G, A, the diagonal inverses, X of 2 D columns, four
// per-token arrays, the diagonal factors, the G scan's totals and first values; state: W and Kl
// twice, Qg and Aqk three times, two state copies, two U, two U0 slices, two exp(G_L), five
// mbarriers.
#define CULA_KDA_PREP_THREADS 512
#define CULA_KDA_PREP_SMEM_BYTES(D)                                                                        \
  (1024 + 5 * CULA_CHUNK * (D) * 2 + CULA_CHUNK * ((D) + 8) * 4 + CULA_CHUNK * (CULA_CHUNK + 4) * 4 +    \
   CULA_CHUNK * 36 * 4 + CULA_CHUNK * 2 * (D) * 4 + 4 * CULA_CHUNK * 4 + 3 * CULA_KDA_PREP_THREADS * 4 + \
   32 * (D) * 2 + 16)
#define CULA_KDA_STATE_SMEM_BYTES(D)                                                                       \
  (1024 + 2 * 2 * CULA_CHUNK * (D) * 2 + 3 * (CULA_CHUNK * (D) + CULA_CHUNK * CULA_CHUNK) * 2 +          \
   2 * (D) * CULA_BLOCK_V * 2 + 2 * 2 * CULA_CHUNK * CULA_BLOCK_V * 2 + 2 * (D) * 4 + 5 * 8)

// The workspace of the two-launch prefill (KDA's, the gated delta rule's), per token t and value head
// hv (16-bit as q unless noted),
// with G the chunk's cumulative log decay up to and including a token, G_L its value at the chunk's
// last token, |.| the L2 norm when asked (1 otherwise):
struct CulaKdaChunk {
  void* w;     // [tokens, HV, K]  W = (I + A)^-1 diag(beta) (k / |k| * exp(G)): U = U0 - W S
  void* u0;    // [tokens, HV, V]  U0 = (I + A)^-1 diag(beta) v (16-bit as q: FLA keeps u in v's dtype)
  void* qg;    // [tokens, HV, K]  scale q / |q| * exp(G)
  void* kl;    // [tokens, HV, K]  k / |k| * exp(G_L - G)
  void* aqk;   // [tokens, HV, CULA_CHUNK]  row i: scale (q_i / |q_i|) . (k_j / |k_j| * exp(G_i - G_j)), j <= i
  float* egl;  // [chunks, HV, K] float32: exp(G_L); chunk c of sequence n at bos / CULA_CHUNK + n + c
  int pieces;  // prep kernel: CTA x of (x, hv, n) takes chunks x, x + pieces, ...
};

// The chunked prefills' key-first copy of the states in their workspace (common/state_stage.cuh),
// for value-first states and for state pools read at slots: [N, HV, D, D] float32, matrix
// m = n * HV + hv. Matrix m of the copy is, in the caller's states, matrix slot * HV + hv of a pool
// (slot = indices[n]; one < 0 or >= num_slots marks a padding sequence), else matrix m; transposed
// with value-first states. Gather (src the caller's, dst the copy): a padding sequence's copy is zeros.
// Scatter (src the copy, dst the caller's or null): a padding sequence's state is left alone in a
// pool, zeros elsewhere, and its o rows are set to zero (o, 16-bit, when given).
struct CulaStateStage {
  const float* src;
  float* dst;
  const void* indices;  // [N] int32/int64, or null
  int indices_int64;
  long long num_slots;
  long long pool_pitch;            // floats from one pool slot to the next (HV * D * D when contiguous)
  int src_at_slots, dst_at_slots;  // src / dst is the pool (read / written at the slots)
  int transpose;
  int dim, v_heads;
  long long count;  // N * HV
  void* o;          // [tokens, HV, D] or null
  CulaSeqs seqs;
  long long total_tokens;
};

// A long prefill split into segments (common/split.cuh): the kernels that join the segments' runs.
// split_identity: out [count, D, D] = I. split_step: out = phi s + n, [v_heads, D, D] float32 each.
// split_fix: o += oi S for the later segments' rows (16-bit [rows, v_heads, D]; o from the second
// segment's first row), S = starts [row / rows_per_seg, v_heads, D, D]; a CTA a group of group_rows
// rows (groups a segment).
struct CulaSplit {
  const void* oi;
  void* o;
  const float* starts;
  const float* phi;
  const float* s;
  const float* n;
  float* out;
  long long rows_per_seg, group_rows;
  long long count;
  int groups;
  int v_heads, dim;
};

// Dtype codes of the scalar inputs (g, beta, A_log, dt_bias), read as they come.
#define CULA_F32 0
#define CULA_BF16 1
#define CULA_F16 2

// How the kernels compute the log decay from g (the in-kernel gate, CulaGdnParams::gate_mode), with
// x = g + dt_bias (dt_bias [HV], or [HV, K] for the per-key gate; 0 when not given):
#define CULA_GATE_RAW 0          // g is the log decay
#define CULA_GATE_SOFTPLUS 1     // -exp(A_log) * softplus(x)
#define CULA_GATE_LOWER_BOUND 2  // lower_bound * sigmoid(a x), a = exp(A_log), or 1 without A_log

// Where the recurrence writes states (ht):
#define CULA_HT_NONE 0       // nowhere
#define CULA_HT_FINAL 1      // the final state of sequence n to ht[n]
#define CULA_HT_SLOT 2       // the final state to the pool slot it was read from (in-place decode)
#define CULA_HT_SLOT_TOKEN 3 // the state after token t to ht[state_indices[n, t]] (speculative decode)
#define CULA_HT_TOKEN 4      // the state after token t to ht[bos + t] (one per token, packed like v)

// Per sequence n and value head hv, with S a K x V fp32 state, for each token t:
//   S' = exp(g_t) S,  S = S' + beta_t k_t (v_t - S'^T k_t)^T,  o_t = scale S^T q_t
// (without the delta rule, as simple_gla with a per-token gate runs it: S = S' + k_t v_t^T).
// With a per-key gate (KDA, Kimi Delta Attention) g_t is a vector [K] and S' = diag(exp(g_t)) S.
// q, k have H heads, v, o, g, beta and states HV (a multiple of H: value head hv reads q/k head
// hv / (HV / H)). Options: q, k L2-normalised (eps 1e-6, as FLA); g computed in the kernel
// (gate_mode); beta as beta_scale * sigmoid(beta).
// States are read from h0[n] (no state_indices) or from the pool slot
// state_indices[n, num_accepted[n] - 1] (column 0 without num_accepted); a slot < 0 or >= num_slots
// marks a padding sequence: its o is zero and no state is read or written.
struct CulaGdnParams {
  const void* q;  // [tokens, H, K]
  const void* k;
  const void* v;  // [tokens, HV, V]
  void* o;        // [tokens, HV, V]
  const void* g;  // [tokens, HV] ([tokens, HV, K] per-key gate) or null (no decay)
  const void* beta;     // [tokens, HV] or null (beta = 1)
  const void* a_log;    // [HV], or null: g is already the log decay
  const void* dt_bias;  // [HV] ([HV, K] per-key gate) or null
  int gate_mode;        // CULA_GATE_*
  float lower_bound;    // CULA_GATE_LOWER_BOUND's
  int g_dtype, beta_dtype, a_log_dtype, dt_bias_dtype;  // CULA_F32 / CULA_BF16 / CULA_F16
  const float* h0;      // [N, HV, K, V], the pool [P, HV, K, V], or null (zero state)
  float* ht;            // see ht_mode
  int ht_mode;          // CULA_HT_*
  const void* state_indices;  // [N, indices_stride] int32/int64, or null
  int state_indices_int64;
  long long indices_stride;
  const void* num_accepted;   // [N] int32/int64, or null
  int num_accepted_int64;
  long long num_slots;        // pool size
  long long q_stride, k_stride, v_stride;  // the token loop's: elements from one token's row of q / k / v to
                                           // the next; H * K / HV * V when contiguous, more in views of one
                                           // packed projection (SGLang's mixed_qkv). The chunked kernels take
                                           // contiguous rows; o is always contiguous.
  long long h0_pitch, ht_pitch;  // the token loop's: floats from one state of h0 / ht (a pool slot, or
                                 // sequence n's) to the next; HV * K * V when contiguous, more in a pool
                                 // whose slots sit in larger pages (vLLM's). The chunked kernels take
                                 // contiguous states.
  // Speculative verify, the token loop only. cache: the state after token t < cache_steps also to
  // state cache_indices[n] * cache_steps + t of cache (SGLang's intermediate_states_buffer
  // [C, steps, HV, ..], contiguous, laid out as h0; a cache index outside [0, cache_slots) keeps
  // none). parents: [N, parents_stride] (EAGLE trees): token t >= 1 starts from the state kept after
  // token parents[n, t] < t (in the cache, else where CULA_HT_SLOT_TOKEN / CULA_HT_TOKEN put it)
  // rather than from token t-1's; from the carried state where that token's was not kept.
  float* cache;
  const void* cache_indices;
  int cache_indices_int64;
  long long cache_steps, cache_slots;
  const void* parents;
  int parents_int64;
  long long parents_stride;
  CulaSeqs seqs;
  long long total_tokens;     // rows of q (cu_seqlens values are clamped to it)
  int heads, v_heads;
  float scale;
  int l2norm;                 // L2-normalise q and k
  int beta_sigmoid;           // beta = beta_scale * sigmoid(beta)
  float beta_scale;
  CulaKdaChunk kda;           // the two-launch chunked prefill only
};

// The parameters of both launches: the gated delta rule's, and tensor maps (boxes of CULA_CHUNK
// rows, 128-byte swizzle, rows past the end zero) through which the prep kernel loads q, k, v and
// stores W and U0 of whole chunks, and the state kernel reads the workspace and stores o.
struct CulaKdaLaunchParams {
  CulaTensorMap planes;  // [4 tokens, HV * K]: the planes W, Qg, Kl, U0 one after another (K = V); 64-column boxes
  CulaTensorMap aqk;     // [tokens, HV * CULA_CHUNK]; 64-column boxes
  CulaTensorMap o;       // [tokens, HV * V]: stores of whole chunks, boxes of CULA_BLOCK_V columns
  CulaTensorMap q, k;    // [tokens, H * K]: the prep's loads; 64-column boxes
  CulaTensorMap v;       // [tokens, HV * V]: the prep's loads; 64-column boxes
  CulaTensorMap g;       // [tokens, HV * K]: the prep's loads of the per-key gate (when given), in its dtype;
                         // 64-column boxes (32 for float32)
  CulaGdnParams p;
};
