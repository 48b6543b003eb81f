#include "train/cuda_info.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>

#include <exception>
#if defined(RETRACE_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

namespace retrace::train {
namespace {
// CUDA and cuDNN encode versions as major*1000 + minor*10 (CUDA) and major*10000 + minor*100 +
// patch (cuDNN 9).
std::string cuda_version_text(long v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }
std::string cudnn_version_text(long v) {
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
}
}  // namespace

CudaInfo cuda_info(int device) {
  CudaInfo info;
  const auto& hooks = at::detail::getCUDAHooks();
  info.devices = static_cast<int>(torch::cuda::device_count());
  // hasCUDA() answers whether a device is usable; whether CUDA is compiled in shows in the
  // runtime version, which a CPU build's default hooks refuse to give.
  try {
    info.runtime = cuda_version_text(hooks.versionCUDART());
    info.built = true;
  } catch (const std::exception&) {
    return info;
  }
  if (hooks.compiledWithCuDNN()) info.cudnn = cudnn_version_text(hooks.versionCuDNN());
#if defined(RETRACE_WITH_CUDA)
  if (device >= 0 && device < info.devices) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
    info.device_name = p->name;
    info.capability = std::to_string(p->major) + "." + std::to_string(p->minor);
  }
#else
  (void)device;
#endif
  return info;
}

}  // namespace retrace::train
