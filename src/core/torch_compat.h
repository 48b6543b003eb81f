// Every call that differs between LibTorch 1.13 (Debian, CPU) and LibTorch 2.x (CUDA machines)
// lives here, so the rest of the code is version-free.
#pragma once

#include <ATen/Context.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <string>

namespace retrace::compat {

inline std::string libtorch_version() { return TORCH_VERSION; }

// The optimizer's per-parameter state. LibTorch 1.13 keys the map by the TensorImpl pointer
// printed as a string; 2.x keys it by the pointer itself.
inline torch::optim::OptimizerParamState* find_param_state(torch::optim::Optimizer& opt,
                                                          const at::Tensor& p) {
  auto& state = opt.state();
#if TORCH_VERSION_MAJOR >= 2
  auto it = state.find(p.unsafeGetTensorImpl());
#else
  auto it = state.find(c10::guts::to_string(p.unsafeGetTensorImpl()));
#endif
  return it == state.end() ? nullptr : it->second.get();
}

inline void set_param_state(torch::optim::Optimizer& opt, const at::Tensor& p,
                            std::unique_ptr<torch::optim::OptimizerParamState> s) {
#if TORCH_VERSION_MAJOR >= 2
  opt.state()[p.unsafeGetTensorImpl()] = std::move(s);
#else
  opt.state()[c10::guts::to_string(p.unsafeGetTensorImpl())] = std::move(s);
#endif
}

// Deterministic algorithms, error (not warn) on a nondeterministic kernel; cuDNN deterministic
// with benchmark mode off. Same call in 1.13 and 2.x.
inline void set_deterministic(bool on) {
  at::globalContext().setDeterministicAlgorithms(on, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(on);
  at::globalContext().setBenchmarkCuDNN(false);
}

// The default generator of a device, through the device-generic API (no CUDA headers needed).
inline at::Generator default_generator(c10::Device device) {
  return at::globalContext().defaultGenerator(device);
}

}  // namespace retrace::compat
