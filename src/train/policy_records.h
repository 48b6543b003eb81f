// The plain-text records of a step's policies that a checkpoint's shard metadata carries besides
// the guards' (guards.h) and the scaler's: the batches set aside after a rollback ("data.set_aside")
// and the faults already fired ("faults.fired"). Torch-free, so that a fuzzer can run them on any
// text (tools/fuzz/policy_fuzzer.cpp); train/state.cpp reads a checkpoint's with them.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/text_list.h"  // split_list: the fired faults are a plain comma-separated list

namespace retrace::train {

// "EPOCH:BATCH,EPOCH:BATCH,...": each entry two decimal numbers (parse_number.h). FormatError naming
// the entry and what is wrong with it otherwise.
std::set<std::pair<uint64_t, uint64_t>> parse_set_aside(const std::string& text);

}  // namespace retrace::train
