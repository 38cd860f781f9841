#include "fastpath.h"

#include <cmath>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <stdexcept>

#include "simple_gla_ops.h"

namespace cula {
namespace {

// What fast_setup() was given: torch.Tensor, the dtypes, torch._C._cuda_getCurrentRawStream,
// torch.empty_like and
// the Backend object whose `checked_devices` says which devices cula has approved (and their
// kernel variant). Strong references, kept for the life of the process.
struct Torch {
  PyTypeObject* tensor = nullptr;
  PyObject* bf16 = nullptr;
  PyObject* f16 = nullptr;
  PyObject* f32 = nullptr;
  PyObject* i32 = nullptr;
  PyObject* i64 = nullptr;
  PyObject* raw_stream = nullptr;
  PyObject* empty_like = nullptr;
  PyObject* backend = nullptr;
  PyObject* error_type = nullptr;  // cula's CudaError
  // interned names
  PyObject *s_shape, *s_dtype, *s_is_cuda, *s_requires_grad, *s_is_contiguous, *s_get_device, *s_data_ptr,
      *s_new_empty, *s_checked_devices, *s_sm90a;
  PyObject* kwnames_dtype;  // ("dtype",): the keyword names of new_empty(shape, dtype=...)
} T;

// A borrowed-or-new reference released on scope exit.
struct Ref {
  PyObject* p = nullptr;
  explicit Ref(PyObject* o = nullptr) : p(o) {}
  ~Ref() { Py_XDECREF(p); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  PyObject* release() {
    PyObject* r = p;
    p = nullptr;
    return r;
  }
};

enum Dt { kBf16, kF16, kF32, kI32, kI64, kOther };

// One torch tensor as the fast path sees it.
struct Tensor {
  PyObject* obj = nullptr;
  Ref shape;  // torch.Size (a tuple)
  int ndim = 0;
  long long dims[4] = {0, 0, 0, 0};
  Dt dtype = kOther;
  int device = -1;
  std::uintptr_t ptr = 0;
};

bool is_true(PyObject* o) { return o == Py_True; }

PyObject* call_method0(PyObject* self, PyObject* name) {
  PyObject* args[] = {self};
  return PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
}

// True when `x` is a plain (not a subclass) CUDA torch tensor of at most 4 dims that needs no grad,
// is contiguous and 16-byte aligned: the only arrays the fast path takes. Anything else, and any
// error on the way, answers false (the error cleared): the Python checks then handle `x`.
bool read(PyObject* x, Tensor& t) {
  if (x == nullptr || Py_TYPE(x) != T.tensor) return false;
  t.obj = x;
  {
    Ref grad(PyObject_GetAttr(x, T.s_requires_grad));
    if (grad.p != Py_False) return PyErr_Clear(), false;
    Ref cuda(PyObject_GetAttr(x, T.s_is_cuda));
    if (!is_true(cuda.p)) return PyErr_Clear(), false;
    Ref dtype(PyObject_GetAttr(x, T.s_dtype));
    if (dtype.p == nullptr) return PyErr_Clear(), false;
    t.dtype = dtype.p == T.bf16 ? kBf16 : dtype.p == T.f16 ? kF16 : dtype.p == T.f32 ? kF32
            : dtype.p == T.i32 ? kI32 : dtype.p == T.i64 ? kI64 : kOther;
  }
  t.shape.p = PyObject_GetAttr(x, T.s_shape);
  if (t.shape.p == nullptr || !PyTuple_Check(t.shape.p)) return PyErr_Clear(), false;
  t.ndim = static_cast<int>(PyTuple_GET_SIZE(t.shape.p));
  if (t.ndim > 4) return false;
  for (int i = 0; i < t.ndim; ++i) {
    t.dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(t.shape.p, i));
    if (t.dims[i] == -1 && PyErr_Occurred()) return PyErr_Clear(), false;
  }
  {
    Ref contiguous(call_method0(x, T.s_is_contiguous));
    if (!is_true(contiguous.p)) return PyErr_Clear(), false;
    Ref device(call_method0(x, T.s_get_device));
    if (device.p == nullptr) return PyErr_Clear(), false;
    t.device = static_cast<int>(PyLong_AsLong(device.p));
    Ref ptr(call_method0(x, T.s_data_ptr));
    if (ptr.p == nullptr) return PyErr_Clear(), false;
    t.ptr = static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(ptr.p));
    if (PyErr_Occurred()) return PyErr_Clear(), false;
  }
  return t.device >= 0 && t.ptr % 16 == 0;
}

// None or a tensor that passes read(); `absent` tells which.
bool read_optional(PyObject* x, Tensor& t, bool& absent) {
  absent = x == Py_None;
  return absent || read(x, t);
}

bool same_dims(const Tensor& a, const Tensor& b, int n) {
  for (int i = 0; i < n; ++i)
    if (a.dims[i] != b.dims[i]) return false;
  return true;
}

// q, k, v of one ndim and one 16-bit dtype, k shaped like q, v like q in all but the last dim,
// K = V in {64, 128}: what _checks.check_inputs accepts.
bool inputs_ok(const Tensor& q, const Tensor& k, const Tensor& v, int ndim) {
  if (q.ndim != ndim || k.ndim != ndim || v.ndim != ndim) return false;
  if ((q.dtype != kBf16 && q.dtype != kF16) || k.dtype != q.dtype || v.dtype != q.dtype) return false;
  const long long d = q.dims[ndim - 1];
  return same_dims(k, q, ndim) && same_dims(v, q, ndim - 1) && (d == 64 || d == 128) && v.dims[ndim - 1] == d;
}

// _checks.check_scale: None -> K^-0.5; an int (not a bool) or float, finite.
bool scale_ok(PyObject* s, int head_dim, float& out) {
  if (s == Py_None) {
    out = static_cast<float>(std::pow(static_cast<double>(head_dim), -0.5));
    return true;
  }
  if (PyBool_Check(s) || !(PyFloat_Check(s) || PyLong_Check(s))) return false;
  const double d = PyFloat_Check(s) ? PyFloat_AsDouble(s) : PyLong_AsDouble(s);
  if (PyErr_Occurred()) return PyErr_Clear(), false;
  out = static_cast<float>(d);
  return std::isfinite(d);
}

// g_gamma: None or float32 [H] (on the common device, checked with the others).
bool g_gamma_ok(PyObject* g, Tensor& t, bool& absent, long long heads) {
  return read_optional(g, t, absent) && (absent || (t.ndim == 1 && t.dims[0] == heads && t.dtype == kF32));
}

// float32 [n, H, D, D] (n < 0: any).
bool state_ok(const Tensor& s, long long n, long long heads, long long dim) {
  return s.ndim == 4 && s.dtype == kF32 && (n < 0 || s.dims[0] == n) && s.dims[1] == heads && s.dims[2] == dim &&
         s.dims[3] == dim;
}

// The kernel variant of a device cula has approved (ops check_device), or null: the Python path
// approves it first. Read on every call, so that a reset of checked_devices is seen.
const char* approved_variant(int device) {
  Ref devices(PyObject_GetAttr(T.backend, T.s_checked_devices));
  if (devices.p == nullptr || !PyDict_Check(devices.p)) return PyErr_Clear(), nullptr;
  Ref key(PyLong_FromLong(device));
  PyObject* variant = key.p ? PyDict_GetItemWithError(devices.p, key.p) : nullptr;  // borrowed
  if (variant == nullptr) return PyErr_Clear(), nullptr;
  const int sm90a = PyObject_RichCompareBool(variant, T.s_sm90a, Py_EQ);
  if (sm90a < 0) return PyErr_Clear(), nullptr;
  return sm90a ? "sm90a" : "generic";
}

bool one_device(std::initializer_list<const Tensor*> tensors, int& device) {
  device = -1;
  for (const Tensor* t : tensors) {
    if (t == nullptr) continue;
    if (device < 0) device = t->device;
    if (t->device != device) return false;
  }
  return device >= 0;
}

std::uintptr_t current_stream(int device) {
  Ref dev(PyLong_FromLong(device));
  if (dev.p == nullptr) return 0;
  PyObject* args[] = {dev.p};
  Ref s(PyObject_Vectorcall(T.raw_stream, args, 1, nullptr));
  if (s.p == nullptr) return 0;
  return static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(s.p));
}

