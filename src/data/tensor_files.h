// A data set a user brings as tensors: a directory of two safetensors files.
//
//   DIR/train.safetensors   the training split
//   DIR/test.safetensors    the test split
//
// Each file holds exactly two tensors (any "__metadata__" is ignored):
//   "inputs"   [N, ...]  F64 F32 F16 BF16 -> float32 (features, pixels)
//                        I64 I32 I16 I8 U8 -> int64 (token ids; note that U8 images become int64
//                        too, so convert images to float before saving them)
//   "targets"  [N] or [N, ...]  I64 I32 I16 I8 U8 -> int64: class indices, or for a language
//                        model [N, context] next tokens (inputs shifted by one)
// N, the samples along dimension 0, must agree within a file. Between the two files the
// per-sample shapes (the dims after the first) of inputs and of targets must agree, and so must
// the stored dtype of the inputs. The test split may be empty, the training split may not.
// Files are read whole into memory; the host must be little-endian, like safetensors.
//
// vocab_size (the classes of the targets) is max(target) + 1 over both splits; for targets of
// rank >= 2 with integer inputs (a token model) it also covers max(input) + 1, since the inputs
// index the same embedding. Negative targets (or token inputs) are a ConfigError.
//
// Writing such a directory from Python (pip install safetensors torch):
//
//   import torch, safetensors.torch
//   x, y = torch.randn(512, 64), torch.randint(0, 2, (512,))
//   safetensors.torch.save_file({"inputs": x, "targets": y}, "DIR/train.safetensors")
//   x, y = torch.randn(128, 64), torch.randint(0, 2, (128,))
//   safetensors.torch.save_file({"inputs": x, "targets": y}, "DIR/test.safetensors")
//
// (tools/data/write_tensors.py writes one from numpy, with or without the safetensors package.)
#pragma once

#include <string>

#include "data/dataset.h"

namespace retrace::data {

inline constexpr const char* kTensorTrainFile = "train.safetensors";
inline constexpr const char* kTensorTestFile = "test.safetensors";

// Reads DIR/train.safetensors and DIR/test.safetensors (see above). Throws
//   IoError      DIR missing or not a directory; a split file missing or unreadable (the message
//                names it and the expected layout);
//   FormatError  a file that is not valid safetensors; tensor names other than exactly {inputs,
//                targets} (the message lists what was found); a rank-0 tensor; a dtype that is not
//                allowed (float targets, BOOL);
//   ConfigError  inputs and targets with different sample counts (file and both counts); train and
//                test with a different per-sample shape or dtype; an empty training split; a
//                negative target.
// files: the two files with size and sha256. description: "tensor files DIR: N train / M test
// samples, inputs [shape...] dtype, K classes".
Dataset load_tensor_dir(const std::string& dir);

}  // namespace retrace::data
