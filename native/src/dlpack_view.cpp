#include "dlpack_view.h"

#include <cstring>
#include <stdexcept>

namespace {

// The DLPack ABI (dlpack.h, v1.x); only the fields read here.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLFlagBitMaskReadOnly = 1ull << 0;

}  // namespace

namespace cula {

DLView dlpack_view(PyObject* capsule) {
  const DLTensor* t = nullptr;
  DLView view;
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    t = &static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"))->dl_tensor;
  } else if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, "dltensor_versioned"));
    if (m->version.major != 1)
      throw std::invalid_argument("unsupported DLPack major version " + std::to_string(m->version.major));
    t = &m->dl_tensor;
    view.read_only = (m->flags & kDLFlagBitMaskReadOnly) != 0;
  } else {
    throw std::invalid_argument("expected a DLPack capsule (\"dltensor\" or \"dltensor_versioned\")");
  }
  view.data = reinterpret_cast<std::uintptr_t>(t->data) + t->byte_offset;
  view.device_type = t->device.device_type;
  view.device_id = t->device.device_id;
  view.dtype_code = t->dtype.code;
  view.dtype_bits = t->dtype.bits;
  view.dtype_lanes = t->dtype.lanes;
  view.shape.assign(t->shape, t->shape + t->ndim);
  view.strides.resize(t->ndim);
  if (t->strides) {
    for (int i = 0; i < t->ndim; ++i) view.strides[i] = t->strides[i];
  } else {
    long long s = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      view.strides[i] = s;
      s *= t->shape[i];
    }
  }
  return view;
}

}  // namespace cula
