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
#include "data/token_files.h"
#include "testing/error_of.h"
#include "testing/temp_dir.h"
// The safetensors writer; this include and the alias `st` are the only places that name it.
#include "core/safetensors.h"

namespace retrace::data {
namespace {

namespace st = ::retrace::safetensors;
using testing::TempDir;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "expected \"" << (needle) << "\" in: " << (haystack)


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
  write_split(dir.file("test.safetensors"), x.slice(0, 0, 1).to(torch::kHalf), "F16",
              torch::tensor({0}, torch::kInt16), "I16");
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

// ---------------------------------------------------------------------------------------------
// llm.c token files

void put_i32(std::string& out, size_t at, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) out[at + i] = static_cast<char>((u >> (8 * i)) & 0xff);
}

// An llm.c token file; the header says `count` tokens (by default the true number).
void write_tokens(const std::string& path, const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                  int32_t version = 1, std::optional<int32_t> count = std::nullopt) {
  std::string bytes(1024, '\0');
  put_i32(bytes, 0, magic);
  put_i32(bytes, 4, version);
  put_i32(bytes, 8, count ? *count : static_cast<int32_t>(tokens.size()));
  for (uint16_t t : tokens) {
    bytes.push_back(static_cast<char>(t & 0xff));
    bytes.push_back(static_cast<char>(t >> 8));
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::vector<uint16_t> iota_tokens(int n, int start = 0) {
  std::vector<uint16_t> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<uint16_t>(start + i));
  return v;
}

TEST(TokenFiles, WindowsShiftTargetsByOne) {
  TempDir dir;
  write_tokens(dir.file("train.bin"), iota_tokens(27, 1000));  // 27 tokens / 5 = 5 windows, 2 dropped
  write_tokens(dir.file("val.bin"), iota_tokens(11, 40000));   // 2 windows, 1 dropped
  const Dataset d = load_token_files(dir.path(), /*context=*/4, /*vocab_size=*/0);
  ASSERT_EQ(d.train.inputs.sizes(), (std::vector<int64_t>{5, 4}));
  ASSERT_EQ(d.train.targets.sizes(), (std::vector<int64_t>{5, 4}));
  ASSERT_EQ(d.test.inputs.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(d.train.inputs.scalar_type(), torch::kLong);
  EXPECT_EQ(d.train.targets.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(d.train.inputs[0], torch::tensor({1000, 1001, 1002, 1003}, torch::kLong)));
  EXPECT_TRUE(torch::equal(d.train.targets[0], torch::tensor({1001, 1002, 1003, 1004}, torch::kLong)));
  EXPECT_TRUE(torch::equal(d.train.inputs[1], torch::tensor({1005, 1006, 1007, 1008}, torch::kLong)));
  EXPECT_TRUE(torch::equal(d.test.targets[1], torch::tensor({40006, 40007, 40008, 40009}, torch::kLong)));
  EXPECT_EQ(d.vocab_size, 40011);  // the largest token of both files + 1 (40010 is in the dropped tail)
  EXPECT_EQ(d.description, "llm.c token files " + dir.path() +
                               ": 5 train / 2 test windows of context 4 (27 + 11 tokens), vocabulary 40011");
  ASSERT_EQ(d.files.size(), 2u);
  EXPECT_EQ(d.files[0].path, dir.file("train.bin"));
  EXPECT_EQ(d.files[1].path, dir.file("val.bin"));
  for (const auto& f : d.files) {
    EXPECT_EQ(f.size, std::filesystem::file_size(f.path)) << f.path;
    EXPECT_EQ(f.sha256, sha256_file_hex(f.path)) << f.path;
  }
  EXPECT_EQ(d.files[0].size, 1024u + 2 * 27);

  const Dataset given = load_token_files(dir.path(), 4, 50257);
  EXPECT_EQ(given.vocab_size, 50257);
  EXPECT_TRUE(torch::equal(given.train.inputs, d.train.inputs));
}

TEST(TokenFiles, BadMagicOrVersionIsAFormatError) {
  TempDir dir;
  write_tokens(dir.file("train.bin"), iota_tokens(20), /*magic=*/20240521);
  write_tokens(dir.file("val.bin"), iota_tokens(20));
  const std::string m = testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); });
  EXPECT_CONTAINS(m, dir.file("train.bin"));
  EXPECT_CONTAINS(m, "magic) is 20240521, expected 20240520");

