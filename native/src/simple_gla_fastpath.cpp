// The simple_gla fast path (fastpath.h): decode steps and fixed-length sequences with a per-head
// decay, checked and launched from C.
#include <cstdint>

#include "fastpath.h"
#include "fastpath_torch.h"
#include "simple_gla_ops.h"

namespace cula {

using namespace fast;

namespace {

// g_gamma: None or float32 [H] (on the common device, checked with the others).
bool g_gamma_ok(PyObject* g, Tensor& t, bool& absent, long long heads) {
  return read_optional(g, t, absent) && (absent || (t.ndim == 1 && t.dims[0] == heads && t.dtype == kF32));
}

}  // namespace

// fast_decode(q, k, v, state, g_gamma, scale, state_indices, check_indices, out) -> o or None.
PyObject* fast_decode(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!ready() || nargs != 9) Py_RETURN_NONE;
  Tensor q, k, v, s, g, idx, out;
  bool no_g, no_idx, no_out;
  if (!read(args[0], q) || !read(args[1], k) || !read(args[2], v) || !read(args[3], s)) Py_RETURN_NONE;
  const int ndim = q.ndim;
  if (!(ndim == 3 || (ndim == 4 && q.dims[1] == 1)) || !inputs_ok(q, k, v, ndim)) Py_RETURN_NONE;
  const long long n = q.dims[0], heads = q.dims[ndim - 2], dim = q.dims[ndim - 1];
  float scale;
  if (n > 65535 || !scale_ok(args[5], static_cast<int>(dim), scale) || !g_gamma_ok(args[4], g, no_g, heads))
    Py_RETURN_NONE;
  // Indices whose values the caller wants checked need a device-to-host copy: the Python path.
  if (args[7] != Py_False && args[7] != Py_True) Py_RETURN_NONE;
  if (!read_optional(args[6], idx, no_idx) ||
      (!no_idx && (args[7] == Py_True || idx.ndim != 1 || idx.dims[0] != n || (idx.dtype != kI32 && idx.dtype != kI64))))
    Py_RETURN_NONE;
  if (!state_ok(s, no_idx ? n : -1, heads, dim)) Py_RETURN_NONE;
  if (!read_optional(args[8], out, no_out) ||
      (!no_out && (out.dtype != v.dtype || out.ndim != ndim || !same_dims(out, v, ndim))))
    Py_RETURN_NONE;
  int device;
  if (!one_device({&q, &k, &v, &s, no_g ? nullptr : &g, no_idx ? nullptr : &idx, no_out ? nullptr : &out}, device) ||
      approved_variant(device) == nullptr)
    Py_RETURN_NONE;
  const std::uintptr_t stream = current_stream(device);
  if (PyErr_Occurred()) return nullptr;
  Ref o(no_out ? empty_like(v.obj) : (Py_INCREF(out.obj), out.obj));
  if (o.p == nullptr) return nullptr;
  const std::uintptr_t optr = no_out ? data_ptr(o.p) : out.ptr;
  if (PyErr_Occurred()) return nullptr;
  if (!guarded([&] {
        recurrent_simple_gla({q.ptr, k.ptr, v.ptr, optr, no_g ? 0 : g.ptr, s.ptr, s.ptr, static_cast<int>(heads),
                              static_cast<int>(dim), dtype_of(q), scale},
                             {0, false, static_cast<int>(n), 1, 0}, no_idx ? 0 : idx.ptr, idx.dtype == kI64,
                             s.dims[0], stream, device);
      }))
    return nullptr;
  return o.release();
}

// fast_sequence(op, q, k, v, g_gamma, scale, initial_state, output_final_state) -> (o, ht) or None;
// op 0: chunked prefill, 1: token-by-token recurrence. Fixed-length batches only.
PyObject* fast_sequence(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!ready() || nargs != 8) Py_RETURN_NONE;
  const bool chunk = args[0] == Py_False;  // op passed as a bool: False = chunk
  Tensor q, k, v, g, h0;
  bool no_g, no_h0;
  if (!read(args[1], q) || !read(args[2], k) || !read(args[3], v) || !inputs_ok(q, k, v, 4)) Py_RETURN_NONE;
  const long long batch = q.dims[0], total = q.dims[1], heads = q.dims[2], dim = q.dims[3];
  float scale;
  if (total < 1 || batch > 65535 || !scale_ok(args[5], static_cast<int>(dim), scale) ||
      !g_gamma_ok(args[4], g, no_g, heads))
    Py_RETURN_NONE;
  PyObject* final_state = args[7];
  if (final_state != Py_True && final_state != Py_False) Py_RETURN_NONE;
  if (!read_optional(args[6], h0, no_h0) || (!no_h0 && !state_ok(h0, batch, heads, dim))) Py_RETURN_NONE;
  int device;
  if (!one_device({&q, &k, &v, no_g ? nullptr : &g, no_h0 ? nullptr : &h0}, device)) Py_RETURN_NONE;
  const char* variant = approved_variant(device);
  if (variant == nullptr) Py_RETURN_NONE;
  const std::uintptr_t stream = current_stream(device);
  if (PyErr_Occurred()) return nullptr;

  Ref o(empty_like(v.obj));
  if (o.p == nullptr) return nullptr;
  Ref ht;
  if (final_state == Py_True &&
      (ht.p = new_states(no_h0 ? nullptr : &h0, q.obj, {batch, heads, dim, dim})) == nullptr)
    return nullptr;
  const std::uintptr_t optr = data_ptr(o.p), htptr = ht.p ? data_ptr(ht.p) : 0;
  if (PyErr_Occurred()) return nullptr;
  const TensorArgs t{q.ptr, k.ptr, v.ptr, optr, no_g ? 0 : g.ptr, no_h0 ? 0 : h0.ptr, htptr,
                     static_cast<int>(heads), static_cast<int>(dim), dtype_of(q), scale};
  const SeqArgs seq{0, false, static_cast<int>(batch), total, batch * total};
  Split split;
  Scratch scratch;  // the earlier pieces' states of a split sequence
  if (chunk) {
    if (!guarded([&] { split = chunk_split(false, seq.num_seqs, total, t.heads, t.head_dim, variant, device); }))
      return nullptr;
    if (split.parts > 1 && !scratch.alloc(batch * (split.parts - 1) * heads * dim * dim * 4, q.obj, device, stream))
      return nullptr;
  }
  const bool ok = guarded([&] {
    if (chunk)
      chunk_simple_gla(t, seq, split, scratch.ptr, variant, stream, device);
    else
      recurrent_simple_gla(t, seq, 0, false, 0, stream, device);
  });
  if (!ok) return nullptr;
  return PyTuple_Pack(2, o.p, ht.p ? ht.p : Py_None);
}

}  // namespace cula
