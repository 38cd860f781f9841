// Python bindings of the backend extension (cula_cu12._C / cula_cu13._C): what every family shares
// here, each family's launches in <family>_bind.cpp. Argument checks live in the Python layer,
// launches in <family>_ops.cpp, kernel loading in runtime.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "dlpack_view.h"
#include "fastpath.h"
#include "launch.h"
#include "runtime.h"

namespace py = pybind11;

#ifndef CULA_VERSION
#error "CULA_VERSION must be defined by the build"
#endif
#ifndef CULA_ARCHS
#error "CULA_ARCHS must be defined by the build"
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "cula CUDA backend (built for CUDA " + std::to_string(CUDART_VERSION / 1000) + ")";
  m.attr("__version__") = CULA_VERSION;
  m.attr("CUDA_MAJOR") = CUDART_VERSION / 1000;
  m.attr("BUILD_CUDART_VERSION") = CUDART_VERSION;
  m.attr("ARCHS") = py::make_tuple(CULA_ARCHS);
  // Everything registered here is module-local: cula_cu12._C and cula_cu13._C bind the same C++
  // types and may be imported into one process (they share pybind11's internals when built alike).
  auto& cuda_error = py::register_local_exception<cula::CudaError>(m, "CudaError", PyExc_RuntimeError);
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });

  py::enum_<cula::DType>(m, "DType", py::module_local()).value("bf16", cula::DType::bf16).value("f16", cula::DType::f16);

  cula::bind_simple_gla(m);
  cula::bind_gated_delta_rule(m);
  m.def(
      "fast_setup",
      [cuda_error](py::object tensor_type, py::object bf16, py::object f16, py::object f32, py::object i32,
                   py::object i64, py::object raw_stream, py::object empty_like, py::object backend) {
        cula::fast_setup(tensor_type.ptr(), bf16.ptr(), f16.ptr(), f32.ptr(), i32.ptr(), i64.ptr(), raw_stream.ptr(),
                         empty_like.ptr(), backend.ptr(), cuda_error.ptr());
      },
      "Enables the fast_* entry points for torch tensors (cula._fast.enable calls it once).");
  static PyMethodDef fast[] = {
      {"fast_decode", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&cula::fast_decode)), METH_FASTCALL,
       "fast_decode(q, k, v, state, g_gamma, scale, state_indices, check_indices, out) -> o, or None: "
       "use the Python path"},
      {"fast_sequence", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&cula::fast_sequence)),
       METH_FASTCALL,
       "fast_sequence(recurrent, q, k, v, g_gamma, scale, initial_state, output_final_state) -> (o, final_state), "
       "or None: use the Python path"},
      {"fast_gated_sequence",
       reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&cula::fast_gated_sequence)), METH_FASTCALL,
       "fast_gated_sequence(chunked, delta, q, k, v, g, beta, scale, initial_state, output_final_state, "
       "use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, use_gate_in_kernel, A_log, dt_bias, "
       "per_key, lower_bound, state_v_first) -> (o, final_state), or None: use the Python path"},
      {"fast_gated_decode", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&cula::fast_gated_decode)),
       METH_FASTCALL,
       "fast_gated_decode(delta, q, k, v, g, beta, state, scale, state_indices, check_indices, "
       "use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, use_gate_in_kernel, A_log, dt_bias, "
       "out, per_key, lower_bound, state_v_first) -> o, or None: use the Python path"},
      {nullptr, nullptr, 0, nullptr}};
  if (PyModule_AddFunctions(m.ptr(), fast) != 0) throw py::error_already_set();
  m.def("device_capability", &cula::device_capability, "(major, minor) of a CUDA device.");
  m.def("synchronize_stream", &cula::synchronize_stream, "Wait for a stream (0: the legacy default stream).");
  m.def("runtime_version", &cula::runtime_version, "cudaRuntimeGetVersion() of the loaded libcudart.");
  m.def("driver_version", &cula::driver_version, "CUDA version of the driver (e.g. 13000), 0 without a driver.");
  m.def("runtime_library_path", &cula::runtime_library_path, "Path of the libcudart file in use.");
  m.def(
      "dlpack_view",
      [](py::capsule capsule) {
        const cula::DLView v = cula::dlpack_view(capsule.ptr());
        return py::make_tuple(v.data, v.device_type, v.device_id, py::make_tuple(v.dtype_code, v.dtype_bits,
                              v.dtype_lanes), py::tuple(py::cast(v.shape)), py::tuple(py::cast(v.strides)),
                              v.read_only);
      },
      "(ptr, device_type, device_id, (code, bits, lanes), shape, strides, read_only) of a DLPack capsule.");
}
