#include "train/resolved_config.h"

#include <utility>

#include "core/digest.h"

namespace retrace::train {

std::string config_hash(const std::string& canonical_toml) {
  return sha256_hex(canonical_toml.data(), canonical_toml.size());
}

ResolvedConfig resolved(Config config) {
  ResolvedConfig r;
  r.complete_toml = to_toml(config, TomlForm::kComplete);
  r.hash = config_hash(to_toml(config, TomlForm::kCanonical));
  r.config = std::move(config);
  return r;
}

}  // namespace retrace::train
