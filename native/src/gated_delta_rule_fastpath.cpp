// The gated recurrence's fast path (fastpath.h): the fixed-length sequences and decode steps of
// the gated delta rule, KDA (its per-key gate) and per-token-gate simple_gla, checked and launched
// from C. What it takes
// is what cula/_gated.py (sequence_op, decode_op) accepts without copying, converting or reading
// values on the host; for anything else it answers None and the Python path runs.
#include <cstdint>

#include "fastpath.h"
#include "fastpath_torch.h"
#include "gated_delta_rule_ops.h"
#include "params.h"

namespace cula {

using namespace fast;

namespace {

constexpr long long kMaxSequences = 65535;  // _checks.MAX_SEQUENCES: a grid dimension of the launch

bool scalar_dtype(const Tensor& t) { return t.dtype == kF32 || t.dtype == kBf16 || t.dtype == kF16; }

// CULA_F32 / CULA_BF16 / CULA_F16: the first three Dt values are those codes (fastpath_torch.h).
ScalarArg scalar_arg(const Tensor& t, bool absent) {
  return absent ? ScalarArg{} : ScalarArg{t.ptr, static_cast<int>(t.dtype)};
}

// q, k [..., H, K], v [..., HV, V], one 16-bit dtype, K = V in {64, 128}; HV a multiple of H for the
// delta rule (grouped value heads, _checks.check_gva_inputs), HV = H without it (check_inputs).
bool gva_inputs_ok(const Tensor& q, const Tensor& k, const Tensor& v, int ndim, bool delta) {
  if (q.ndim != ndim || k.ndim != ndim || v.ndim != ndim) return false;
  if ((q.dtype != kBf16 && q.dtype != kF16) || k.dtype != q.dtype || v.dtype != q.dtype) return false;
  if (!same_dims(k, q, ndim) || !same_dims(v, q, ndim - 2)) return false;
  const long long heads = q.dims[ndim - 2], v_heads = v.dims[ndim - 2], dim = q.dims[ndim - 1];
  if (heads < 1 || (delta ? v_heads % heads != 0 : v_heads != heads)) return false;
  return (dim == 64 || dim == 128) && v.dims[ndim - 1] == dim;
}

// g, beta, A_log, dt_bias as _gated.gates_of takes them: per-token scalars shaped like v without its
// last dim ([..., HV]; KDA's per-key g [..., HV, K]), per-head parameters [HV] (dt_bias [HV * K] or
// [HV, K] with the per-key gate; read only with use_gate_in_kernel), float32, bfloat16 or float16;
// the options' rules (g, and A_log unless KDA's lower_bound is given, with the in-kernel gate;
// allow_neg_eigval with the beta sigmoid). lower_bound arrives checked (_gated.check_lower_bound).
struct Gates {
  Tensor g, beta, a_log, dt_bias;
  bool no_g = true, no_beta = true, no_a_log = true, no_dt_bias = true;
  bool use_gate = false, sigmoid = false, neg = false, per_key = false, bounded = false;
  float lower_bound = 0.f;
};

// The gate of each token: [..., HV] shaped like v without its last dim, or with `key_dim` [..., HV, K].
bool token_gates_ok(PyObject* x, Tensor& t, bool& absent, const Tensor& v, long long key_dim = 0) {
  if (!read_optional(x, t, absent)) return false;
  const int lead = v.ndim - 1;
  return absent || (t.ndim == (key_dim ? v.ndim : lead) && same_dims(t, v, lead) &&
                    (!key_dim || t.dims[lead] == key_dim) && scalar_dtype(t));
}

// [HV], or with `key_dim` [HV * K] or [HV, K].
bool head_param_ok(PyObject* x, Tensor& t, bool& absent, long long v_heads, long long key_dim = 0) {
  if (!read_optional(x, t, absent)) return false;
  if (absent) return true;
  const bool shape = key_dim ? (t.ndim == 1 && t.dims[0] == v_heads * key_dim) ||
                                   (t.ndim == 2 && t.dims[0] == v_heads && t.dims[1] == key_dim)
                             : t.ndim == 1 && t.dims[0] == v_heads;
  return shape && scalar_dtype(t);
}

bool gates_ok(PyObject* g, PyObject* beta, PyObject* use_gate, PyObject* a_log, PyObject* dt_bias,
              PyObject* sigmoid, PyObject* neg, PyObject* per_key, PyObject* lower_bound, const Tensor& v,
              Gates& out) {
  if (!is_bool(use_gate) || !is_bool(sigmoid) || !is_bool(neg) || !is_bool(per_key)) return false;
  out.use_gate = is_true(use_gate), out.sigmoid = is_true(sigmoid), out.neg = is_true(neg);
  out.per_key = is_true(per_key), out.bounded = lower_bound != Py_None;
  if (out.neg && !out.sigmoid) return false;
  if (out.bounded) {
    if (!out.per_key || !PyFloat_CheckExact(lower_bound)) return false;
    out.lower_bound = static_cast<float>(PyFloat_AS_DOUBLE(lower_bound));
  }
  const long long key_dim = out.per_key ? v.dims[v.ndim - 1] : 0;
  if (!token_gates_ok(g, out.g, out.no_g, v, key_dim) || !token_gates_ok(beta, out.beta, out.no_beta, v))
    return false;
  if (!out.use_gate) return true;
  const long long v_heads = v.dims[v.ndim - 2];
  return !out.no_g && head_param_ok(a_log, out.a_log, out.no_a_log, v_heads) &&
         (!out.no_a_log || (out.per_key && out.bounded)) &&
         head_param_ok(dt_bias, out.dt_bias, out.no_dt_bias, v_heads, key_dim);
}

const Tensor* present(const Tensor& t, bool absent) { return absent ? nullptr : &t; }

GdnArgs gdn_args(const Tensor& q, const Tensor& v, std::uintptr_t o, const Gates& gt, float scale, bool l2norm,
                 bool delta) {
  GdnArgs a;
  a.q = q.ptr, a.v = v.ptr, a.o = o;
  a.g = scalar_arg(gt.g, gt.no_g), a.beta = scalar_arg(gt.beta, gt.no_beta);
  a.a_log = scalar_arg(gt.a_log, !gt.use_gate || gt.no_a_log);
  a.dt_bias = scalar_arg(gt.dt_bias, !gt.use_gate || gt.no_dt_bias);
  a.gate_mode = !gt.use_gate ? CULA_GATE_RAW : gt.bounded ? CULA_GATE_LOWER_BOUND : CULA_GATE_SOFTPLUS;
  a.lower_bound = gt.lower_bound, a.per_key = gt.per_key;
  a.heads = static_cast<int>(q.dims[q.ndim - 2]), a.v_heads = static_cast<int>(v.dims[v.ndim - 2]);
  a.head_dim = static_cast<int>(q.dims[q.ndim - 1]), a.dtype = dtype_of(q), a.scale = scale;
  a.l2norm = l2norm, a.beta_sigmoid = gt.sigmoid, a.beta_scale = gt.neg ? 2.f : 1.f, a.delta = delta;
  return a;
}

}  // namespace

// fast_gated_sequence(chunked, delta, q, k, v, g, beta, scale, initial_state, output_final_state,
//                     use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
//                     use_gate_in_kernel, A_log, dt_bias, per_key, lower_bound, state_v_first)
//   -> (o, final_state) or None.
// Fixed-length batches [B, T, ...] without a state pool; chunked: the chunked prefill kernel, else
// the token-by-token recurrence; delta=False: simple_gla with a per-token gate (beta None);
// per_key: KDA's gate (g [B, T, HV, K]), lower_bound None or its (checked) float.
PyObject* fast_gated_sequence(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!ready() || nargs != 19) Py_RETURN_NONE;
  for (int i : {0, 1, 9, 10, 18})
    if (!is_bool(args[i])) Py_RETURN_NONE;
  const bool chunked = is_true(args[0]), delta = is_true(args[1]), v_first = is_true(args[18]);
  if (v_first && !delta) Py_RETURN_NONE;
  const bool final_state = is_true(args[9]), l2norm = is_true(args[10]);
  Tensor q, k, v, h0;
  bool no_h0;
  if (!read(args[2], q) || !read(args[3], k) || !read(args[4], v) || !gva_inputs_ok(q, k, v, 4, delta))
    Py_RETURN_NONE;
  const long long batch = q.dims[0], total = q.dims[1], v_heads = v.dims[2], dim = q.dims[3];
  float scale;
  if (total < 1 || batch > kMaxSequences || !scale_ok(args[7], static_cast<int>(dim), scale)) Py_RETURN_NONE;
  Gates gt;
  if (!gates_ok(args[5], args[6], args[13], args[14], args[15], args[11], args[12], args[16], args[17], v, gt))
    Py_RETURN_NONE;
  if (!read_optional(args[8], h0, no_h0) || (!no_h0 && !state_ok(h0, batch, v_heads, dim))) Py_RETURN_NONE;
  int device;
  if (!one_device({&q, &k, &v, present(gt.g, gt.no_g), present(gt.beta, gt.no_beta),
                   present(gt.a_log, !gt.use_gate || gt.no_a_log), present(gt.dt_bias, !gt.use_gate || gt.no_dt_bias),
                   present(h0, no_h0)},
                  device))
    Py_RETURN_NONE;
  const char* variant = approved_variant(device);
  if (variant == nullptr) Py_RETURN_NONE;
  const std::uintptr_t stream = current_stream(device);
  if (PyErr_Occurred()) return nullptr;

