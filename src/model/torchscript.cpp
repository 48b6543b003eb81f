#include "model/torchscript.h"

#include <c10/util/Exception.h>
#include <torch/csrc/jit/passes/graph_fuser.h>
#include <torch/csrc/jit/passes/tensorexpr_fuser.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR < 2
#include <torch/csrc/jit/codegen/cuda/interface.h>
#endif

#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <system_error>
#include <unordered_map>

#include "core/digest.h"
#include "core/error.h"

namespace retrace::model {
namespace {

const char* on_off(bool on) { return on ? "on" : "off"; }

std::string first_line(const std::string& s) {
  const auto end = s.find('\n');
  return end == std::string::npos ? s : s.substr(0, end);
}

// The optimize flag is thread_local in LibTorch (update_graph_executor_opt.cpp), the others are
// process-wide. A graph executor picks its plan on the first call and keeps it, so the flag must
// be off on whichever thread first runs a scripted function: forward sets it on every call.
void fix_optimize_flag_on_this_thread() { torch::jit::setGraphExecutorOptimize(false); }

// The scripted module's tensors, by address, to refuse tensors that appear under two names.
using Seen = std::unordered_map<const c10::TensorImpl*, std::string>;

void check_not_seen(Seen& seen, const at::Tensor& t, const std::string& name, const std::string& path) {
  auto [it, inserted] = seen.emplace(t.unsafeGetTensorImpl(), name);
  RETRACE_CHECK(inserted, ConfigError, "TorchScript model ", path, ": tensor \"", name, "\" is the same tensor as \"",
                it->second,
                "\" (tied weights); retrace needs every parameter and buffer under one name, "
                "or the optimizer would step it twice: untie them in the Python model and save it again");
}

// Registers the direct parameters and buffers of `script` on `mirror`, and an empty child for each
// submodule, recursively. `prefix` is the dotted name of `script` ("" for the root).
void mirror_module(torch::nn::Module& mirror, const torch::jit::Module& script, const std::string& prefix,
                   const std::string& path, Seen& seen) {
  for (const auto& p : script.named_parameters(/*recurse=*/false)) {
    check_not_seen(seen, p.value, prefix + p.name, path);
    mirror.register_parameter(p.name, p.value, p.value.requires_grad());
  }
  for (const auto& b : script.named_buffers(/*recurse=*/false)) {
    check_not_seen(seen, b.value, prefix + b.name, path);
    mirror.register_buffer(b.name, b.value);
  }
  for (const auto& c : script.named_children()) {
    auto child = std::make_shared<torch::nn::Module>(c.value.type()->name() ? c.value.type()->name()->name()
                                                                            : std::string("ScriptModule"));
    mirror.register_module(c.name, child);
    mirror_module(*child, c.value, prefix + c.name + ".", path, seen);
  }
}

// forward(self, x, [arguments with defaults]): one tensor in.
void check_forward_signature(const torch::jit::Module& script, const std::string& path) {
  auto forward = script.find_method("forward");
  RETRACE_CHECK(forward.has_value(), FormatError, "TorchScript model ", path,
                " has no forward method; retrace calls forward(x) with a batch of inputs: define "
                "forward(self, x: torch.Tensor) -> torch.Tensor in the Python model and save it again");
  const auto& args = forward->function().getSchema().arguments();
  size_t required = 0;
  for (size_t i = 1; i < args.size(); ++i) required += args[i].default_value().has_value() ? 0 : 1;
  RETRACE_CHECK(args.size() >= 2 && required <= 1, FormatError, "TorchScript model ", path, ": forward takes ",
                args.size() >= 1 ? args.size() - 1 : 0, " arguments (", required,
                " without a default) but retrace calls forward(x) with one tensor: the schema is ",
                forward->function().getSchema(), "; give the others default values");
}

}  // namespace

TorchScriptFile torchscript_file(const std::string& path) {
  constexpr const char* kExpected = "expected a file written by torch.jit.save";
  std::error_code ec;
  const bool exists = std::filesystem::exists(path, ec);
  RETRACE_CHECK(!ec, IoError, "cannot look up TorchScript model ", path, " (", ec.message(), "); ", kExpected);
  RETRACE_CHECK(exists, IoError, "TorchScript model ", path, " does not exist (", kExpected,
                "); check the model path in the configuration");
  RETRACE_CHECK(std::filesystem::is_regular_file(path, ec), IoError, "TorchScript model ", path,
                " is not a regular file (", kExpected, "); check the model path in the configuration");
  TorchScriptFile f;
  f.path = path;
  f.size = static_cast<uint64_t>(std::filesystem::file_size(path, ec));
  RETRACE_CHECK(!ec, IoError, "cannot read the size of TorchScript model ", path, ": ", ec.message());
  f.sha256 = sha256_file_hex(path);
  return f;
}

std::string torchscript_sha256(const std::string& path) { return torchscript_file(path).sha256; }

TorchScriptImpl::TorchScriptImpl(torch::jit::Module script, TorchScriptFile file)
    : torch::nn::Module("TorchScript"), script_(std::move(script)), file_(std::move(file)) {
  Seen seen;
  mirror_module(*this, script_, "", file_.path, seen);
  // The scripted module's mode as saved; the trainer switches it with train() / eval().
  train(script_.is_training());
}

void TorchScriptImpl::train(bool on) {
  torch::nn::Module::train(on);
  script_.train(on);  // every submodule's `training` attribute, which the scripted dropout reads
}

// nn::Module::to(device / dtype) needs nothing more: it replaces each registered tensor's data in
// place (Tensor::set_data on the same TensorImpl), and those TensorImpls are the ones the scripted
// module's attributes hold, so the scripted forward reads the moved tensors (tested).
torch::Tensor TorchScriptImpl::forward(const torch::Tensor& x) {
  fix_optimize_flag_on_this_thread();
  if (probe_) probe_->begin_module("torchscript", "TorchScript");
  torch::jit::IValue out = script_.forward({x});
  RETRACE_CHECK(out.isTensor(), FormatError, "TorchScript model ", file_.path, ": forward returned ",
                out.type()->annotation_str(),
                ", expected a Tensor of logits; make forward return "
                "only the logits (-> torch.Tensor) and save the model again");
  torch::Tensor y = out.toTensor();
  if (probe_) probe_->end_module("torchscript", "TorchScript", y);
  return y;
}

int64_t TorchScriptImpl::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

std::string TorchScriptImpl::describe() const {
  std::ostringstream out;
  out << "torchscript " << file_.path << " (" << parameter_count() << " parameters, sha256 "
      << file_.sha256.substr(0, 12) << ")";
  return out.str();
}

ModelHandle load_torchscript(const std::string& path) {
  fix_torchscript_executor();
  TorchScriptFile file = torchscript_file(path);  // IoError if missing
  torch::jit::Module script;
  try {
    script = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    RETRACE_FAIL(FormatError, path,
                 " is not a TorchScript file (torch::jit::load: ", first_line(e.what_without_backtrace()),
                 "); save one with torch.jit.save(torch.jit.script(model), path)");
  } catch (const std::exception& e) {
    RETRACE_FAIL(FormatError, path, " is not a TorchScript file (torch::jit::load: ", first_line(e.what()),
                 "); save one with torch.jit.save(torch.jit.script(model), path)");
  }
  check_forward_signature(script, path);
  auto module = std::make_shared<TorchScriptImpl>(std::move(script), std::move(file));
  RETRACE_CHECK(!module->parameters().empty(), ConfigError, "TorchScript model ", path,
                " has no parameters: there is nothing to train; register them as torch.nn.Parameter "
                "(or submodules such as torch.nn.Linear) in the Python model");
  ModelHandle handle{module, [module](const torch::Tensor& x) { return module->forward(x); }, module->describe(),
                     [module](ModuleProbe* p) { module->set_probe(p); }};
  handle.files.push_back({module->file().path, module->file().size, module->file().sha256});
  for (auto& [k, v] : torchscript_executor_settings()) handle.numerics.push_back({k, v});
  return handle;
}

void fix_torchscript_executor() {
  static std::once_flag once;
  std::call_once(once, [] {
    // The profiling executor (the default of 1.13 and 2.x), not the legacy one: with optimize off
    // it runs each graph as written (LowerGradOf and RemoveExpands only), with no profiling runs,
    // no specialisation, no differentiable subgraphs (backward is eager autograd's), no fusion.
    torch::jit::getExecutorMode() = true;
    torch::jit::getProfilingMode() = true;
    // Only consulted by the optimizing pipeline; off as well, in case anything turns it back on.
    torch::jit::setTensorExprFuserEnabled(false);
    torch::jit::setTensorExprDynamicShapeFusionEnabled(false);
    torch::jit::setTexprReductionsEnabled(false);
    torch::jit::overrideCanFuseOnCPULegacy(false);
#if TORCH_VERSION_MAJOR < 2
    torch::jit::fuser::cuda::setEnabled(false);  // nvFuser (2.x removed it from TorchScript)
#endif
  });
  fix_optimize_flag_on_this_thread();
}

std::vector<std::pair<std::string, std::string>> torchscript_executor_settings() {
  std::vector<std::pair<std::string, std::string>> s;
  s.emplace_back("torchscript.optimize", on_off(torch::jit::getGraphExecutorOptimize()));
  s.emplace_back("torchscript.executor", !torch::jit::IsNewExecutorEnabled()
                                             ? "legacy"
                                             : (torch::jit::getProfilingMode() ? "profiling" : "simple"));
  // PYTORCH_TENSOREXPR in the environment overrides setTensorExprFuserEnabled: report the getter.
  s.emplace_back("torchscript.texpr_fuser", on_off(torch::jit::tensorExprFuserEnabled()));
  s.emplace_back("torchscript.texpr_dynamic_shapes", on_off(torch::jit::tensorExprDynamicShapeFusionEnabled()));
  s.emplace_back("torchscript.texpr_reductions", on_off(torch::jit::texprReductionsEnabled()));
  s.emplace_back("torchscript.legacy_cpu_fuser", on_off(torch::jit::canFuseOnCPULegacy()));
#if TORCH_VERSION_MAJOR < 2
  s.emplace_back("torchscript.nvfuser", on_off(torch::jit::fuser::cuda::isEnabled()));
#else
  s.emplace_back("torchscript.nvfuser", "removed");
#endif
  std::ostringstream strategy;
  for (const auto& [behavior, depth] : torch::jit::getFusionStrategy()) {
    if (strategy.tellp() > 0) strategy << ",";
    strategy << (behavior == torch::jit::FusionBehavior::STATIC ? "static" : "dynamic") << ":" << depth;
  }
  s.emplace_back("torchscript.fusion_strategy", strategy.str());
  return s;
}

}  // namespace retrace::model
