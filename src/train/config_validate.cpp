#include "train/config.h"

#include <algorithm>

#include "core/error.h"
#include "train/config_fields.h"
#include "train/faults.h"

namespace retrace::train {
namespace {

// eval.max_batches for token data when the config does not say: llm.c's val_max_steps.
constexpr int64_t kTokenEvalMaxBatches = 20;

}  // namespace

namespace config_detail {

// The defaults that depend on other keys, resolved once, so that the recorded text holds values.
void resolve_defaults(Config& c) {
  if (c.eval.max_batches < 0) c.eval.max_batches = c.data.kind == "tokens" ? kTokenEvalMaxBatches : 0;
  c.runtime.numerics_version = numerics_version(c.runtime);
}

void validate(Config& c) {
  resolve_defaults(c);
  RETRACE_CHECK(!c.model.hidden.empty(), ConfigError,
                "bad value for model.hidden: at least one hidden layer is needed");
  RETRACE_CHECK(!(c.amp.mode == AmpMode::kFp16 && c.runtime.device == DeviceKind::kCpu), ConfigError,
                "bad value for amp.mode: \"fp16\" autocast needs runtime.device = \"cuda\"; on CPU use \"bf16\"");
  c.faults.parsed = parse_faults(c.faults.inject);  // throws ConfigError naming the bad item
  RETRACE_CHECK(c.optim.adamw_moment == AdamwMoment::kMulAdd ||
                    (c.optim.name == OptimizerKind::kAdamW && !c.optim.fused),
                ConfigError,
                "optim.adamw_moment = \"lerp\" is LibTorch's AdamW with PyTorch 2.x's first moment, and needs "
                "optim.name = \"adamw\" and optim.fused = false (the fused kernel computes mul_add)");
  if (c.runtime.numerics_version == 2) {
    RETRACE_CHECK(c.runtime.numerics == Numerics::kPortable, ConfigError,
                  "runtime.numerics_version = 2 is a version of the portable profile, and runtime.numerics = "
                  "\"native\"; set runtime.numerics = \"portable\", or leave numerics_version at 1");
    RETRACE_CHECK(c.runtime.blas_threads == 0 && c.runtime.elementwise_threads == 0, ConfigError,
                  "runtime.numerics_version = 2 runs its GEMMs and kernels on runtime.threads threads (the one "
                  "knob; OpenBLAS and ATen run one thread there), and runtime.",
                  c.runtime.blas_threads != 0
                      ? "blas_threads = " + std::to_string(c.runtime.blas_threads)
                      : "elementwise_threads = " + std::to_string(c.runtime.elementwise_threads),
                  " is set; remove it and set runtime.threads (0: every core this process may use), or keep the pinned "
                  "threads with --set runtime.numerics_version=1");
  }
  if (c.runtime.invariance == Invariance::kBatch) {
    RETRACE_CHECK(c.data.batch_size % c.runtime.invariance_chunk == 0, ConfigError,
                  "runtime.invariance = \"batch\" computes whole chunks of runtime.invariance_chunk = ",
                  c.runtime.invariance_chunk, " samples, but data.batch_size = ", c.data.batch_size,
                  " (the micro-batch) is not a multiple of it; choose a data.batch_size that is, or a chunk that "
                  "divides it");
    RETRACE_CHECK(c.data.last_batch == data::LastBatch::kDrop, ConfigError,
                  "runtime.invariance = \"batch\" needs data.last_batch = \"drop\": a kept last batch is split "
                  "over the ranks unevenly, not into whole chunks");
  }
  RETRACE_CHECK(c.runtime.zero_stage == 0 || !c.trace.enabled || !c.trace.digests || c.trace.digest_version >= 3,
                ConfigError,
                "runtime.zero_stage = 1 splits the optimizer state among the ranks, and only digests "
                "that add up over slices describe it: set trace.digest_version = 3 or 4 (or trace.digests = false)");
  RETRACE_CHECK(c.runtime.zero_reduce == ZeroReduce::kAllReduce || c.runtime.zero_stage == 1, ConfigError,
                "runtime.zero_reduce = \"reduce_scatter\" gives each rank the gradients of its ZeRO range: set "
                "runtime.zero_stage = 1 with it, or leave zero_reduce at \"all_reduce\"");
  RETRACE_CHECK(c.runtime.zero_reduce == ZeroReduce::kAllReduce || c.runtime.invariance == Invariance::kNone,
                ConfigError,
                "runtime.zero_reduce = \"reduce_scatter\" is for the default mode: under "
                "runtime.invariance = \"batch\" each rank already folds one slice of the gradients in global chunk "
                "order (the bits of one rank); leave zero_reduce at \"all_reduce\"");
  RETRACE_CHECK(!c.model.kind.empty(), ConfigError, "bad value for model.kind: it is empty");
  RETRACE_CHECK(c.model.kind != "torchscript" || !c.model.path.empty(), ConfigError,
                "model.kind = \"torchscript\" needs model.path, the file saved with torch.jit.save "
                "(e.g. --set model.path=model.pt)");
}

}  // namespace config_detail

int64_t eval_batch_size(const Config& c) { return c.eval.batch_size > 0 ? c.eval.batch_size : c.data.batch_size; }

EvalPlan eval_plan(const Config& c, int64_t split_samples) {
  EvalPlan p;
  p.batch_size = eval_batch_size(c);
  p.batches = (split_samples + p.batch_size - 1) / p.batch_size;
  if (c.eval.max_batches > 0) p.batches = std::min(p.batches, c.eval.max_batches);
  p.samples = std::min(split_samples, p.batches * p.batch_size);
  return p;
}

}  // namespace retrace::train
