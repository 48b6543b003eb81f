// Data sets from a user's files: tensor directories (safetensors) and llm.c token files. Every
// fixture is written here, in a temporary directory.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/digest.h"
#include "core/error.h"
#include "data/tensor_files.h"
#include "testing/error_of.h"
#include "testing/temp_dir.h"
// The safetensors writer; this include and the alias `st` are the only places that name it.
#include "core/safetensors.h"

namespace retrace::data {
namespace {

namespace st = ::retrace::safetensors;
using testing::TempDir;

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected \"" << (needle) << "\" in: " << (haystack)

// ---------------------------------------------------------------------------------------------
// Tensor directories

struct Named {
  std::string name;
  std::string dtype;  // safetensors dtype of t
  torch::Tensor t;
};

void write_safetensors(const std::string& path, const std::vector<Named>& tensors) {
  std::vector<torch::Tensor> keep;
  std::vector<st::TensorView> views;
  for (const Named& n : tensors) {
    keep.push_back(n.t.contiguous());
    const torch::Tensor& c = keep.back();
    views.push_back({n.name, n.dtype, c.sizes().vec(), c.data_ptr(), static_cast<uint64_t>(c.nbytes())});
  }
  st::write_shard(path, {}, views);
}

void write_split(const std::string& path, const torch::Tensor& inputs, const std::string& inputs_dtype,
                 const torch::Tensor& targets, const std::string& targets_dtype) {
  write_safetensors(path, {{"inputs", inputs_dtype, inputs}, {"targets", targets_dtype, targets}});
}

// A valid classification directory: 6 train / 3 test samples of 4 float32 features.
void write_blobs(const TempDir& dir) {
  write_split(dir.file("train.safetensors"), torch::arange(24, torch::kFloat32).reshape({6, 4}), "F32",
              torch::tensor({0, 1, 2, 0, 1, 2}, torch::kInt32), "I32");
  write_split(dir.file("test.safetensors"), torch::arange(12, torch::kFloat32).reshape({3, 4}).neg(), "F32",
              torch::tensor({4, 0, 1}, torch::kInt64), "I64");
}

TEST(TensorFiles, LoadsClassificationSplits) {
  TempDir dir;
  write_blobs(dir);
  const Dataset d = load_tensor_dir(dir.path());
  ASSERT_EQ(d.train.inputs.sizes(), (std::vector<int64_t>{6, 4}));
  ASSERT_EQ(d.test.inputs.sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(d.train.inputs.scalar_type(), torch::kFloat32);
  EXPECT_EQ(d.train.targets.scalar_type(), torch::kInt64);
  EXPECT_EQ(d.test.targets.scalar_type(), torch::kInt64);
  EXPECT_EQ(d.train.size(), 6);
  EXPECT_EQ(d.test.size(), 3);
  EXPECT_TRUE(torch::equal(d.train.inputs, torch::arange(24, torch::kFloat32).reshape({6, 4})));
  EXPECT_TRUE(torch::equal(d.test.inputs, torch::arange(12, torch::kFloat32).reshape({3, 4}).neg()));
  EXPECT_TRUE(torch::equal(d.train.targets, torch::tensor({0, 1, 2, 0, 1, 2}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(d.test.targets, torch::tensor({4, 0, 1}, torch::kInt64)));
  EXPECT_EQ(d.vocab_size, 5);  // max target over both splits + 1
  EXPECT_EQ(d.description, "tensor files " + dir.path() + ": 6 train / 3 test samples, inputs [4] float32, 5 classes");
  ASSERT_EQ(d.files.size(), 2u);
  EXPECT_EQ(d.files[0].path, dir.file("train.safetensors"));
  EXPECT_EQ(d.files[1].path, dir.file("test.safetensors"));
  for (const auto& f : d.files) {
    EXPECT_EQ(f.size, std::filesystem::file_size(f.path)) << f.path;
    EXPECT_EQ(f.sha256, sha256_file_hex(f.path)) << f.path;
    EXPECT_EQ(f.sha256.size(), 64u);
  }
}

TEST(TensorFiles, ConvertsFloatDtypesToFloat32) {
  TempDir dir;
  const torch::Tensor x = torch::tensor({0.5f, -1.25f, 2.0f, 3.5f, 0.0f, 1.0f}).reshape({3, 1, 2});
  write_split(dir.file("train.safetensors"), x.to(torch::kHalf), "F16", torch::tensor({1, 0, 1}, torch::kUInt8), "U8");
  write_split(dir.file("test.safetensors"), x.slice(0, 0, 1).to(torch::kHalf), "F16", torch::tensor({0}, torch::kInt16),
              "I16");
  const Dataset d = load_tensor_dir(dir.path());
  EXPECT_EQ(d.train.inputs.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(d.train.inputs, x));  // these values are exact in float16
  EXPECT_EQ(d.train.targets.scalar_type(), torch::kInt64);
  EXPECT_EQ(d.vocab_size, 2);
  EXPECT_CONTAINS(d.description, "inputs [1, 2] float32 (stored F16), 2 classes");

  TempDir f64;
  write_split(f64.file("train.safetensors"), x.to(torch::kDouble), "F64", torch::tensor({0, 0, 0}, torch::kInt8), "I8");
  write_split(f64.file("test.safetensors"), x.to(torch::kDouble), "F64", torch::tensor({0, 0, 0}, torch::kInt8), "I8");
  const Dataset e = load_tensor_dir(f64.path());
  EXPECT_EQ(e.train.inputs.scalar_type(), torch::kFloat32);
  EXPECT_EQ(e.vocab_size, 1);
}

TEST(TensorFiles, IntegerInputsStayTokens) {
  TempDir dir;
  // A language-model layout: inputs and targets [N, context], targets shifted by one.
  const torch::Tensor stream = torch::tensor({3, 1, 4, 11, 5, 9, 2, 6, 5, 3, 5, 8}, torch::kInt32);
  const torch::Tensor windows = stream.reshape({4, 3});
  write_split(dir.file("train.safetensors"), windows.slice(1, 0, 2), "I32", windows.slice(1, 1, 3), "I32");
  write_split(dir.file("test.safetensors"), windows.slice(0, 0, 1).slice(1, 0, 2), "I32",
              windows.slice(0, 0, 1).slice(1, 1, 3), "I32");
  const Dataset d = load_tensor_dir(dir.path());
  EXPECT_EQ(d.train.inputs.scalar_type(), torch::kInt64);
  EXPECT_EQ(d.train.targets.scalar_type(), torch::kInt64);
  ASSERT_EQ(d.train.inputs.sizes(), (std::vector<int64_t>{4, 2}));
  ASSERT_EQ(d.train.targets.sizes(), (std::vector<int64_t>{4, 2}));
  EXPECT_TRUE(torch::equal(d.train.inputs, windows.slice(1, 0, 2).to(torch::kLong)));
  // Targets reach 9; token 11 (window 1) is only an input, and counts: the inputs index the same
  // embedding.
  EXPECT_EQ(d.vocab_size, 12);
  EXPECT_CONTAINS(d.description, "inputs [2] int64 (stored I32), targets [2], vocabulary 12");
}

TEST(TensorFiles, MismatchedSampleCountsNameFileAndCounts) {
  TempDir dir;
  write_blobs(dir);
  write_split(dir.file("test.safetensors"), torch::zeros({3, 4}), "F32", torch::zeros({2}, torch::kLong), "I64");
  const std::string m = testing::error_of<ConfigError>([&] { load_tensor_dir(dir.path()); });
  EXPECT_CONTAINS(m, dir.file("test.safetensors"));
  EXPECT_CONTAINS(m, "3 samples");
  EXPECT_CONTAINS(m, "holds 2");
}

TEST(TensorFiles, MissingDirectoryOrFileIsAnIoError) {
  const std::string m = testing::error_of<IoError>([] { load_tensor_dir("/nonexistent/retrace-tensors"); });
  EXPECT_CONTAINS(m, "/nonexistent/retrace-tensors");

  TempDir dir;
  write_blobs(dir);
  std::filesystem::remove(dir.file("test.safetensors"));
  const std::string n = testing::error_of<IoError>([&] { load_tensor_dir(dir.path()); });
  EXPECT_CONTAINS(n, dir.file("test.safetensors"));
  EXPECT_CONTAINS(n, "train.safetensors and test.safetensors");
  EXPECT_CONTAINS(n, "\"inputs\"");

  TempDir file_not_dir;
  write_blobs(file_not_dir);
  EXPECT_THROW(load_tensor_dir(file_not_dir.file("train.safetensors")), IoError);
}

TEST(TensorFiles, WrongTensorNamesListWhatWasFound) {
  TempDir dir;
  write_blobs(dir);
  write_safetensors(dir.file("train.safetensors"),
                    {{"x", "F32", torch::zeros({6, 4})}, {"y", "I64", torch::zeros({6}, torch::kLong)}});
  const std::string m = testing::error_of<FormatError>([&] { load_tensor_dir(dir.path()); });
  EXPECT_CONTAINS(m, dir.file("train.safetensors"));
  EXPECT_CONTAINS(m, "\"x\", \"y\"");
  EXPECT_CONTAINS(m, "expected exactly \"inputs\" and \"targets\"");

  // One tensor too many is as wrong as a wrong name.
  write_safetensors(dir.file("train.safetensors"), {{"inputs", "F32", torch::zeros({6, 4})},
                                                    {"targets", "I64", torch::zeros({6}, torch::kLong)},
                                                    {"weights", "F32", torch::zeros({6})}});
  EXPECT_CONTAINS(testing::error_of<FormatError>([&] { load_tensor_dir(dir.path()); }), "\"weights\"");
}

TEST(TensorFiles, ScalarsFloatTargetsAndCorruptFilesAreFormatErrors) {
  TempDir dir;
  write_blobs(dir);
  write_split(dir.file("train.safetensors"), torch::zeros({6, 4}), "F32", torch::tensor(1, torch::kLong), "I64");
  EXPECT_CONTAINS(testing::error_of<FormatError>([&] { load_tensor_dir(dir.path()); }), "scalar");

  write_split(dir.file("train.safetensors"), torch::zeros({6, 4}), "F32", torch::zeros({6}), "F32");
  const std::string m = testing::error_of<FormatError>([&] { load_tensor_dir(dir.path()); });
  EXPECT_CONTAINS(m, "\"targets\": dtype F32");
  EXPECT_CONTAINS(m, "integer");

  write_split(dir.file("train.safetensors"), torch::zeros({6, 4}, torch::kBool), "BOOL",
              torch::zeros({6}, torch::kLong), "I64");
  EXPECT_CONTAINS(testing::error_of<FormatError>([&] { load_tensor_dir(dir.path()); }), "dtype BOOL");

  std::ofstream(dir.file("train.safetensors"), std::ios::binary | std::ios::trunc) << "not a safetensors file";
  EXPECT_CONTAINS(testing::error_of<FormatError>([&] { load_tensor_dir(dir.path()); }), dir.file("train.safetensors"));
}

TEST(TensorFiles, SplitsMustAgreeOnShapeAndDtype) {
  TempDir dir;
  write_blobs(dir);
  write_split(dir.file("test.safetensors"), torch::zeros({3, 5}), "F32", torch::zeros({3}, torch::kLong), "I64");
  const std::string m = testing::error_of<ConfigError>([&] { load_tensor_dir(dir.path()); });
  EXPECT_CONTAINS(m, "[4]");
  EXPECT_CONTAINS(m, "[5]");

  write_split(dir.file("test.safetensors"), torch::zeros({3, 4}, torch::kDouble), "F64",
              torch::zeros({3}, torch::kLong), "I64");
  const std::string n = testing::error_of<ConfigError>([&] { load_tensor_dir(dir.path()); });
  EXPECT_CONTAINS(n, "F32");
  EXPECT_CONTAINS(n, "F64");
}

TEST(TensorFiles, NegativeTargetIsAConfigError) {
  TempDir dir;
  write_blobs(dir);
  write_split(dir.file("test.safetensors"), torch::zeros({3, 4}), "F32", torch::tensor({0, -1, 1}, torch::kInt64),
              "I64");
  const std::string m = testing::error_of<ConfigError>([&] { load_tensor_dir(dir.path()); });
  EXPECT_CONTAINS(m, dir.file("test.safetensors"));
  EXPECT_CONTAINS(m, "sample 1 holds -1");
}

TEST(TensorFiles, EmptyTrainSplitIsAConfigError) {
  TempDir dir;
  write_blobs(dir);
  write_split(dir.file("train.safetensors"), torch::zeros({0, 4}), "F32", torch::zeros({0}, torch::kLong), "I64");
  EXPECT_CONTAINS(testing::error_of<ConfigError>([&] { load_tensor_dir(dir.path()); }), "0 samples");
}

}  // namespace
}  // namespace retrace::data
