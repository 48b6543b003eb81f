// The retrace binary: the CLI (cli.h) over the built-in models, data sets and losses. A user's own
// binary does the same with its own registry (include/retrace/retrace.h). Declared here rather than
// included (cli.h brings CLI11, registry.h LibTorch), so this one line compiles in a second.
namespace retrace::train {
class Registry;
const Registry& builtin_registry();
}  // namespace retrace::train
namespace retrace::cli {
int run_cli(int argc, char** argv, const train::Registry& registry);
}  // namespace retrace::cli

int main(int argc, char** argv) { return retrace::cli::run_cli(argc, argv, retrace::train::builtin_registry()); }
