// The digests of one step's tensors as its record holds them: one code for the CLI's step
// (step_state.cpp) and the recorder of a user's own loop (src/api/recorder.cpp), so a field of the
// record means the same bytes whichever loop wrote it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor_digest.h"
#include "records/records.h"

namespace retrace::train {

// The modules of a run's tensors (the header's parameters and buffers), found once: their names in
// the order of first appearance, each tensor's module, and each tensor's module by its name (for
// the optimizer's entries, named "<param>/<field>").
struct ModuleIndex {
  std::vector<std::string> names;
  std::vector<size_t> of_tensor;
  std::map<std::string, size_t> of_tensor_name;
};
ModuleIndex index_modules(const std::vector<records::ParamInfo>& tensors);

// A step's tensors, as the loop holds them after its update.
struct StepTensors {
  NamedTensors model;           // parameters, then buffers
  NamedTensors grads;           // the parameters' gradients as the optimizer used them
  NamedTensors optim;           // the optimizer's state (read only with_optimizer)
  bool with_optimizer = false;  // this step records the optimizer's digest
};

// Into `rec`: param_digest; under the mixed kinds (trace.digest_version 3 and 4) grad_digest; the
// optimizer's digest when with_optimizer; and, given `modules` under a mixed kind, every module's
// share of the three (module_digests; the model's tensors in the index's order). `known`: sums
// the tensors' owner already took (the fused AdamW's, tensor_digest.h), or nullptr. `parts`, when
// given and without `modules`: each tensor's share of the parameter and optimizer digests.
void digest_step_tensors(const StepTensors& tensors, DigestKind kind, const KnownSums* known,
                         const ModuleIndex* modules, records::StepRecord& rec, StepDigestParts* parts = nullptr);

// The record's rng_digest: xxh3-128 of the serialized RngState.
Digest128 rng_digest(const std::string& serialized_rng);

}  // namespace retrace::train
