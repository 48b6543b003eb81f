// retrace::run_cli (include/retrace/retrace.h): the CLI over a user's registry.
#include "api/registry_impl.h"
#include "cli.h"

namespace retrace {

int run_cli(int argc, char** argv, const Registry& registry) {
  return cli::run_cli(argc, argv, registry.impl().registry);
}

}  // namespace retrace