  Ref o(empty_like(v.obj));
  if (o.p == nullptr) return nullptr;
  Ref ht;
  if (final_state && (ht.p = new_states(no_h0 ? nullptr : &h0, q.obj, {batch, v_heads, dim, dim})) == nullptr)
    return nullptr;
  const SeqArgs seq{0, false, static_cast<int>(batch), total, batch * total};
  Scratch ws;  // the chunked prefill's workspace, where it takes one
  long long ws_bytes = 0;
  if (chunked && !guarded([&] {
        ChunkStates st;
        st.v_first = v_first;
        ws_bytes = chunk_workspace_bytes(gt.per_key, delta, seq, static_cast<int>(v_heads), static_cast<int>(dim), st,
                                         variant, device);
      }))
    return nullptr;
  if (ws_bytes != 0 && !ws.alloc(ws_bytes, q.obj, device, stream)) return nullptr;
  const std::uintptr_t optr = data_ptr(o.p), htptr = ht.p ? data_ptr(ht.p) : 0;
  if (PyErr_Occurred()) return nullptr;
  GdnArgs a = gdn_args(q, v, optr, gt, scale, l2norm, delta);
  a.workspace = ws.ptr;
  a.k = k.ptr, a.h0 = no_h0 ? 0 : h0.ptr, a.ht = htptr, a.ht_mode = ht.p ? CULA_HT_FINAL : CULA_HT_NONE;
  a.state_v_first = v_first, a.variant = variant;
  if (!guarded([&] { (chunked ? chunk_gated : recurrent_gated)(a, seq, stream, device); })) return nullptr;
  return PyTuple_Pack(2, o.p, ht.p ? ht.p : Py_None);
}

