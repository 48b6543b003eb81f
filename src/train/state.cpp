#include "train/state.h"

#include <torch/torch.h>

#include <sstream>

#include "core/error.h"
#include "core/parse_number.h"
#include "train/faults.h"
#include "train/policy_records.h"

namespace retrace::train {

NamedTensors module_tensors(const torch::nn::Module& m) {
  NamedTensors out;
  for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  for (const auto& item : m.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<records::ParamInfo> param_info(const torch::nn::Module& m) { return param_info(module_tensors(m)); }

std::vector<records::ParamInfo> param_info(const NamedTensors& tensors) {
  std::vector<records::ParamInfo> out;
  for (const auto& [name, t] : tensors) {
    records::ParamInfo p;
    p.name = name;
    p.shape.assign(t.sizes().begin(), t.sizes().end());
    p.dtype = std::string(c10::toString(t.scalar_type()));
    out.push_back(std::move(p));
  }
  return out;
}

NamedTensors model_state(const TrainState& s) { return module_tensors(*s.model.module); }

int cuda_index(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) return p.is_cuda() ? static_cast<int>(p.device().index()) : -1;
  return -1;
}

rng::RngState rng_state(const TrainState& s, uint64_t seed) {
  rng::RngState r = rng::capture_torch(seed, cuda_index(*s.model.module));
  r.cursor = s.cursor;
  return r;
}

std::vector<records::ParamInfo> param_info(const TrainState& s) { return param_info(*s.model.module); }

std::map<std::string, std::string> policy_state(const TrainState& st) {
  std::map<std::string, std::string> s = st.scaler.state();
  for (auto& kv : st.skip_guard.state()) s.insert(kv);
  for (auto& kv : st.spike_guard.state()) s.insert(kv);
  std::string fired, aside;
  for (const auto& f : st.fired) fired += (fired.empty() ? "" : ",") + f;
  for (const auto& [e, b] : st.set_aside)
    aside += (aside.empty() ? "" : ",") + std::to_string(e) + ":" + std::to_string(b);
  s["faults.fired"] = fired;
  s["data.set_aside"] = aside;
  return s;
}

Digest128 policy_digest(const TrainState& st) {
  Xxh3 h;
  std::map<std::string, std::string> state = policy_state(st);
  // A crash is a process event: whether it fired says which process runs, not what it computes.
  std::string fired;
  for (const auto& f : st.fired)
    if (!is_process_fault(fault_kind_of(f))) fired += (fired.empty() ? "" : ",") + f;
  state["faults.fired"] = fired;
  for (const auto& [k, v] : state) {  // a std::map: sorted by key
    h.update_u64(k.size());
    h.update(k);
    h.update_u64(v.size());
    h.update(v);
  }
  h.update_u64(st.samples_seen);
  return h.digest();
}

void check_policy_state(const TrainState& st, const std::map<std::string, std::string>& state) {
  TrainState scratch{model::ModelHandle{}, nullptr, st.scaler, st.skip_guard, st.spike_guard};
  load_policy_state(scratch, state);
}

void load_policy_state(TrainState& st, const std::map<std::string, std::string>& state) {
  st.scaler.load_state(state);
  st.skip_guard.load_state(state);
  st.spike_guard.load_state(state);
  auto it = state.find("faults.fired");
  if (it != state.end())
    for (const auto& f : split_list(it->second)) st.fired.insert(f);
  it = state.find("data.set_aside");
  if (it != state.end())
    for (const auto& batch : parse_set_aside(it->second)) st.set_aside.insert(batch);
}

void check_model_state(const NamedTensors& model, const NamedTensors& state, const std::string& where) {
  std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
  for (const auto& [name, t] : model) {
    auto it = by_name.find(name);
    RETRACE_CHECK(it != by_name.end(), FormatError, where, ": model tensor ", name, " is missing from the checkpoint");
    const torch::Tensor& got = it->second;
    RETRACE_CHECK(got.defined() && got.sizes() == t.sizes() && got.scalar_type() == t.scalar_type(), FormatError, where,
                  ": model tensor ", name, " has shape ", got.defined() ? c10::str(got.sizes()) : "[]", " ",
                  got.defined() ? c10::toString(got.scalar_type()) : "undefined",
                  " in the checkpoint, the model expects ", t.sizes(), " ", c10::toString(t.scalar_type()));
  }
}

void load_model_state(TrainState& s, const NamedTensors& state) {
  const NamedTensors model = model_state(s);
  check_model_state(model, state, "the model state to load");
  std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : model) {
    const torch::Tensor& from = by_name.at(name);
    // A tensor a resume read in place (ckpt::load_snapshot) is this one: nothing to copy.
    if (from.is_alias_of(t) && from.data_ptr() == t.data_ptr() && from.strides() == t.strides()) continue;
    t.copy_(from);
  }
}

void set_aside_batches(TrainState& s, const data::Cursor& spike, int64_t count, uint64_t batches_per_epoch) {
  data::Cursor c = spike;
  for (int64_t i = 0; i < count; ++i) {
    s.set_aside.insert({c.epoch, c.batch_in_epoch});
    if (c.batch_in_epoch > 0) {
      c.batch_in_epoch -= 1;
    } else if (c.epoch > 0) {
      c.epoch -= 1;
      c.batch_in_epoch = batches_per_epoch - 1;
    } else {
      break;
    }
  }
}

}  // namespace retrace::train
