#include "model/activation_checkpoint.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/torch_compat.h"

namespace retrace::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The segment travels from forward to backward in the context's saved_data, which holds IValues;
// a capsule is the IValue that carries an arbitrary C++ object.
struct SegmentHolder : torch::CustomClassHolder {
  Segment segment;
  CheckpointRng rng = CheckpointRng::kRestore;
};

// Autocast as the forward saw it, so the recomputation (which runs in backward, outside any
// autocast region of the caller) casts exactly as the forward did.
struct AutocastState {
  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::ScalarType::BFloat16;
  bool cuda_enabled = false;
  at::ScalarType cuda_dtype = at::ScalarType::Half;
};

AutocastState current_autocast() {
  AutocastState s;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  s.cpu_enabled = at::autocast::is_autocast_enabled(c10::DeviceType::CPU);
  s.cpu_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CPU);
  s.cuda_enabled = at::autocast::is_autocast_enabled(c10::DeviceType::CUDA);
  s.cuda_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CUDA);
#else
  s.cpu_enabled = at::autocast::is_cpu_enabled();
  s.cpu_dtype = at::autocast::get_autocast_cpu_dtype();
  s.cuda_enabled = at::autocast::is_enabled();
  s.cuda_dtype = at::autocast::get_autocast_gpu_dtype();
#endif
  return s;
}

// Sets a generator's state under its mutex and puts the previous state back on destruction, even
// when the recomputation throws. The mutex is not held in between: dropout takes it itself.
class GeneratorStateSwap {
 public:
  GeneratorStateSwap(c10::Device device, const at::Tensor& state) : generator_(compat::default_generator(device)) {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    previous_ = generator_.get_state();
    generator_.set_state(state);
  }
  ~GeneratorStateSwap() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(previous_);
  }
  GeneratorStateSwap(const GeneratorStateSwap&) = delete;
  GeneratorStateSwap& operator=(const GeneratorStateSwap&) = delete;

 private:
  at::Generator generator_;
  at::Tensor previous_;
};

at::Tensor generator_state(c10::Device device) {
  at::Generator g = compat::default_generator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // Called by apply() with grad mode off: the segment keeps no graph.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            const c10::intrusive_ptr<SegmentHolder>& holder) {
    ctx->save_for_backward({input});
    ctx->saved_data["segment"] = c10::IValue::make_capsule(holder);
    ctx->saved_data["cpu_rng"] = generator_state(c10::Device(c10::kCPU));
    if (input.device().type() != c10::kCPU) {
      ctx->saved_data["device_rng"] = generator_state(input.device());
    }
    const AutocastState ac = current_autocast();
    ctx->saved_data["ac_cpu"] = ac.cpu_enabled;
    ctx->saved_data["ac_cpu_dtype"] = static_cast<int64_t>(ac.cpu_dtype);
    ctx->saved_data["ac_cuda"] = ac.cuda_enabled;
    ctx->saved_data["ac_cuda_dtype"] = static_cast<int64_t>(ac.cuda_dtype);
    at::NoGradGuard no_grad;
    return holder->segment(input);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& input = saved.at(0);
    auto holder = c10::static_intrusive_pointer_cast<SegmentHolder>(ctx->saved_data.at("segment").toCapsule());
    const bool restore = holder->rng == CheckpointRng::kRestore;

    at::Tensor x = input.detach();
    x.requires_grad_(true);
    at::Tensor output;
    {
      // Generators: back to the forward's state for the recomputation, then back to now.
      std::optional<GeneratorStateSwap> cpu_swap;
      std::optional<GeneratorStateSwap> device_swap;
      if (restore) {
        cpu_swap.emplace(c10::Device(c10::kCPU), ctx->saved_data.at("cpu_rng").toTensor());
        auto it = ctx->saved_data.find("device_rng");
        if (it != ctx->saved_data.end()) device_swap.emplace(input.device(), it->second.toTensor());
      }
      std::optional<compat::AutocastGuard> ac_cpu;
      std::optional<compat::AutocastGuard> ac_cuda;
      if (ctx->saved_data.at("ac_cpu").toBool()) {
        ac_cpu.emplace(c10::DeviceType::CPU, static_cast<at::ScalarType>(ctx->saved_data.at("ac_cpu_dtype").toInt()));
      }
      if (ctx->saved_data.at("ac_cuda").toBool()) {
        ac_cuda.emplace(c10::DeviceType::CUDA,
                        static_cast<at::ScalarType>(ctx->saved_data.at("ac_cuda_dtype").toInt()));
      }
      at::AutoGradMode grad_on(true);
      output = holder->segment(x);
    }
    RETRACE_CHECK(output.requires_grad(), InvariantError,
                  "activation checkpoint: the recomputed segment output does not require grad");
    // Re-entrant backward: parameters of the segment accumulate into .grad, x gets its gradient.
    torch::autograd::backward({output}, {grad_outputs.at(0)});
    return {x.grad(), at::Tensor()};
  }
};

}  // namespace

at::Tensor checkpoint(const Segment& segment, const at::Tensor& input, CheckpointRng rng) {
  RETRACE_CHECK(static_cast<bool>(segment), InvariantError, "activation checkpoint: empty segment");
  RETRACE_CHECK(input.defined(), InvariantError, "activation checkpoint: undefined input");
  auto holder = c10::make_intrusive<SegmentHolder>();
  holder->segment = segment;
  holder->rng = rng;
  // A custom Function only joins the graph when one of its tensor inputs requires grad; an input
  // that does not (raw data into the first segment) becomes a throwaway leaf so that the
  // parameters inside the segment still get their gradients.
  if (at::GradMode::is_enabled() && !input.requires_grad()) {
    at::Tensor leaf = input.detach();
    leaf.requires_grad_(true);
    return CheckpointFunction::apply(leaf, holder);
  }
  return CheckpointFunction::apply(input, holder);
}

const std::vector<std::string>& checkpoint_policies() {
  static const std::vector<std::string> kPolicies = {"none", "full", "sqrt", "selective"};
  return kPolicies;
}

bool is_checkpoint_policy(const std::string& policy) {
  const auto& p = checkpoint_policies();
  return std::find(p.begin(), p.end(), policy) != p.end();
}

int64_t sqrt_segment_length(int64_t n_layers) {
  RETRACE_CHECK(n_layers >= 1, ConfigError, "bad value for model.n_layers: ", n_layers, " (need >= 1)");
  int64_t r = 1;
  while (r * r < n_layers) ++r;
  return r;
}

std::vector<int64_t> checkpoint_segment_lengths(const std::string& policy, int64_t n_layers, int64_t k) {
  RETRACE_CHECK(is_checkpoint_policy(policy), ConfigError, "bad value for model.checkpoint: \"", policy,
                "\" is not one of \"none\", \"full\", \"sqrt\", \"selective\"");
  RETRACE_CHECK(n_layers >= 1, ConfigError, "bad value for model.n_layers: ", n_layers, " (need >= 1)");
  int64_t length = 0;
  if (policy == "full") {
    RETRACE_CHECK(k >= 1, ConfigError, "bad value for model.checkpoint_every: ", k, " (need >= 1 layers per segment)");
    length = k;
  } else if (policy == "sqrt") {
    length = sqrt_segment_length(n_layers);
  } else {
    return {};
  }
  std::vector<int64_t> lengths;
  for (int64_t done = 0; done < n_layers; done += length) lengths.push_back(std::min(length, n_layers - done));
  return lengths;
}

}  // namespace retrace::model
