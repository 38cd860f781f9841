// Loading the embedded fatbin and launching its kernels.
//
// The extension links libcudart only. Driver functions (cuLibraryLoadData, cuLaunchKernel, ...)
// are fetched through cudaGetDriverEntryPoint, which libcudart has had since 12.0, so the
// module imports on machines without a driver and works with every libcudart 12.x / 13.x.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

namespace cula {

// Raised for CUDA failures; the binding turns it into a Python RuntimeError.
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Makes `device` current for the lifetime of the guard and restores the previous device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

std::pair<int, int> device_capability(int device);
int multiprocessor_count(int device);  // cached per device
void synchronize_stream(std::uintptr_t stream);
int runtime_version();
int driver_version();  // CUDA version the driver supports (cudaDriverGetVersion), 0 without a driver
std::string runtime_library_path();

// Encodes a TMA descriptor (CUtensorMap) of a row-major 2-D view of elements of `dtype`
// (CULA_F32 / CULA_BF16 / CULA_F16): `rows` rows of `cols` elements, `row_stride_bytes` apart, read
// in boxes of box_rows x box_cols with the 128-byte swizzle; rows past the end read as zeros.
void encode_tensor_map_2d(void* out, int dtype, const void* base, unsigned long long cols, unsigned long long rows,
                          unsigned long long row_stride_bytes, unsigned box_cols, unsigned box_rows);

// Throws CudaError naming `what` unless err is cudaSuccess.
void check_cuda(cudaError_t err, const char* what);

// Three streams that run one call's work side by side, beside the caller's stream: created once
// per device (non-blocking), they start after the work `stream` had queued (fork) and `stream`
// waits for theirs (join); a CUDA-graph capture of `stream` takes them in, as branches. The events
// are shared, so a fork holds a lock until its join. The caller's device is current.
class SideStreams {
 public:
  static constexpr int kCount = 3;
  SideStreams(int device, cudaStream_t stream);
  SideStreams(const SideStreams&) = delete;
  SideStreams& operator=(const SideStreams&) = delete;
  cudaStream_t operator[](int i) const { return side_[i]; }
  void join();  // the caller's stream waits for all three

 private:
  std::unique_lock<std::mutex> lock_;
  cudaStream_t stream_;
  cudaStream_t side_[kCount];
  cudaEvent_t done_[kCount];
};

// Launches kernel `name` of the embedded fatbin on `stream` (the caller's device is current).
// `early`: a programmatic dependent launch (sm_90 on) on the kernel queued just before it, which
// lets its CTAs start while that kernel's last CTAs run: the kernel must wait for that one's results
// (grid_dependency_wait, common/ptx.cuh) before it reads them, and that kernel lets it start early
// (grid_dependents_launch). Where the driver cannot capture such launches into CUDA graphs (before
// CUDA 12.3) or CULA_PDL=0 (read on every call), an ordinary launch.
void launch(const std::string& name, int device, dim3 grid, dim3 block, unsigned smem_bytes,
            cudaStream_t stream, void** args, bool early = false);

}  // namespace cula