// fast_gated_decode(delta, q, k, v, g, beta, state, scale, state_indices, check_indices,
//                   use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
//                   use_gate_in_kernel, A_log, dt_bias, out, per_key, lower_bound, state_v_first) -> o or None.
// A decode step on a state pool in place: q [N, H, K] or [N, T, H, K] (T tokens per sequence),
// state [P, HV, K, V]; state_indices None (P = N), [N], or [N, S] (S >= T, one slot per token),
// taken only unchecked (check_indices=False: the check copies the values to the host). Without
// num_accepted_tokens (the Python path takes those calls).
PyObject* fast_gated_decode(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!ready() || nargs != 20) Py_RETURN_NONE;
  for (int i : {0, 9, 10, 19})
    if (!is_bool(args[i])) Py_RETURN_NONE;
  const bool delta = is_true(args[0]), l2norm = is_true(args[10]), v_first = is_true(args[19]);
  if (v_first && !delta) Py_RETURN_NONE;
  Tensor q, k, v, s, idx, out;
  bool no_idx, no_out;
  if (!read(args[1], q, true) || !read(args[2], k, true) || !read(args[3], v, true) || !read(args[6], s))
    Py_RETURN_NONE;  // (q, k, v: any row stride, as views of one packed projection)
  const int ndim = q.ndim;
  if ((ndim != 3 && ndim != 4) || !gva_inputs_ok(q, k, v, ndim, delta)) Py_RETURN_NONE;
  const long long n = q.dims[0], tokens = ndim == 3 ? 1 : q.dims[1], v_heads = v.dims[ndim - 2],
                  dim = q.dims[ndim - 1];
  float scale;
  if (tokens < 1 || n > kMaxSequences || !scale_ok(args[7], static_cast<int>(dim), scale)) Py_RETURN_NONE;
  Gates gt;
  if (!gates_ok(args[4], args[5], args[13], args[14], args[15], args[11], args[12], args[17], args[18], v, gt))
    Py_RETURN_NONE;
  if (!read_optional(args[8], idx, no_idx)) Py_RETURN_NONE;
  if (!no_idx && (is_true(args[9]) || (idx.dtype != kI32 && idx.dtype != kI64) || idx.dims[0] != n ||
                  !(idx.ndim == 1 || (idx.ndim == 2 && idx.dims[1] >= tokens))))
    Py_RETURN_NONE;
  if (!state_ok(s, no_idx ? n : -1, v_heads, dim)) Py_RETURN_NONE;
  if (!read_optional(args[16], out, no_out) ||
      (!no_out && (out.dtype != v.dtype || out.ndim != ndim || !same_dims(out, v, ndim))))
    Py_RETURN_NONE;
  int device;
  if (!one_device({&q, &k, &v, &s, present(gt.g, gt.no_g), present(gt.beta, gt.no_beta),
                   present(gt.a_log, !gt.use_gate || gt.no_a_log), present(gt.dt_bias, !gt.use_gate || gt.no_dt_bias),
                   present(idx, no_idx), present(out, no_out)},
                  device) ||
      approved_variant(device) == nullptr)
    Py_RETURN_NONE;
  const std::uintptr_t stream = current_stream(device);
  if (PyErr_Occurred()) return nullptr;
  Ref o(no_out ? empty_like(v.obj) : (Py_INCREF(out.obj), out.obj));
  if (o.p == nullptr) return nullptr;
  const std::uintptr_t optr = no_out ? data_ptr(o.p) : out.ptr;
  if (PyErr_Occurred()) return nullptr;
  GdnArgs a = gdn_args(q, v, optr, gt, scale, l2norm, delta);
  const bool per_token = !no_idx && idx.ndim == 2;
  a.q_stride = q.row_stride, a.k_stride = k.row_stride, a.v_stride = v.row_stride;
  a.k = k.ptr, a.h0 = s.ptr, a.ht = s.ptr, a.ht_mode = per_token ? CULA_HT_SLOT_TOKEN : CULA_HT_SLOT;
  a.state_v_first = v_first;
  a.state_indices = no_idx ? 0 : idx.ptr, a.state_indices_int64 = !no_idx && idx.dtype == kI64;
  a.indices_stride = per_token ? idx.dims[1] : 1, a.num_slots = no_idx ? n : s.dims[0];
  const SeqArgs seq{0, false, static_cast<int>(n), tokens, n * tokens};
  if (!guarded([&] { recurrent_gated(a, seq, stream, device); })) return nullptr;
  return o.release();
}

}  // namespace cula
