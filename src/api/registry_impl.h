// The public Registry (include/retrace/retrace.h) over the internal one (train/registry.h): what
// the CLI needs to run a user's components.
#pragma once

#include "retrace/retrace.h"
#include "train/registry.h"

namespace retrace {

struct Registry::Impl {
  train::Registry registry = train::Registry::builtin();
};

}  // namespace retrace
