// StepProbe: what bisection records while it re-executes one step. Per module and phase:
//   state      every parameter at the start of the step (after injected perturbations)
//   forward    the output of every module, in call order (the model reports its modules)
//   backward   every parameter's gradient after the last backward (before unscale and clipping)
//   optimizer  every parameter after the optimizer step
// and per operator, through LibTorch's RecordFunction callbacks (thread-local, this thread only),
// the digest of every tensor output with the module and phase it ran in. Costly: only for bisect.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "core/digest.h"
#include "model/module_probe.h"

namespace retrace::train {

struct ProbeEntry {
  std::string phase;        // state | forward | backward | optimizer
  std::string module;       // e.g. layers.2
  std::string module_type;  // e.g. Linear
  std::string what;         // "output", "weight", "grad of weight", ...
  Digest128 digest;
  torch::Tensor value;  // CPU copy, for the report's detail
};

struct OpEntry {
  std::string phase;
  std::string module;
  std::string op;      // e.g. aten::addmm
  uint64_t index = 0;  // position among the ops of its phase and module
  Digest128 digest;    // of every tensor output, in order
};

class StepProbe : public model::ModuleProbe {
 public:
  StepProbe();
  ~StepProbe() override;
  StepProbe(const StepProbe&) = delete;
  StepProbe& operator=(const StepProbe&) = delete;

  // Called by models around each module's forward.
  void begin_module(const std::string& name, const std::string& type) override;
  void end_module(const std::string& name, const std::string& type, const torch::Tensor& output) override;
  // Called by the step.
  void set_phase(const std::string& phase) { phase_ = phase; }
  void step_start(const torch::nn::Module& model);
  void after_backward(const torch::nn::Module& model);
  void after_optimizer(const torch::nn::Module& model);

  const std::vector<ProbeEntry>& entries() const { return entries_; }
  const std::vector<OpEntry>& ops() const { return ops_; }

  // Used by the RecordFunction callback.
  void record_op(const std::string& op, const Digest128& digest);

 private:
  void params(const torch::nn::Module& model, const std::string& phase, bool grads);
  std::vector<ProbeEntry> entries_;
  std::vector<OpEntry> ops_;
  std::string phase_ = "state";
  std::string module_, module_type_;
  uint64_t callback_handle_ = 0;
};

// "layers.2.weight" -> "layers.2"; the type of that submodule ("Linear"), or "" when unknown.
std::string module_of(const std::string& param_name);
std::string module_type_of(const torch::nn::Module& model, const std::string& module);

}  // namespace retrace::train
