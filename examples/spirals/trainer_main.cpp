// spirals_trainer: retrace's whole CLI over this project's model, data set and loss.
//   spirals_trainer record --config spirals.toml --out run
//   spirals_trainer resume run; spirals_trainer replay run; spirals_trainer bisect run other
#include "spirals.h"

int main(int argc, char** argv) { return retrace::run_cli(argc, argv, spirals::registry()); }
