// Every call that differs between LibTorch 1.13 (Debian, CPU) and LibTorch 2.x (CUDA machines)
// lives here, so the rest of the code is version-free.
#pragma once

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <string>

// c10d's base class of the Gloo and NCCL process groups: c10d::ProcessGroup in 1.13, c10d::Backend
// in 2.x (where ProcessGroup became a wrapper that dispatches to backends). Declared here only; the
// c10d headers are included where c10d is used.
namespace c10d {
#if TORCH_VERSION_MAJOR >= 2
class Backend;
#else
class ProcessGroup;
#endif
}  // namespace c10d

namespace retrace::compat {

#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

inline std::string libtorch_version() { return TORCH_VERSION; }

// The optimizer's per-parameter state. LibTorch 1.13 keys the map by the TensorImpl pointer
// printed as a string; 2.x keys it by the pointer itself.
inline torch::optim::OptimizerParamState* find_param_state(torch::optim::Optimizer& opt, const at::Tensor& p) {
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

// Whether the fused AdamW (train/adamw_kernel.h) reproduces this LibTorch's AdamW bit for bit. Its
// roundings are LibTorch 1.13's; 2.11's AdamW rounds otherwise (FusedAdamW.* differ from step 1),
// so on 2.x optim.fused steps through LibTorch's own AdamW until the kernel is matched to it.
inline constexpr bool kFusedAdamWMatchesLibTorch = TORCH_VERSION_MAJOR < 2;

// Deterministic algorithms, error (not warn) on a nondeterministic kernel; cuDNN deterministic
// with benchmark mode off. Same call in 1.13 and 2.x.
inline void set_deterministic(bool on) {
  at::globalContext().setDeterministicAlgorithms(on, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(on);
  at::globalContext().setBenchmarkCuDNN(false);
}

// The default generator of a device, through the device-generic API (no CUDA headers needed).
inline at::Generator default_generator(c10::Device device) { return at::globalContext().defaultGenerator(device); }

// Whether CPU autocast is on in this thread (1.13: is_cpu_enabled; 2.4+: by device type).
inline bool cpu_autocast_enabled() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return at::autocast::is_autocast_enabled(c10::DeviceType::CPU);
#else
  return at::autocast::is_cpu_enabled();
#endif
}

// Autocast for one region, RAII. LibTorch 1.13 has per-device setters (set_cpu_enabled,
// set_autocast_cpu_dtype, set_enabled + set_autocast_gpu_dtype for CUDA); 2.4+ takes the device
// type as an argument. Disabled (dtype Undefined) is a no-op.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, at::ScalarType dtype)
      : device_(device), active_(dtype != at::ScalarType::Undefined) {
    if (!active_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    prev_enabled_ = at::autocast::is_autocast_enabled(device);
    prev_dtype_ = at::autocast::get_autocast_dtype(device);
    at::autocast::set_autocast_enabled(device, true);
    at::autocast::set_autocast_dtype(device, dtype);
#else
    if (device == c10::DeviceType::CUDA) {
      prev_enabled_ = at::autocast::is_enabled();
      prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
      at::autocast::set_enabled(true);
      at::autocast::set_autocast_gpu_dtype(dtype);
    } else {
      prev_enabled_ = at::autocast::is_cpu_enabled();
      prev_dtype_ = at::autocast::get_autocast_cpu_dtype();
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(dtype);
    }
#endif
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(device_, prev_enabled_);
    at::autocast::set_autocast_dtype(device_, prev_dtype_);
#else
    if (device_ == c10::DeviceType::CUDA) {
      at::autocast::set_enabled(prev_enabled_);
      at::autocast::set_autocast_gpu_dtype(prev_dtype_);
    } else {
      at::autocast::set_cpu_enabled(prev_enabled_);
      at::autocast::set_autocast_cpu_dtype(prev_dtype_);
    }
#endif
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool active_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::ScalarType::Undefined;
};

}  // namespace retrace::compat
