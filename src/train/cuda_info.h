// What this binary's LibTorch knows of CUDA, for the fingerprint and for clear errors: whether it
// was built with CUDA, the CUDA runtime and cuDNN versions it was built against, and the model
// and compute capability of a device. Device properties need the CUDA runtime's headers, so they
// are read only in builds against a LibTorch with CUDA (RETRACE_WITH_CUDA); the rest goes through
// ATen's device-generic CUDA hooks, which answer "no CUDA" in a CPU build.
#pragma once

#include <string>

namespace retrace::train {

struct CudaInfo {
  bool built = false;       // this LibTorch has CUDA compiled in
  int devices = 0;          // visible CUDA devices
  std::string runtime;      // "13.0" (the CUDA runtime LibTorch was built against), "" without CUDA
  std::string cudnn;        // "9.19.0", "" without cuDNN
  std::string device_name;  // of the device asked for: "NVIDIA H200", "" when not available
  std::string capability;   // "9.0"
};

// device < 0 or not visible: no device fields.
CudaInfo cuda_info(int device);

}  // namespace retrace::train
