#include "cli.h"

#include <cstdio>
#include <filesystem>
#include <optional>

#include "common.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/verify.h"
#include "core/error.h"

namespace retrace::cli {
namespace {

namespace sfs = std::filesystem;

constexpr const char* kModelPrefix = "model/";

bool is_model(const std::string& name) { return name.rfind(kModelPrefix, 0) == 0; }

// A checkpoint's model: views of the bytes read (rank 0's shard, or the gathered pieces).
struct Model {
  std::string dir;  // the checkpoint read
  ckpt::Manifest manifest;
  std::optional<ckpt::ShardData> shard;     // ckpt.v1 and older: rank 0's shard holds the model
  std::vector<std::vector<char>> gathered;  // ckpt.v2: the model's tensors gathered from their pieces
  std::vector<safetensors::TensorView> views;
  std::string source;
};

// Reads the model of checkpoint `dir` into `out`, verifying every shard once: a shard this reads
// is hashed in the same pass, the others by verify_checkpoint.
void read_model(const std::string& dir, Model& out) {
  out = Model();
  out.dir = dir;
  out.source = dir;
  const size_t prefix = std::char_traits<char>::length(kModelPrefix);
  if (ckpt::read_checked_manifest(dir, std::nullopt).tensors.empty()) {
    // Data parallelism keeps every rank's parameters equal and each shard of these checkpoints
    // holds its rank's whole state: rank 0's model is the model.
    out.manifest = ckpt::verify_checkpoint(dir, std::nullopt, 0u);
    out.shard.emplace(ckpt::load_shard(dir, out.manifest, 0, /*check_digest=*/true));
    out.source = out.shard->source;
    for (const auto& e : out.shard->tensors)
      if (is_model(e.name))
        out.views.push_back({e.name.substr(prefix), e.dtype, e.shape, out.shard->data(e), e.nbytes});
  } else {
    out.manifest = ckpt::verify_checkpoint(dir, std::nullopt, ckpt::kEveryShard);
    out.gathered = ckpt::gather_pieces(dir, out.manifest, [](const ckpt::TensorLayout& t) { return is_model(t.name); });
    for (size_t i = 0; i < out.manifest.tensors.size(); ++i) {
      const ckpt::TensorLayout& t = out.manifest.tensors[i];
      if (is_model(t.name))
        out.views.push_back({t.name.substr(prefix), t.dtype, t.shape, out.gathered[i].data(), out.gathered[i].size()});
    }
  }
  RETRACE_CHECK(!out.views.empty(), FormatError, "retrace weights: ", out.source, " holds no model tensors (no \"",
                kModelPrefix, "\" entries); is it a retrace checkpoint?");
}

// CKPT as the user named it: a step directory (it holds manifest.json, which must verify), or a
// run directory or checkpoints root, whose newest checkpoint that reads is taken.
void pick_and_read(const std::string& path, Model& model) {
  std::error_code ec;
  RETRACE_CHECK(sfs::is_directory(path, ec), IoError, "retrace weights: ", path,
                " is not a directory; name a checkpoint (run/checkpoints/step-00000010), a run directory or its "
                "checkpoints directory");
  if (sfs::exists(sfs::path(path) / ckpt::kManifestFile, ec) ||
      ckpt::parse_step_dir_name(sfs::path(path).filename().string()))
    return read_model(path, model);
  const sfs::path root = sfs::is_directory(sfs::path(path) / "checkpoints", ec) ? sfs::path(path) / "checkpoints"
                                                                                : sfs::path(path);
  std::vector<std::pair<std::string, std::string>> skipped;
  auto pick = ckpt::newest_step_dir_that(
      root.string(), [&model](const std::string& dir) { return read_model(dir, model), true; }, skipped);
  if (!pick) {
    std::string why;
    for (const auto& [dir, reason] : skipped) why += "\n  " + dir + ": " + reason;
    if (skipped.empty())
      RETRACE_FAIL(IoError, "retrace weights: no checkpoint in ", root.string(),
                   " (a run writes them with checkpoint.every_steps or --checkpoint-at)");
    RETRACE_FAIL(IntegrityError, "retrace weights: no checkpoint in ", root.string(), " verifies:", why);
  }
  for (const auto& [dir, reason] : skipped)
    std::fprintf(stderr, "retrace weights: skipped %s: %s\n", dir.c_str(), reason.c_str());
}

}  // namespace

void add_weights(CLI::App& app, WeightsArgs& args) {
  auto* w = app.add_subcommand("weights", "write a checkpoint's model as one safetensors file for PyTorch");
  w->add_option("ckpt", args.ckpt,
                "checkpoint directory (run/checkpoints/step-00000010), or a run directory or checkpoints "
                "directory, whose newest checkpoint that verifies is taken")
      ->required();
  w->add_option("--out", args.out, "the safetensors file to write (atomically)")->required();
  w->add_flag("--force", args.force, "replace an existing --out file");
  w->footer(
      "The tensors keep the model's own names (blocks.0.attn_qkv.weight, ...), dtypes and shapes: the\n"
      "names of the model's PyTorch twin, so safetensors.torch.load_file() feeds load_state_dict().\n"
      "Every shard is checked against the manifest's sha256 first. Exit 0; 2 for bad usage (an existing\n"
      "--out without --force); 3 for a checkpoint that does not verify or holds no model; 4 for a path\n"
      "that is not there or cannot be written.\n"
      "Example:\n  retrace weights run --out model.safetensors\n"
      "  python3 -c \"from safetensors.torch import load_file; print(list(load_file('model.safetensors')))\"");
}

std::optional<train::Numerics> numerics_weights(WeightsArgs&) { return std::nullopt; }

int run_weights(const WeightsArgs& a, const Context&) {
  std::error_code ec;
  RETRACE_CHECK(a.force || !sfs::exists(a.out, ec), ConfigError, "retrace weights: ", a.out,
                " exists; pass --force to replace it");
  RETRACE_CHECK(!sfs::is_directory(a.out, ec), ConfigError, "retrace weights: --out ", a.out,
                " is a directory; name the file to write");
  Model model;
  pick_and_read(a.ckpt, model);
  const ckpt::Manifest& manifest = model.manifest;
  const std::vector<safetensors::TensorView>& views = model.views;
  uint64_t elements = 0, bytes = 0;
  for (const auto& v : views) {
    uint64_t n = 1;
    for (int64_t d : v.shape) n *= static_cast<uint64_t>(d);
    elements += n;
    bytes += v.nbytes;
  }
  std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                 {"retrace.step", std::to_string(manifest.step)},
                                                 {"retrace.config_hash", manifest.config_hash}};
  if (auto it = manifest.versions.find("libtorch"); it != manifest.versions.end())
    metadata["retrace.libtorch"] = it->second;
  const safetensors::ShardFileInfo info = safetensors::write_shard(a.out, metadata, views);
  std::printf("wrote %s: %zu tensors, %llu elements, %llu bytes of tensor data (file %llu bytes, sha256 %s)\n",
              a.out.c_str(), views.size(), static_cast<ull>(elements), static_cast<ull>(bytes),
              static_cast<ull>(info.size), info.sha256.c_str());
  std::printf("from checkpoint %s (step %llu, world size %u, sha256 verified)\n", model.dir.c_str(),
              static_cast<ull>(manifest.step), manifest.world_size);
  return 0;
}

}  // namespace retrace::cli