  write_tokens(dir.file("train.bin"), iota_tokens(20), 20240520, /*version=*/2);
  const std::string n = testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); });
  EXPECT_CONTAINS(n, "version) is 2, expected 1");
}

TEST(TokenFiles, TruncatedOrShortFilesAreFormatErrors) {
  TempDir dir;
  write_tokens(dir.file("train.bin"), iota_tokens(20));
  write_tokens(dir.file("val.bin"), iota_tokens(50), 20240520, 1, /*count=*/100);
  const std::string m = testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); });
  EXPECT_CONTAINS(m, dir.file("val.bin"));
  EXPECT_CONTAINS(m, "100 tokens, which need 1224 bytes, but the file has 1124 bytes");
  EXPECT_CONTAINS(m, "truncated");

  write_tokens(dir.file("val.bin"), iota_tokens(50), 20240520, 1, /*count=*/10);
  EXPECT_CONTAINS(testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); }), "longer than its header says");

  write_tokens(dir.file("val.bin"), iota_tokens(50), 20240520, 1, /*count=*/-5);
  EXPECT_CONTAINS(testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); }), "is -5");

  std::ofstream(dir.file("val.bin"), std::ios::binary | std::ios::trunc) << std::string(100, '\0');
  EXPECT_CONTAINS(testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); }), "is 100 bytes");
}

TEST(TokenFiles, TokenOutsideVocabularyNamesFilePositionAndToken) {
  TempDir dir;
  std::vector<uint16_t> val = iota_tokens(20);
  val[13] = 256;
  write_tokens(dir.file("train.bin"), iota_tokens(20));
  write_tokens(dir.file("val.bin"), val);
  const std::string m = testing::error_of<ConfigError>([&] { load_token_files(dir.path(), 4, 256); });
  EXPECT_CONTAINS(m, dir.file("val.bin"));
  EXPECT_CONTAINS(m, "token 256 at position 13");
  EXPECT_CONTAINS(m, "vocab_size 256");
  EXPECT_EQ(load_token_files(dir.path(), 4, 257).vocab_size, 257);
}

TEST(TokenFiles, TooFewTokensSaysHowManyAndTheContext) {
  TempDir dir;
  write_tokens(dir.file("train.bin"), iota_tokens(100));
  write_tokens(dir.file("val.bin"), iota_tokens(8));
  const std::string m = testing::error_of<ConfigError>([&] { load_token_files(dir.path(), 8, 0); });
  EXPECT_CONTAINS(m, dir.file("val.bin"));
  EXPECT_CONTAINS(m, "8 tokens");
  EXPECT_CONTAINS(m, "context 8");
  EXPECT_EQ(load_token_files(dir.path(), 7, 0).test.size(), 1);  // exactly one window of 8
}

TEST(TokenFiles, MissingFilesAndBadArgumentsAreReported) {
  EXPECT_CONTAINS(testing::error_of<IoError>([] { load_token_files("/nonexistent/retrace-tokens", 4, 0); }),
                  "/nonexistent/retrace-tokens");
  TempDir dir;
  write_tokens(dir.file("train.bin"), iota_tokens(20));
  const std::string m = testing::error_of<IoError>([&] { load_token_files(dir.path(), 4, 0); });
  EXPECT_CONTAINS(m, dir.file("val.bin"));
  EXPECT_CONTAINS(m, "train.bin and val.bin");
  write_tokens(dir.file("val.bin"), iota_tokens(20));
  EXPECT_THROW(load_token_files(dir.path(), 0, 0), ConfigError);
  EXPECT_THROW(load_token_files(dir.path(), 4, -1), ConfigError);
}

}  // namespace
}  // namespace retrace::data
