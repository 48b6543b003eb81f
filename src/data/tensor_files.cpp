#include "data/tensor_files.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>
#include <system_error>
#include <vector>

#include "core/digest.h"
#include "core/error.h"
#include "records/records.h"
// The safetensors parser (formerly ckpt/shard.h). This include and the alias `st` below are the
// only places that name it.
#include "core/safetensors.h"
#include "core/safetensors_torch.h"

namespace retrace::data {
namespace {

namespace fs = std::filesystem;
namespace st = ::retrace::safetensors;

constexpr const char* kLayout =
    "expected a directory holding train.safetensors and test.safetensors, each with exactly the tensors "
    "\"inputs\" [N, ...] (float or integer) and \"targets\" [N] (integer class indices) or [N, context] "
    "(integer next tokens); tools/data/write_tensors.py shows how to write one";

bool is_integer_dtype(const std::string& d) { return d == "I64" || d == "I32" || d == "I16" || d == "I8" || d == "U8"; }
bool is_float_dtype(const std::string& d) { return d == "F64" || d == "F32" || d == "F16" || d == "BF16"; }

torch::ScalarType scalar_type_of(const std::string& d) {
  auto t = st::torch_type(d);
  RETRACE_CHECK(t.has_value(), InvariantError, "safetensors dtype ", d, " has no torch scalar type");
  return *t;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

std::vector<int64_t> sample_shape(const std::vector<int64_t>& shape) {
  return std::vector<int64_t>(shape.begin() + 1, shape.end());
}

// The tensor's bytes copied into a tensor of their own dtype (the shard's bytes need not be aligned
// for it), then converted to `out`.
torch::Tensor to_tensor(const st::ShardData& shard, const st::TensorEntry& e, torch::ScalarType out) {
  torch::Tensor raw = torch::empty(e.shape, torch::TensorOptions().dtype(scalar_type_of(e.dtype)));
  RETRACE_CHECK(static_cast<uint64_t>(raw.nbytes()) == e.nbytes, InvariantError, "tensor \"", e.name, "\" of ",
                shard.source, ": ", e.nbytes, " bytes for shape ", shape_text(e.shape), " ", e.dtype);
  if (e.nbytes > 0) std::memcpy(raw.data_ptr(), shard.data(e), e.nbytes);
  return raw.scalar_type() == out ? raw : raw.to(out);
}

struct LoadedSplit {
  Split split;
  std::string path;
  std::string inputs_dtype;  // as stored
  std::vector<int64_t> inputs_shape;
  std::vector<int64_t> targets_shape;
};

LoadedSplit load_split(const fs::path& dir, const char* name, std::vector<records::FileInfo>& files) {
  LoadedSplit out;
  out.path = (dir / name).string();
  std::error_code ec;
  RETRACE_CHECK(fs::is_regular_file(out.path, ec), IoError, "tensor data set file missing: ", out.path, "; ", kLayout);
  st::ShardData shard = st::read_shard(out.path);

  std::set<std::string> names;
  for (const st::TensorEntry& e : shard.tensors) names.insert(e.name);
  if (names != std::set<std::string>{"inputs", "targets"}) {
    std::ostringstream found;
    for (const std::string& n : names) found << (found.tellp() > 0 ? ", " : "") << '"' << n << '"';
    RETRACE_FAIL(FormatError, "tensor data set file ", out.path, " holds the tensors ",
                 names.empty() ? std::string("(none)") : found.str(),
                 "; expected exactly \"inputs\" and \"targets\" (rename them when saving; ", kLayout, ")");
  }
  const st::TensorEntry& inputs = *shard.find("inputs");
  const st::TensorEntry& targets = *shard.find("targets");
  for (const st::TensorEntry* e : {&inputs, &targets}) {
    RETRACE_CHECK(!e->shape.empty(), FormatError, "tensor data set file ", out.path, ", tensor \"", e->name,
                  "\": is a scalar (shape []); expected samples along dimension 0, [N, ...]");
  }
  RETRACE_CHECK(is_integer_dtype(targets.dtype), FormatError, "tensor data set file ", out.path,
                ", tensor \"targets\": dtype ", targets.dtype,
                "; expected an integer dtype (I64 I32 I16 I8 U8) holding class indices or token ids");
  RETRACE_CHECK(is_integer_dtype(inputs.dtype) || is_float_dtype(inputs.dtype), FormatError, "tensor data set file ",
                out.path, ", tensor \"inputs\": dtype ", inputs.dtype,
                "; expected a float dtype (F64 F32 F16 BF16) or an integer dtype for token ids (I64 I32 I16 I8 U8)");
  RETRACE_CHECK(inputs.shape[0] == targets.shape[0], ConfigError, "tensor data set file ", out.path, ": \"inputs\" ",
                shape_text(inputs.shape), " holds ", inputs.shape[0], " samples but \"targets\" ",
                shape_text(targets.shape), " holds ", targets.shape[0],
                "; dimension 0 must count the same samples in both");

  out.inputs_dtype = inputs.dtype;
  out.inputs_shape = inputs.shape;
  out.targets_shape = targets.shape;
  out.split.inputs = to_tensor(shard, inputs, is_float_dtype(inputs.dtype) ? torch::kFloat32 : torch::kInt64);
  out.split.targets = to_tensor(shard, targets, torch::kInt64);

  records::FileInfo info;
  info.path = out.path;
  info.size = shard.bytes.size();
  info.sha256 = sha256_hex(shard.bytes.data(), shard.bytes.size());  // the very bytes parsed
  files.push_back(std::move(info));
  return out;
}

// max + 1 of a contiguous int64 tensor, 0 when empty; ConfigError naming the sample of a negative.
int64_t max_plus_one(const torch::Tensor& t, const std::string& path, const char* name) {
  const torch::Tensor c = t.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  const int64_t n = c.numel();
  const int64_t per_sample = c.size(0) > 0 ? n / c.size(0) : 1;
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    RETRACE_CHECK(p[i] >= 0, ConfigError, "tensor data set file ", path, ", tensor \"", name, "\": sample ",
                  i / per_sample, " holds ", p[i], "; expected class indices or token ids >= 0");
    best = std::max(best, p[i]);
  }
  RETRACE_CHECK(best < std::numeric_limits<int64_t>::max(), ConfigError, "tensor data set file ", path, ", tensor \"",
                name, "\": value ", best, " is too large for a class index");
  return best + 1;
}

}  // namespace

Dataset load_tensor_dir(const std::string& dir) {
  std::error_code ec;
  RETRACE_CHECK(fs::exists(dir, ec), IoError, "tensor data set directory not found: ", dir, "; ", kLayout);
  RETRACE_CHECK(fs::is_directory(dir, ec), IoError, "tensor data set ", dir, " is not a directory; ", kLayout);

  Dataset d;
  LoadedSplit train = load_split(dir, kTensorTrainFile, d.files);
  LoadedSplit test = load_split(dir, kTensorTestFile, d.files);

  RETRACE_CHECK(train.inputs_dtype == test.inputs_dtype, ConfigError, "tensor data set ", dir, ": \"inputs\" are ",
                train.inputs_dtype, " in ", train.path, " but ", test.inputs_dtype, " in ", test.path,
                "; save both splits with the same dtype");
  RETRACE_CHECK(sample_shape(train.inputs_shape) == sample_shape(test.inputs_shape), ConfigError, "tensor data set ",
                dir, ": per-sample shape of \"inputs\" is ", shape_text(sample_shape(train.inputs_shape)), " in ",
                train.path, " (", shape_text(train.inputs_shape), ") but ", shape_text(sample_shape(test.inputs_shape)),
                " in ", test.path, " (", shape_text(test.inputs_shape),
                "); both splits must have the same shape after dimension 0");
  RETRACE_CHECK(sample_shape(train.targets_shape) == sample_shape(test.targets_shape), ConfigError, "tensor data set ",
                dir, ": per-sample shape of \"targets\" is ", shape_text(sample_shape(train.targets_shape)), " in ",
                train.path, " (", shape_text(train.targets_shape), ") but ",
                shape_text(sample_shape(test.targets_shape)), " in ", test.path, " (", shape_text(test.targets_shape),
                "); both splits must have the same shape after dimension 0");
  RETRACE_CHECK(train.split.size() > 0, ConfigError, "tensor data set file ", train.path,
                " holds 0 samples; the training split needs at least one");

  const bool classification = train.targets_shape.size() == 1;
  int64_t vocab = std::max(max_plus_one(train.split.targets, train.path, "targets"),
                           max_plus_one(test.split.targets, test.path, "targets"));
  if (!classification && is_integer_dtype(train.inputs_dtype)) {
    vocab = std::max({vocab, max_plus_one(train.split.inputs, train.path, "inputs"),
                      max_plus_one(test.split.inputs, test.path, "inputs")});
  }
  d.vocab_size = vocab;

  const std::string stored = train.inputs_dtype;
  const std::string converted = is_float_dtype(stored) ? "float32" : "int64";
  std::ostringstream desc;
  desc << "tensor files " << dir << ": " << train.split.size() << " train / " << test.split.size()
       << " test samples, inputs " << shape_text(sample_shape(train.inputs_shape)) << " " << converted;
  if (stored != "F32" && stored != "I64") desc << " (stored " << stored << ")";
  if (classification) desc << ", " << vocab << " classes";
  else desc << ", targets " << shape_text(sample_shape(train.targets_shape)) << ", vocabulary " << vocab;
  d.description = desc.str();
  d.train = std::move(train.split);
  d.test = std::move(test.split);
  return d;
}

}  // namespace retrace::data
