// What every family's fast path (<family>_fastpath.cpp) shares: reading torch tensors from C
// (the checks of cula/_checks.py for the plain case), the device cula approved, the current
// stream, allocations through torch, and turning launch failures into Python errors. Internal to
// the extension; the entry points are declared in fastpath.h.
#pragma once

#include <Python.h>

#include <cstdint>
#include <exception>
#include <initializer_list>
#include <stdexcept>

#include "launch.h"

namespace cula::fast {

// An attribute of torch.Tensor that read() takes from every tensor, found once on the type by
// fast_setup: a property's C getter (its getset descriptor's), or a method's descriptor, which is
// called with the tensor (no attribute lookup, no bound method). By name (PyObject_GetAttr, or the
// method call) where the type has neither. Directly, the seven reads of a tensor take about 0.5 us
// on the H100 machine's CPU; by name, 0.65 (notes/torch-integration.md, session 3).
struct Attr {
  PyObject* name = nullptr;  // interned
  getter get = nullptr;
  void* closure = nullptr;
  PyObject* method = nullptr;  // strong

  PyObject* of(PyObject* x) const { return get != nullptr ? get(x, closure) : PyObject_GetAttr(x, name); }
  PyObject* call(PyObject* x) const {
    if (method != nullptr) return PyObject_Vectorcall(method, &x, 1, nullptr);
    return PyObject_VectorcallMethod(name, &x, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  }
};

// What fast_setup() was given: torch.Tensor, the dtypes, torch._C._cuda_getCurrentRawStream,
// torch.empty_like and the Backend object whose `checked_devices` says which devices cula has
// approved (and their kernel variant). Strong references, kept for the life of the process.
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
  // torch._C's raw caching-allocator entry points and current-device query, where this torch has
  // them (null otherwise): scratch memory without a tensor (Scratch).
  PyObject* raw_alloc = nullptr;
  PyObject* raw_delete = nullptr;
  PyObject* current_device = nullptr;
  Attr requires_grad, is_cuda, dtype, shape, is_contiguous, get_device, data_ptr, stride;  // what read() reads
  // interned names
  PyObject *s_new_empty, *s_checked_devices, *s_sm90a;
  PyObject* kwnames_dtype;  // ("dtype",): the keyword names of new_empty(shape, dtype=...)
};
extern Torch T;

inline bool ready() { return T.tensor != nullptr; }

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

// The order matches the kernels' scalar dtype codes for the first three (CULA_F32 = 0, CULA_BF16 =
// 1, CULA_F16 = 2 in params.h): scalar_code() relies on it.
enum Dt { kF32, kBf16, kF16, kI32, kI64, kOther };

// One torch tensor as the fast path sees it.
struct Tensor {
  PyObject* obj = nullptr;
  Ref shape;  // torch.Size (a tuple)
  int ndim = 0;
  long long dims[4] = {0, 0, 0, 0};
  Dt dtype = kOther;
  int device = -1;
  std::uintptr_t ptr = 0;
  long long row_stride = 0;  // read(.., rows): elements from one token's row to the next; 0: contiguous
};

inline bool is_true(PyObject* o) { return o == Py_True; }
inline bool is_bool(PyObject* o) { return o == Py_True || o == Py_False; }

// True when `x` is a plain (not a subclass) CUDA torch tensor of at most 4 dims that needs no grad,
// is contiguous and 16-byte aligned: the only arrays the fast path takes. Anything else, and any
// error on the way, answers false (the error cleared): the Python checks then handle `x`. With
// `rows` (q, k, v of the token loop) also a token input [.., H, D] whose [H, D] rows are dense and
// one row_stride apart throughout, a multiple of 8 elements (_checks.prepare_rows' rule).
bool read(PyObject* x, Tensor& t, bool rows = false);

// None or a tensor that passes read(); `absent` tells which.
inline bool read_optional(PyObject* x, Tensor& t, bool& absent) {
  absent = x == Py_None;
  return absent || read(x, t);
}

inline bool same_dims(const Tensor& a, const Tensor& b, int n) {
  for (int i = 0; i < n; ++i)
    if (a.dims[i] != b.dims[i]) return false;
  return true;
}

// q, k, v of one ndim and one 16-bit dtype, k shaped like q, v like q in all but the last dim,
// K = V in {64, 128}: what _checks.check_inputs accepts.
bool inputs_ok(const Tensor& q, const Tensor& k, const Tensor& v, int ndim);

// _checks.check_scale: None -> K^-0.5; an int (not a bool) or float, finite.
bool scale_ok(PyObject* s, int head_dim, float& out);

// float32 [n, H, D, D] (n < 0: any).
inline bool state_ok(const Tensor& s, long long n, long long heads, long long dim) {
  return s.ndim == 4 && s.dtype == kF32 && (n < 0 || s.dims[0] == n) && s.dims[1] == heads && s.dims[2] == dim &&
         s.dims[3] == dim;
}

// The kernel variant of a device cula has approved (ops check_device), or null: the Python path
// approves it first. Read on every call, so that a reset of checked_devices is seen.
const char* approved_variant(int device);

// All the given tensors (null entries skipped) on one device, returned in `device`.
bool one_device(std::initializer_list<const Tensor*> tensors, int& device);

// torch's current stream on `device` (0 with a Python error set on failure).
std::uintptr_t current_stream(int device);

// torch.empty_like(like) (1.8 us on the H200 machine's CPU; like.new_empty(like.shape) takes 2.8).
PyObject* empty_like(PyObject* like);

// like.new_empty(shape, dtype=torch.float32): states and scratch on the inputs' device.
PyObject* new_empty_f32(PyObject* like, PyObject* shape);

// A float32 [N, H, K, V] state array of `dims` on like's device: empty_like(h0) when the call gave an
// initial state h0 (checked as that shape, contiguous), half the cost of new_empty_f32.
PyObject* new_states(const Tensor* h0, PyObject* like, std::initializer_list<long long> dims);

// The data address of a tensor the fast path allocated (sets a Python error on failure).
std::uintptr_t data_ptr(PyObject* x);

// A tuple of Python ints (a shape for new_empty_f32).
PyObject* shape_of(std::initializer_list<long long> dims);

// Device memory that one call's kernels use between launches (a workspace), released when the
// object goes, i.e. once the launches are enqueued: the memory then returns to torch's caching
// allocator, stream-ordered, as a temporary tensor's would (and inside a CUDA graph capture to the
// graph's pool). Taken from the allocator directly (torch._C._cuda_cudaCachingAllocator_raw_alloc:
// 0.7 us on the H100 machine's CPU, a float32 tensor through new_empty 2.6) when `device` is torch's
// current device, which raw_alloc allocates on; else, or with a torch without it, a tensor.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch();
  // `bytes` (a multiple of 4) on `device` for use on `stream`, like's device; false with a Python
  // error set on failure.
  bool alloc(long long bytes, PyObject* like, int device, std::uintptr_t stream);
  std::uintptr_t ptr = 0;

 private:
  Ref tensor_;       // the fallback
  bool raw_ = false;  // ptr came from raw_alloc
};

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

inline DType dtype_of(const Tensor& t) { return t.dtype == kBf16 ? DType::bf16 : DType::f16; }

}  // namespace cula::fast
