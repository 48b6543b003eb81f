#include "train/probe.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "core/tensor_digest.h"

namespace retrace::train {
namespace {
thread_local StepProbe* t_probe = nullptr;

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction&) { return nullptr; }

void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (!t_probe) return;
  StepProbe* probe = t_probe;
  t_probe = nullptr;  // digesting runs ops of its own: do not record those
  Xxh3 h;
  for (const auto& v : fn.outputs()) {
    if (v.isTensor()) digest_tensor_into(h, v.toTensor());
    else if (v.isTensorList())
      for (const auto& t : v.toTensorList()) digest_tensor_into(h, t);
  }
  probe->record_op(fn.name(), h.digest());
  t_probe = probe;
}

std::string short_type(const torch::nn::Module& m) {
  std::string n = m.name();  // e.g. "torch::nn::LinearImpl"
  auto colon = n.rfind("::");
  if (colon != std::string::npos) n = n.substr(colon + 2);
  if (n.size() > 4 && n.compare(n.size() - 4, 4, "Impl") == 0) n.resize(n.size() - 4);
  return n;
}
}  // namespace

std::string module_of(const std::string& param_name) {
  auto dot = param_name.rfind('.');
  return dot == std::string::npos ? "" : param_name.substr(0, dot);
}

std::string module_type_of(const torch::nn::Module& model, const std::string& module) {
  for (const auto& item : model.named_modules())
    if (item.key() == module) return short_type(*item.value());
  return "";
}

StepProbe::StepProbe() {
  callback_handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(on_op_start, on_op_end).needsOutputs(true));
  t_probe = this;
}

StepProbe::~StepProbe() {
  t_probe = nullptr;
  at::removeCallback(callback_handle_);
}

void StepProbe::record_op(const std::string& op, const Digest128& digest) {
  uint64_t index = 0;
  for (auto it = ops_.rbegin(); it != ops_.rend(); ++it) {
    if (it->phase != phase_ || it->module != module_) break;
    index = it->index + 1;
    break;
  }
  ops_.push_back({phase_, module_, op, index, digest});
}

void StepProbe::begin_module(const std::string& name, const std::string& type) {
  module_ = name;
  module_type_ = type;
}

void StepProbe::end_module(const std::string& name, const std::string& type, const torch::Tensor& output) {
  StepProbe* saved = t_probe;
  t_probe = nullptr;
  Xxh3 h;
  digest_tensor_into(h, output);
  entries_.push_back({"forward", name, type, "output", h.digest(), output.detach().to(torch::kCPU).clone()});
  t_probe = saved;
  module_.clear();
  module_type_.clear();
}

void StepProbe::params(const torch::nn::Module& model, const std::string& phase, bool grads) {
  StepProbe* saved = t_probe;
  t_probe = nullptr;
  for (const auto& item : model.named_parameters()) {
    const torch::Tensor& t = grads ? item.value().grad() : item.value();
    Xxh3 h;
    digest_tensor_into(h, t);
    const std::string mod = module_of(item.key());
    const std::string leaf = item.key().substr(mod.empty() ? 0 : mod.size() + 1);
    entries_.push_back({phase, mod, module_type_of(model, mod), grads ? "grad of " + leaf : leaf, h.digest(),
                        t.defined() ? t.detach().to(torch::kCPU).clone() : torch::Tensor()});
  }
  t_probe = saved;
}

void StepProbe::step_start(const torch::nn::Module& model) {
  phase_ = "state";
  params(model, "state", false);
  phase_ = "forward";
}

void StepProbe::after_backward(const torch::nn::Module& model) {
  params(model, "backward", true);
  phase_ = "optimizer";
}

void StepProbe::after_optimizer(const torch::nn::Module& model) {
  params(model, "optimizer", false);
  phase_ = "done";
}

}  // namespace retrace::train
