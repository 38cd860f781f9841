// Read-only view of a DLPack capsule (legacy "dltensor" or "dltensor_versioned"): enough to
// validate an array from any library and take its device pointer. The capsule is not consumed;
// the producer's capsule destructor releases it.
#pragma once

#include <Python.h>

#include <cstdint>
#include <vector>

namespace cula {

struct DLView {
  std::uintptr_t data = 0;  // data + byte_offset
  int device_type = 0;      // kDLCUDA = 2, kDLCPU = 1, ...
  int device_id = 0;
  int dtype_code = 0;       // kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4
  int dtype_bits = 0;
  int dtype_lanes = 0;
  std::vector<long long> shape;
  std::vector<long long> strides;  // in elements; compact row-major when the producer gave none
  bool read_only = false;
};

// Throws std::invalid_argument when `capsule` is not a DLPack capsule.
DLView dlpack_view(PyObject* capsule);

}  // namespace cula
