#include "runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include "params.h"

extern "C" const unsigned char cula_fatbin_start[];

namespace cula {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw CudaError(std::string("cula: ") + what + " failed: " + cudaGetErrorName(err) + " (" +
                    cudaGetErrorString(err) + ")");
}

namespace {

// One device's side streams and events (SideStreams), made on first use, kept for the process.
struct Side {
  std::mutex lock;
  cudaStream_t streams[SideStreams::kCount] = {};
  cudaEvent_t fork = nullptr, done[SideStreams::kCount] = {};
};

using LibraryLoadDataFn = CUresult (*)(CUlibrary*, const void*, CUjit_option*, void**, unsigned,
                                       CUlibraryOption*, void**, unsigned);
using LibraryGetKernelFn = CUresult (*)(CUkernel*, CUlibrary, const char*);
using KernelSetAttributeFn = CUresult (*)(CUfunction_attribute, int, CUkernel, CUdevice);
using LaunchKernelFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, CUstream, void**, void**);
using LaunchKernelExFn = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using GetErrorNameFn = CUresult (*)(CUresult, const char**);
using TensorMapEncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                            const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                            CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                            CUtensorMapFloatOOBfill);

template <typename Fn>
Fn driver_entry(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
#if CUDART_VERSION >= 13000
  check_cuda(cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &status),
             "cudaGetDriverEntryPointByVersion");
#else
  check_cuda(cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &status), "cudaGetDriverEntryPoint");
#endif
  if (status != cudaDriverEntryPointSuccess || fn == nullptr)
    throw CudaError(std::string("cula: the CUDA driver does not provide ") + symbol +
                    " (CUDA 12.0 or newer is required); update the NVIDIA driver");
  return reinterpret_cast<Fn>(fn);
}

class Library {
 public:
  static Library& get() {
    static Library lib;  // initialised on first launch, after a device has been made current
    return lib;
  }

  void encode(CUtensorMap* map, CUtensorMapDataType type, void* base, const cuuint64_t* dims,
              const cuuint64_t* strides, const cuuint32_t* box) {
    const cuuint32_t elem_strides[2] = {1, 1};
    drv(encode_(map, type, 2, base, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        "cuTensorMapEncodeTiled");
  }

  void launch(const std::string& name, int device, dim3 grid, dim3 block, unsigned smem, cudaStream_t stream,
              void** args, bool early) {
    std::lock_guard<std::mutex> lock(mutex_);
    CUkernel kernel = kernel_for(name);
    if (smem > 48 * 1024 && configured_.count({kernel, device}) == 0) {
      drv(set_attribute_(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(smem), kernel, device),
          "cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
      configured_.insert({{kernel, device}, true});
    }
    CUresult rc;
    if (early && launch_ex_ != nullptr && pdl_wanted()) {
      CUlaunchAttribute attr[1] = {};
      attr[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attr[0].value.programmaticStreamSerializationAllowed = 1;
      CUlaunchConfig config = {};
      config.gridDimX = grid.x, config.gridDimY = grid.y, config.gridDimZ = grid.z;
      config.blockDimX = block.x, config.blockDimY = block.y, config.blockDimZ = block.z;
      config.sharedMemBytes = smem, config.hStream = reinterpret_cast<CUstream>(stream);
      config.attrs = attr, config.numAttrs = 1;
      rc = launch_ex_(&config, reinterpret_cast<CUfunction>(kernel), args, nullptr);
    } else {
      rc = launch_(reinterpret_cast<CUfunction>(kernel), grid.x, grid.y, grid.z, block.x, block.y, block.z, smem,
                   reinterpret_cast<CUstream>(stream), args, nullptr);
    }
    if (rc != CUDA_SUCCESS) drv(rc, ("cuLaunchKernel(" + name + ")").c_str());  // the text only on failure
  }

 private:
  Library()
      : load_(driver_entry<LibraryLoadDataFn>("cuLibraryLoadData")),
        get_kernel_(driver_entry<LibraryGetKernelFn>("cuLibraryGetKernel")),
        set_attribute_(driver_entry<KernelSetAttributeFn>("cuKernelSetAttribute")),
        launch_(driver_entry<LaunchKernelFn>("cuLaunchKernel")),
        // (programmatic launches where a CUDA graph capture can take them: CUDA 12.3 on)
        launch_ex_(driver_version() >= 12030 ? driver_entry<LaunchKernelExFn>("cuLaunchKernelEx") : nullptr),
        error_name_(driver_entry<GetErrorNameFn>("cuGetErrorName")),
        encode_(driver_entry<TensorMapEncodeTiledFn>("cuTensorMapEncodeTiled")) {
    drv(load_(&library_, cula_fatbin_start, nullptr, nullptr, 0, nullptr, nullptr, 0), "cuLibraryLoadData");
  }

  static bool pdl_wanted() {
    const char* env = std::getenv("CULA_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }

  CUkernel kernel_for(const std::string& name) {
    auto it = kernels_.find(name);
    if (it != kernels_.end()) return it->second;
    CUkernel kernel = nullptr;
    drv(get_kernel_(&kernel, library_, name.c_str()), ("cuLibraryGetKernel(" + name + ")").c_str());
    kernels_.emplace(name, kernel);
    return kernel;
  }

  void drv(CUresult rc, const char* what) const {
    if (rc == CUDA_SUCCESS) return;
    const char* err = "unknown error";
    error_name_(rc, &err);
    std::string hint;
    if (rc == CUDA_ERROR_NO_BINARY_FOR_GPU || rc == CUDA_ERROR_INVALID_SOURCE)
      hint = "; this build has SASS for sm_90a and the sm_100 family only";
    throw CudaError(std::string("cula: ") + what + " failed: " + err + hint);
  }

  std::mutex mutex_;
  LibraryLoadDataFn load_;
  LibraryGetKernelFn get_kernel_;
  KernelSetAttributeFn set_attribute_;
  LaunchKernelFn launch_;
  LaunchKernelExFn launch_ex_;
  GetErrorNameFn error_name_;
  TensorMapEncodeTiledFn encode_;
  CUlibrary library_ = nullptr;
  std::map<std::string, CUkernel> kernels_;
  std::map<std::pair<CUkernel, int>, bool> configured_;
};

}  // namespace

using CtxGetCurrentFn = CUresult (*)(CUcontext*);

DeviceGuard::DeviceGuard(int device) {
  check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ == device) {
    previous_ = -1;  // nothing to restore
    // The usual case (every call of a serving loop): a context of this device is already current
    // on this thread, so the launch can go ahead without cudaSetDevice.
    static const CtxGetCurrentFn ctx_get_current = driver_entry<CtxGetCurrentFn>("cuCtxGetCurrent");
    CUcontext ctx = nullptr;
    if (ctx_get_current(&ctx) == CUDA_SUCCESS && ctx != nullptr) return;
  }
  // Since CUDA 12.0 cudaSetDevice also makes the device's primary context current, which the
  // driver-API launch needs; it is legal during stream capture (cudaFree(nullptr) is not).
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

std::pair<int, int> device_capability(int device) {
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
  return {major, minor};
}

int multiprocessor_count(int device) {
  static std::mutex mutex;
  static std::map<int, int> counts;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = counts.find(device);
  if (it != counts.end()) return it->second;
  int n = 0;
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  counts.emplace(device, n);
  return n;
}

void synchronize_stream(std::uintptr_t stream) {
  check_cuda(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

int runtime_version() {
  int v = 0;
  check_cuda(cudaRuntimeGetVersion(&v), "cudaRuntimeGetVersion");
  return v;
}

int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) return 0;
  return v;
}

std::string runtime_library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaRuntimeGetVersion), &info) == 0 || info.dli_fname == nullptr) return {};
  return info.dli_fname;
}

