// The retrace binary: the CLI (cli.h) over the built-in models, data sets and losses. A user's own
// binary does the same with its own registry (include/retrace/retrace.h).
#include "cli.h"
#include "train/registry.h"

int main(int argc, char** argv) { return retrace::cli::run_cli(argc, argv, retrace::train::builtin_registry()); }
