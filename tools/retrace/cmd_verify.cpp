#include "cli.h"

#include <cstdio>
#include <iostream>

#include "common.h"
#include "ckpt/strict_json.h"
#include "ckpt/verify.h"
#include "core/error.h"

namespace retrace::cli {
void add_verify(CLI::App& app, VerifyArgs& args) {
  auto* ver = app.add_subcommand("verify", "verify a checkpoint directory without loading it");
  ver->add_option("dir", args.dir, "checkpoint directory (run/checkpoints/step-00000010)")->required();
  ver->add_flag("--json", args.json, "JSON report (exit 3 when not ok)");
  ver->add_option("--world-size", args.world_size, "expected world size")->check(world_range());
  ver->footer("Example:\n  retrace verify run/checkpoints/step-00000010 --json");
}

std::optional<train::Numerics> numerics_verify(VerifyArgs& args) {
  (void)args;
  return std::nullopt;
}

int run_verify(const VerifyArgs& a, const Context&) {
  std::optional<uint32_t> world;
  if (a.world_size > 0) world = static_cast<uint32_t>(a.world_size);
  if (a.json) {
    nlohmann::json j = ckpt::verify_report_json(a.dir, world);
    std::cout << ckpt::json_text(j, 2) << "\n";
    return j.value("ok", false) ? 0 : static_cast<int>(ExitCode::kCorrupt);
  }
  ckpt::Manifest m = ckpt::verify_checkpoint(a.dir, world);  // throws with the exact phrase
  ckpt::check_table(a.dir, m);                               // and what every rank's load will look for
  std::printf("checkpoint %s: step %llu, world size %u, schema %s, %zu shard(s), sha256 and table verified\n",
              a.dir.c_str(), static_cast<ull>(m.step), m.world_size, m.schema.c_str(), m.shards.size());
  for (const auto& s : m.shards)
    std::printf("  rank %u  %s  %llu bytes  sha256 %s\n", s.rank, s.file.c_str(), static_cast<ull>(s.size),
                s.sha256.c_str());
  std::printf("VERIFIED\n");
  return 0;
}

}  // namespace retrace::cli