void encode_tensor_map_2d(void* out, int dtype, const void* base, unsigned long long cols, unsigned long long rows,
                          unsigned long long row_stride_bytes, unsigned box_cols, unsigned box_rows) {
  static_assert(sizeof(CUtensorMap) == 128, "CUtensorMap is 128 bytes");
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const CUtensorMapDataType type = dtype == CULA_F32    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : dtype == CULA_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  Library::get().encode(static_cast<CUtensorMap*>(out), type, const_cast<void*>(base), dims, strides, box);
}

void launch(const std::string& name, int device, dim3 grid, dim3 block, unsigned smem_bytes, cudaStream_t stream,
            void** args, bool early) {
  Library::get().launch(name, device, grid, block, smem_bytes, stream, args, early);
}

SideStreams::SideStreams(int device, cudaStream_t stream) : stream_(stream) {
  static std::mutex made;
  static std::map<int, Side> sides;  // (std::map: its nodes stay put)
  Side* side;
  {
    std::lock_guard<std::mutex> guard(made);
    side = &sides[device];
    if (side->fork == nullptr) {
      for (int i = 0; i < SideStreams::kCount; ++i) {
        check_cuda(cudaStreamCreateWithFlags(&side->streams[i], cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
        check_cuda(cudaEventCreateWithFlags(&side->done[i], cudaEventDisableTiming), "cudaEventCreateWithFlags");
      }
      check_cuda(cudaEventCreateWithFlags(&side->fork, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    }
  }
  lock_ = std::unique_lock<std::mutex>(side->lock);
  check_cuda(cudaEventRecord(side->fork, stream), "cudaEventRecord");
  for (int i = 0; i < kCount; ++i) {
    side_[i] = side->streams[i], done_[i] = side->done[i];
    check_cuda(cudaStreamWaitEvent(side_[i], side->fork, 0), "cudaStreamWaitEvent");
  }
}

void SideStreams::join() {
  for (int i = 0; i < kCount; ++i) {
    check_cuda(cudaEventRecord(done_[i], side_[i]), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, done_[i], 0), "cudaStreamWaitEvent");
  }
}

}  // namespace cula
