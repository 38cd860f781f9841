// The torch-reading layer every family's fast path shares (fastpath_torch.h), and fast_setup.
#include "fastpath.h"

#include <cmath>
#include <utility>

#include "fastpath_torch.h"

namespace cula {
namespace fast {

Torch T;

namespace {

// _checks.prepare_rows' rule on t's strides (a tuple): the token stride of dense [H, D] rows one
// stride apart throughout, or 0 where they are not.
long long row_stride_of(const Tensor& t, PyObject* strides) {
  const int n = t.ndim;
  if (n < 3 || !PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != n) return 0;
  long long st[4];
  for (int i = 0; i < n; ++i) {
    st[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
    if (st[i] == -1 && PyErr_Occurred()) return PyErr_Clear(), 0;
  }
  const long long heads = t.dims[n - 2], dim = t.dims[n - 1];
  if (st[n - 1] != 1 || (heads > 1 && st[n - 2] != dim)) return 0;
  long long stride = 0, next = 0;  // the innermost leading dim's stride; what the next one out must have
  for (int i = n - 3; i >= 0; --i) {
    if (t.dims[i] <= 1) continue;
    if (stride != 0 && st[i] != next) return 0;
    if (stride == 0) stride = st[i];
    next = st[i] * t.dims[i];
  }
  return stride >= heads * dim && stride % 8 == 0 ? stride : 0;
}

}  // namespace

bool read(PyObject* x, Tensor& t, bool rows) {
  if (x == nullptr || Py_TYPE(x) != T.tensor) return false;
  t.obj = x;
  {
    Ref grad(T.requires_grad.of(x));
    if (grad.p != Py_False) return PyErr_Clear(), false;
    Ref cuda(T.is_cuda.of(x));
    if (!is_true(cuda.p)) return PyErr_Clear(), false;
    Ref dtype(T.dtype.of(x));
    if (dtype.p == nullptr) return PyErr_Clear(), false;
    t.dtype = dtype.p == T.bf16 ? kBf16 : dtype.p == T.f16 ? kF16 : dtype.p == T.f32 ? kF32
            : dtype.p == T.i32 ? kI32 : dtype.p == T.i64 ? kI64 : kOther;
  }
  t.shape.p = T.shape.of(x);
  if (t.shape.p == nullptr || !PyTuple_Check(t.shape.p)) return PyErr_Clear(), false;
  t.ndim = static_cast<int>(PyTuple_GET_SIZE(t.shape.p));
  if (t.ndim > 4) return false;
  for (int i = 0; i < t.ndim; ++i) {
    t.dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(t.shape.p, i));
    if (t.dims[i] == -1 && PyErr_Occurred()) return PyErr_Clear(), false;
  }
  {
    Ref contiguous(T.is_contiguous.call(x));
    t.row_stride = 0;
    if (!is_true(contiguous.p)) {
      if (!rows || contiguous.p == nullptr) return PyErr_Clear(), false;
      Ref strides(T.stride.call(x));
      if (strides.p == nullptr || (t.row_stride = row_stride_of(t, strides.p)) == 0) return PyErr_Clear(), false;
    }
    Ref device(T.get_device.call(x));
    if (device.p == nullptr) return PyErr_Clear(), false;
    t.device = static_cast<int>(PyLong_AsLong(device.p));
    Ref ptr(T.data_ptr.call(x));
    if (ptr.p == nullptr) return PyErr_Clear(), false;
    t.ptr = static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(ptr.p));
    if (PyErr_Occurred()) return PyErr_Clear(), false;
  }
  return t.device >= 0 && t.ptr % 16 == 0;
}

bool inputs_ok(const Tensor& q, const Tensor& k, const Tensor& v, int ndim) {
  if (q.ndim != ndim || k.ndim != ndim || v.ndim != ndim) return false;
  if ((q.dtype != kBf16 && q.dtype != kF16) || k.dtype != q.dtype || v.dtype != q.dtype) return false;
  const long long d = q.dims[ndim - 1];
  return same_dims(k, q, ndim) && same_dims(v, q, ndim - 1) && (d == 64 || d == 128) && v.dims[ndim - 1] == d;
}

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

PyObject* empty_like(PyObject* like) {
  PyObject* args[] = {like};
  return PyObject_Vectorcall(T.empty_like, args, 1, nullptr);
}

PyObject* new_empty_f32(PyObject* like, PyObject* shape) {
  PyObject* args[] = {like, shape, T.f32};
  return PyObject_VectorcallMethod(T.s_new_empty, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, T.kwnames_dtype);
}

PyObject* new_states(const Tensor* h0, PyObject* like, std::initializer_list<long long> dims) {
  if (h0 != nullptr) return empty_like(h0->obj);
  Ref shape(shape_of(dims));
  return shape.p ? new_empty_f32(like, shape.p) : nullptr;
}

std::uintptr_t data_ptr(PyObject* x) {
  Ref p(T.data_ptr.call(x));
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

namespace {

// Torch's current CUDA device, or -1 (the error cleared) where it cannot be read.
int torch_current_device() {
  Ref d(PyObject_CallNoArgs(T.current_device));
  const long v = d.p ? PyLong_AsLong(d.p) : -1;
  if (PyErr_Occurred()) PyErr_Clear();
  return static_cast<int>(v);
}

}  // namespace

bool Scratch::alloc(long long bytes, PyObject* like, int device, std::uintptr_t stream) {
  if (T.raw_alloc != nullptr && torch_current_device() == device) {
    Ref size(PyLong_FromLongLong(bytes)), st(PyLong_FromUnsignedLongLong(stream));
    if (size.p == nullptr || st.p == nullptr) return false;
    PyObject* args[] = {size.p, st.p};
    Ref p(PyObject_Vectorcall(T.raw_alloc, args, 2, nullptr));
    if (p.p == nullptr) return false;  // (torch's out-of-memory error)
    ptr = static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(p.p));
    if (PyErr_Occurred()) return false;
    raw_ = true;
    return true;
  }
  Ref shape(shape_of({bytes / 4}));
  if (shape.p == nullptr || (tensor_.p = new_empty_f32(like, shape.p)) == nullptr) return false;
  ptr = data_ptr(tensor_.p);
  return !PyErr_Occurred();
}

Scratch::~Scratch() {
  if (!raw_) return;
  PyObject *type, *value, *trace;  // (an error being raised must survive the call)
  PyErr_Fetch(&type, &value, &trace);
  Ref p(PyLong_FromUnsignedLongLong(ptr));
  PyObject* args[] = {p.p};
  Ref r(p.p ? PyObject_Vectorcall(T.raw_delete, args, 1, nullptr) : nullptr);
  if (r.p == nullptr) PyErr_Clear();
  PyErr_Restore(type, value, trace);
}

namespace {

// Fills `attr` for torch.Tensor's attribute `name` (the descriptor through the type: a getset or
// method descriptor is its own class attribute); a torch whose attribute is anything else (e.g.
// defined in Python) keeps the read by name.
void find_attr(PyObject* type, const char* name, Attr& attr) {
  attr.name = PyUnicode_InternFromString(name);
  Ref d(attr.name ? PyObject_GetAttr(type, attr.name) : nullptr);
  if (d.p != nullptr && Py_TYPE(d.p) == &PyGetSetDescr_Type) {
    const PyGetSetDef* def = reinterpret_cast<PyGetSetDescrObject*>(d.p)->d_getset;
    attr.get = def->get, attr.closure = def->closure;
  } else if (d.p != nullptr && Py_TYPE(d.p) == &PyMethodDescr_Type) {
    attr.method = d.release();
  }
  PyErr_Clear();
}

}  // namespace

}  // namespace fast

