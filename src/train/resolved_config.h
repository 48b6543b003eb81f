// A config as a command runs it: resolved once (defaults, and on this machine its thread counts:
// environment.h's resolve_here), with the two texts and the hash every part reads, and never
// changed after. A resume onto another layout makes a new value (run.cpp's plan_reshard) instead of
// editing one. Torch-free.
#pragma once

#include <string>

#include "train/config.h"

namespace retrace::train {

struct ResolvedConfig {
  Config config;              // resolved; never changed after
  std::string complete_toml;  // to_toml(kComplete): RUN/config.toml and the trace header's config
  std::string hash;           // config_hash of to_toml(kCanonical): trace header, checkpoints, resume
};

// The texts and the hash of a config whose thread counts are already resolved (a recorded one, or
// one resolve_here gave).
ResolvedConfig resolved(Config config);

// The config hash of a canonical config text: sha256 hex. Trace headers and checkpoint manifests
// hold it; a resume loads only a checkpoint whose hash is its config's.
std::string config_hash(const std::string& canonical_toml);

}  // namespace retrace::train
