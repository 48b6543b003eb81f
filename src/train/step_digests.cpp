#include "train/step_digests.h"

#include <torch/types.h>

#include "core/digest.h"

namespace retrace::train {
namespace {

// The module a tensor belongs to: its name up to the last dot ("blocks.1.attn.weight" ->
// "blocks.1.attn"); "" for the model's own tensors.
std::string module_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

MixedEntry mixed_entry(const std::string& name, const torch::Tensor& t, Mix mix) {
  MixedEntry e;
  e.name = name;
  e.defined = t.defined();
  if (!e.defined) return e;
  e.dtype = t.scalar_type();
  e.shape.assign(t.sizes().begin(), t.sizes().end());
  e.sum = tensor_mixed_sum(t, 0, mix);
  return e;
}

std::vector<MixedEntry> mixed_entries(const NamedTensors& tensors, Mix mix) {
  std::vector<MixedEntry> out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) out.push_back(mixed_entry(name, t, mix));
  return out;
}

// Each module's share of the entries: `module(i)` is entry i's module, or `modules` for none.
template <typename ModuleOf>
std::vector<Digest128> by_module(const std::vector<MixedEntry>& entries, size_t modules, ModuleOf module) {
  std::vector<std::vector<MixedEntry>> groups(modules);
  for (size_t i = 0; i < entries.size(); ++i)
    if (const size_t m = module(i); m < modules) groups[m].push_back(entries[i]);
  std::vector<Digest128> out;
  out.reserve(modules);
  for (const auto& g : groups) out.push_back(g.empty() ? Digest128{} : digest_mixed(g));
  return out;
}

// Each tensor's mixed sum once: the whole digests and every module's share come from them.
void digest_by_module(const StepTensors& t, Mix mix, const ModuleIndex& modules, records::StepRecord& rec) {
  const NamedTensors none;
  const std::vector<MixedEntry> pe = mixed_entries(t.model, mix), ge = mixed_entries(t.grads, mix);
  const std::vector<MixedEntry> oe = mixed_entries(t.with_optimizer ? t.optim : none, mix);
  rec.param_digest = digest_mixed(pe);
  rec.grad_digest = digest_mixed(ge);
  if (t.with_optimizer) rec.optim_digest = digest_mixed(oe);
  const size_t n = modules.names.size();
  const auto tensor = [&](size_t i) { return modules.of_tensor[i]; };
  const auto entry = [&](size_t i) {
    auto it = modules.of_tensor_name.find(oe[i].name.substr(0, oe[i].name.rfind('/')));
    return it == modules.of_tensor_name.end() ? n : it->second;
  };
  const auto mp = by_module(pe, n, tensor), mg = by_module(ge, n, tensor), mo = by_module(oe, n, entry);
  for (size_t i = 0; i < n; ++i)
    rec.module_digests.push_back({modules.names[i], mp[i], mg[i], t.with_optimizer ? mo[i] : Digest128{}});
}

}  // namespace

ModuleIndex index_modules(const std::vector<records::ParamInfo>& tensors) {
  ModuleIndex x;
  std::map<std::string, size_t> seen;
  for (const records::ParamInfo& p : tensors) {
    const std::string m = module_of(p.name);
    auto [it, fresh] = seen.emplace(m, x.names.size());
    if (fresh) x.names.push_back(m);
    x.of_tensor.push_back(it->second);
    x.of_tensor_name.emplace(p.name, it->second);
  }
  return x;
}

void digest_step_tensors(const StepTensors& t, DigestKind kind, const KnownSums* known, const ModuleIndex* modules,
                         records::StepRecord& rec, StepDigestParts* parts) {
  if (is_mixed(kind) && modules) return digest_by_module(t, mix_of(kind), *modules, rec);
  // digest_named under a mixed kind equals digest_mixed of the tensors' entries (tensor_digest.h).
  rec.param_digest = digest_named(t.model, kind, known, parts ? &parts->model : nullptr);
  if (is_mixed(kind)) rec.grad_digest = digest_named(t.grads, kind, known);
  if (t.with_optimizer) rec.optim_digest = digest_named(t.optim, kind, known, parts ? &parts->optim : nullptr);
  if (parts) {
    parts->step = rec.step;
    parts->with_optimizer = t.with_optimizer;
    if (!t.with_optimizer) parts->optim.clear();
  }
}

Digest128 rng_digest(const std::string& serialized_rng) {
  return xxh3_128(serialized_rng.data(), serialized_rng.size());
}

}  // namespace retrace::train