// torch.empty_like(like) (1.8 us on the H200 machine's CPU; like.new_empty(like.shape) takes 2.8).
PyObject* empty_like(PyObject* like) {
  PyObject* args[] = {like};
  return PyObject_Vectorcall(T.empty_like, args, 1, nullptr);
}

// like.new_empty(shape, dtype=torch.float32): states and scratch on the inputs' device.
PyObject* new_empty_f32(PyObject* like, PyObject* shape) {
  PyObject* args[] = {like, shape, T.f32};
  return PyObject_VectorcallMethod(T.s_new_empty, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, T.kwnames_dtype);
}

// The data address of a tensor the fast path allocated (sets a Python error on failure).
std::uintptr_t data_ptr(PyObject* x) {
  Ref p(call_method0(x, T.s_data_ptr));
  return p.p ? static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(p.p)) : 0;
}

PyObject* shape_of(std::initializer_list<long long> dims) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(dims.size()));
  if (t == nullptr) return nullptr;
  Py_ssize_t i = 0;
  for (long long d : dims) {
    PyObject* n = PyLong_FromLongLong(d);
    if (n == nullptr) return Py_DECREF(t), nullptr;
    PyTuple_SET_ITEM(t, i++, n);
  }
  return t;
}

// Runs a launch; a C++ exception becomes cula's CudaError (or TypeError for invalid_argument).
template <typename Fn>
bool guarded(Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(T.error_type ? T.error_type : PyExc_RuntimeError, e.what());
  }
  return false;
}

