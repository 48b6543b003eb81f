// The main of the test executables that train: portable numerics, as in a retrace run. OpenBLAS
// picks its kernel when the library loads, so the executable re-executes itself once with the
// pins in its environment (train/numerics.h); a pin the environment already sets is kept.
#include <gtest/gtest.h>

#include "train/numerics.h"

int main(int argc, char** argv) {
  retrace::train::prepare_process(retrace::train::Numerics::kPortable, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