using namespace fast;

void fast_setup(PyObject* tensor_type, PyObject* bf16, PyObject* f16, PyObject* f32, PyObject* i32, PyObject* i64,
                PyObject* raw_stream, PyObject* empty_like, PyObject* backend, PyObject* error_type) {
  if (ready()) return;
  if (!PyType_Check(tensor_type)) throw std::invalid_argument("fast_setup: tensor_type must be a type");
  for (PyObject* o : {tensor_type, bf16, f16, f32, i32, i64, raw_stream, empty_like, backend, error_type})
    Py_XINCREF(o);
  T.bf16 = bf16, T.f16 = f16, T.f32 = f32, T.i32 = i32, T.i64 = i64;
  T.raw_stream = raw_stream, T.empty_like = empty_like, T.backend = backend, T.error_type = error_type;
  for (auto [attr, name] : {std::pair<Attr*, const char*>{&T.requires_grad, "requires_grad"}, {&T.is_cuda, "is_cuda"},
                            {&T.dtype, "dtype"}, {&T.shape, "shape"}, {&T.is_contiguous, "is_contiguous"},
                            {&T.get_device, "get_device"}, {&T.data_ptr, "data_ptr"}, {&T.stride, "stride"}})
    find_attr(tensor_type, name, *attr);
  T.s_new_empty = PyUnicode_InternFromString("new_empty");
  T.s_checked_devices = PyUnicode_InternFromString("checked_devices");
  T.s_sm90a = PyUnicode_InternFromString("sm90a");
  T.kwnames_dtype = PyTuple_Pack(1, T.dtype.name);
  if (PyObject* c = PyImport_ImportModule("torch._C")) {  // optional: Scratch falls back to tensors
    PyObject* fns[3] = {PyObject_GetAttrString(c, "_cuda_cudaCachingAllocator_raw_alloc"),
                        PyObject_GetAttrString(c, "_cuda_cudaCachingAllocator_raw_delete"),
                        PyObject_GetAttrString(c, "_cuda_getDevice")};
    if (fns[0] && fns[1] && fns[2]) {
      T.raw_alloc = fns[0], T.raw_delete = fns[1], T.current_device = fns[2];
    } else {
      for (PyObject* f : fns) Py_XDECREF(f);
    }
    Py_DECREF(c);
  }
  PyErr_Clear();
  T.tensor = reinterpret_cast<PyTypeObject*>(tensor_type);  // last: ready() from here on
}

}  // namespace cula