DType dtype_of(const Tensor& t) { return t.dtype == kBf16 ? DType::bf16 : DType::f16; }

bool ready() { return T.tensor != nullptr; }

}  // namespace

void fast_setup(PyObject* tensor_type, PyObject* bf16, PyObject* f16, PyObject* f32, PyObject* i32, PyObject* i64,
                PyObject* raw_stream, PyObject* empty_like, PyObject* backend, PyObject* error_type) {
  if (ready()) return;
  if (!PyType_Check(tensor_type)) throw std::invalid_argument("fast_setup: tensor_type must be a type");
  for (PyObject* o : {tensor_type, bf16, f16, f32, i32, i64, raw_stream, empty_like, backend, error_type})
    Py_XINCREF(o);
  T.bf16 = bf16, T.f16 = f16, T.f32 = f32, T.i32 = i32, T.i64 = i64;
  T.raw_stream = raw_stream, T.empty_like = empty_like, T.backend = backend, T.error_type = error_type;
  T.s_shape = PyUnicode_InternFromString("shape");
  T.s_dtype = PyUnicode_InternFromString("dtype");
  T.s_is_cuda = PyUnicode_InternFromString("is_cuda");
  T.s_requires_grad = PyUnicode_InternFromString("requires_grad");
  T.s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
  T.s_get_device = PyUnicode_InternFromString("get_device");
  T.s_data_ptr = PyUnicode_InternFromString("data_ptr");
  T.s_new_empty = PyUnicode_InternFromString("new_empty");
  T.s_checked_devices = PyUnicode_InternFromString("checked_devices");
  T.s_sm90a = PyUnicode_InternFromString("sm90a");
  T.kwnames_dtype = PyTuple_Pack(1, T.s_dtype);
  T.tensor = reinterpret_cast<PyTypeObject*>(tensor_type);  // last: ready() from here on
}

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
  if (final_state == Py_True) {
    Ref shape(shape_of({batch, heads, dim, dim}));
    if (shape.p == nullptr || (ht.p = new_empty_f32(q.obj, shape.p)) == nullptr) return nullptr;
  }
  const std::uintptr_t optr = data_ptr(o.p), htptr = ht.p ? data_ptr(ht.p) : 0;
  if (PyErr_Occurred()) return nullptr;
  const TensorArgs t{q.ptr, k.ptr, v.ptr, optr, no_g ? 0 : g.ptr, no_h0 ? 0 : h0.ptr, htptr,
                     static_cast<int>(heads), static_cast<int>(dim), dtype_of(q), scale};
  const SeqArgs seq{0, false, static_cast<int>(batch), total, batch * total};
  Split split;
  Ref scratch;
  std::uintptr_t scratch_ptr = 0;
  if (chunk) {
    if (!guarded([&] { split = chunk_split(false, seq.num_seqs, total, t.heads, t.head_dim, variant, device); }))
      return nullptr;
    if (split.parts > 1) {
      Ref shape(shape_of({batch * (split.parts - 1) * heads * dim * dim}));
      if (shape.p == nullptr || (scratch.p = new_empty_f32(q.obj, shape.p)) == nullptr) return nullptr;
      scratch_ptr = data_ptr(scratch.p);
      if (PyErr_Occurred()) return nullptr;
    }
  }
  const bool ok = guarded([&] {
    if (chunk)
      chunk_simple_gla(t, seq, split, scratch_ptr, variant, stream, device);
    else
      recurrent_simple_gla(t, seq, 0, false, 0, stream, device);
  });
  if (!ok) return nullptr;
  return PyTuple_Pack(2, o.p, ht.p ? ht.p : Py_None);
}

}  // namespace cula
