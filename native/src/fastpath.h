// The fast path of the Python API for torch tensors: the checks of cula/_checks.py for the plain
// case (CUDA tensors, contiguous, aligned, no grad, fixed-length sequences) and the launch, in one
// C call of a few microseconds instead of ~20 through the Python checks. It takes only what the
// Python checks accept; for anything else it returns None without side effects and cula.ops runs
// its Python path, which copies, converts or raises the error that names the argument.
#pragma once

#include <Python.h>

namespace cula {

// Once, from cula.ops, when torch is in use: torch.Tensor, its bf16/f16/f32/i32/i64 dtypes,
// torch._C._cuda_getCurrentRawStream, torch.empty_like, the Backend object (its checked_devices dict lists the
// devices cula approved, with their variant) and the CudaError type launch failures raise.
void fast_setup(PyObject* tensor_type, PyObject* bf16, PyObject* f16, PyObject* f32, PyObject* i32, PyObject* i64,
                PyObject* raw_stream, PyObject* empty_like, PyObject* backend, PyObject* error_type);

// METH_FASTCALL functions, one file per family, which gives their arguments:
// simple_gla_fastpath.cpp: simple_gla with a per-head decay (and Lightning Attention)
PyObject* fast_decode(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* fast_sequence(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
// gated_delta_rule_fastpath.cpp: the gated delta rule, and simple_gla with a per-token gate
PyObject* fast_gated_sequence(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* fast_gated_decode(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

}  // namespace cula
