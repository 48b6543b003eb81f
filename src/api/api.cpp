// The public API's Options and Registry: users' factories adapted to the internal registry.
#include <toml++/toml.h>
#include <torch/torch.h>

#include <filesystem>

#include "api/registry_impl.h"
#include "core/digest.h"
#include "core/error.h"

namespace retrace {
namespace {

std::optional<toml::table> parse_value(const std::string& text) {
  try {
    return toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

template <typename T>
T get(const std::map<std::string, std::string>& values, const std::string& key, T fallback, const char* type) {
  auto it = values.find(key);
  if (it == values.end()) return fallback;
  auto table = parse_value(it->second);
  std::optional<T> v = table ? table->get("v")->value<T>() : std::nullopt;
  if constexpr (std::is_same_v<T, int64_t>) {
    if (table && !table->get("v")->is_integer()) v.reset();
  }
  RETRACE_CHECK(v.has_value(), ConfigError, "bad value for user.", key, ": expected ", type, ", found ", it->second);
  return *v;
}

int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace

int64_t Options::get_int(const std::string& key, int64_t fallback) const {
  return get<int64_t>(values_, key, fallback, "an integer");
}
double Options::get_float(const std::string& key, double fallback) const {
  return get<double>(values_, key, fallback, "a number");
}
bool Options::get_bool(const std::string& key, bool fallback) const {
  return get<bool>(values_, key, fallback, "true or false");
}
std::string Options::get_string(const std::string& key, const std::string& fallback) const {
  return get<std::string>(values_, key, fallback, "a string");
}

Registry::Registry() : impl_(std::make_unique<Impl>()) {}
Registry::~Registry() = default;
Registry::Registry(Registry&&) noexcept = default;
Registry& Registry::operator=(Registry&&) noexcept = default;

Registry& Registry::add_model(const std::string& kind, ModelFactory factory) {
  RETRACE_CHECK(static_cast<bool>(factory), ConfigError, "cannot register model \"", kind, "\": the factory is empty");
  impl_->registry.add_model(kind, [factory, kind](const train::ModelContext& ctx) {
    const Options options(ctx.config.user);
    const torch::Tensor in = ctx.data.train.range(0, std::min<int64_t>(1, ctx.data.train.size())).inputs;
    ModelContext mc{options, std::vector<int64_t>(in.sizes().begin() + 1, in.sizes().end()), ctx.data.vocab_size, kind};
    Model m = factory(mc);
    RETRACE_CHECK(m.module != nullptr, ConfigError, "the factory of model.kind = \"", kind, "\" returned no module");
    RETRACE_CHECK(static_cast<bool>(m.forward), ConfigError, "the factory of model.kind = \"", kind,
                  "\" returned no forward function (retrace::model_of(holder) makes one)");
    const std::string description = m.description.empty()
                                        ? kind + " (" + m.module->name() + ", " +
                                              std::to_string(parameter_count(*m.module)) + " parameters)"
                                        : m.description;
    return model::ModelHandle{m.module, m.forward, description, nullptr, {}, {}};
  });
  return *this;
}

Registry& Registry::add_data(const std::string& kind, DataFactory factory) {
  RETRACE_CHECK(static_cast<bool>(factory), ConfigError, "cannot register data set \"", kind,
                "\": the factory is empty");
  impl_->registry.add_data(kind, [factory, kind](const train::Config& c) {
    const Options options(c.user);
    Dataset d = factory(DataContext{options, c.data.dir, c.data.context, kind});
    RETRACE_CHECK(d.train.inputs.defined() && d.train.targets.defined(), ConfigError, "data.kind = \"", kind, "\" (",
                  c.data.dir, ") returned no training inputs or targets");
    RETRACE_CHECK(d.train.inputs.dim() >= 1 && d.train.targets.dim() >= 1 &&
                      d.train.inputs.size(0) == d.train.targets.size(0),
                  ConfigError, "data.kind = \"", kind, "\" (", c.data.dir, "): the training split has ",
                  d.train.inputs.dim() ? d.train.inputs.size(0) : 0, " inputs but ",
                  d.train.targets.dim() ? d.train.targets.size(0) : 0,
                  " targets; every sample needs both (samples are indexed along dimension 0)");
    data::Dataset out;
    out.train = {d.train.inputs.contiguous(), d.train.targets.contiguous()};
    if (d.test.inputs.defined()) out.test = {d.test.inputs.contiguous(), d.test.targets.contiguous()};
    for (const auto& path : d.files) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(path, ec);
      RETRACE_CHECK(!ec, IoError, "data.kind = \"", kind, "\" names data file ", path,
                    ", which cannot be read: ", ec.message());
      out.files.push_back({path, static_cast<uint64_t>(size), sha256_file_hex(path)});
    }
    out.description = d.description.empty() ? kind + " " + c.data.dir : d.description;
    out.vocab_size = d.classes;
    return out;
  });
  return *this;
}

Registry& Registry::add_loss(const std::string& name, Loss loss) {
  RETRACE_CHECK(static_cast<bool>(loss), ConfigError, "cannot register loss \"", name, "\": it is empty");
  impl_->registry.add_loss(name, loss);
  return *this;
}

}  // namespace retrace
