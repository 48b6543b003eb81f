// A TorchScript model as a retrace model: train a model defined (and scripted) in Python from C++.
//
//   python3 examples/torchscript/make_model.py model.pt     # torch.jit.save(torch.jit.script(m))
//   ModelHandle h = load_torchscript("model.pt");
//
// The handle's module is a TorchScriptImpl, an nn::Module whose parameters and buffers ARE the
// scripted module's tensors (the same TensorImpl, so the same storage): the optimizer, the
// checkpoint and nn::Module::to() act on exactly what the scripted forward reads. Names are the
// script's dotted names ("fc1.weight"), the hierarchy mirrored with empty child modules.
//
// Numerics: the graph executor's optimizing passes (profiling, specialisation, autodiff subgraphs,
// the NNC / legacy / nvFuser fusers) may change the bits of a result between runs, executors and
// versions. fix_torchscript_executor() turns them off, so a scripted forward runs the same ATen
// kernels, in the same order, as eager PyTorch would; load_torchscript() and every forward call it.
//
// Dropout inside a scripted model (torch.nn.functional.dropout, nn.Dropout) draws from torch's
// default CPU generator, which retrace captures and restores with the rest of the RNG state, so a
// resumed run draws the same masks (for CPU tensors; a CUDA model draws from the CUDA generator).
#pragma once

#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"

namespace retrace::model {

// The model file, for the trace header (records::FileInfo {path, size, sha256}).
struct TorchScriptFile {
  std::string path;
  uint64_t size = 0;
  std::string sha256;  // 64 lowercase hex digits
};

// Size and sha256 of a model file. Throws IoError if it is missing or cannot be read.
TorchScriptFile torchscript_file(const std::string& path);
std::string torchscript_sha256(const std::string& path);

class TorchScriptImpl : public torch::nn::Module {
 public:
  // Registers the tensors of `script` (see above). Throws ConfigError for a parameter or buffer
  // that appears under two names (tied weights: the optimizer would step it twice).
  TorchScriptImpl(torch::jit::Module script, TorchScriptFile file);

  // Runs the scripted forward on one input. Throws FormatError if it returns no tensor.
  torch::Tensor forward(const torch::Tensor& x);

  // nn::Module's mode and the scripted module's `training` attributes (what its dropout reads),
  // recursively. nn::Module::eval() calls train(false).
  void train(bool on = true) override;

  void set_probe(ModuleProbe* probe) { probe_ = probe; }
  const TorchScriptFile& file() const { return file_; }
  torch::jit::Module& script() { return script_; }
  int64_t parameter_count() const;  // elements over all parameters
  std::string describe() const;     // "torchscript <path> (<N> parameters, sha256 <12 hex>)"

 private:
  torch::jit::Module script_;
  TorchScriptFile file_;
  ModuleProbe* probe_ = nullptr;
};

// Loads a TorchScript archive on the CPU (move it with handle.module->to(device)).
// Throws IoError (missing or unreadable file), FormatError (not a TorchScript archive, no
// forward(self, x) method), ConfigError (no parameters: nothing to train).
ModelHandle load_torchscript(const std::string& path);

// Turns the graph executor's optimisations and fusers off, for the whole process (and the
// optimize flag, which LibTorch keeps per thread, for the calling thread). Idempotent and cheap.
void fix_torchscript_executor();

// The executor settings in force on the calling thread, as key/value pairs for the run's
// fingerprint: {"torchscript.optimize", "off"}, {"torchscript.texpr_fuser", "off"}, ...
std::vector<std::pair<std::string, std::string>> torchscript_executor_settings();

}  // namespace retrace::model
