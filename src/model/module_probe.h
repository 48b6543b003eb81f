// The hook a model calls around each of its modules' forward, so that bisection can digest every
// module's output (see train/probe.h). Models hold a nullable pointer; nullptr costs nothing.
#pragma once

#include <torch/types.h>

#include <string>

namespace retrace::model {

class ModuleProbe {
 public:
  virtual ~ModuleProbe() = default;
  virtual void begin_module(const std::string& name, const std::string& type) = 0;
  virtual void end_module(const std::string& name, const std::string& type, const torch::Tensor& output) = 0;
};

}  // namespace retrace::model
