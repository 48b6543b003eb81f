#include "train/config_fields.h"

#include <type_traits>

namespace retrace::train {
namespace config_detail {
namespace {

template <typename S, typename M>
std::function<void*(Config&)> at(S Config::*section, M S::*member) {
  // A choice is stored as an enum whose values follow the order of its names (assign, to_toml).
  if constexpr (std::is_enum_v<M>) static_assert(std::is_same_v<std::underlying_type_t<M>, uint8_t>);
  return [section, member](Config& c) -> void* { return &((c.*section).*member); };
}

}  // namespace

// The table reads as rows, one key each:
// clang-format off
std::vector<Field> fields() {
  using C = Config;
  std::vector<Field> f;
  f.push_back({"seed", Kind::kInt, "seed of every random stream (init, dropout, data order)", {}, 0,
               9.007199254740992e15, false, false, [](C& c) -> void* { return &c.seed; }});
  f.push_back({"data.kind", Kind::kString,
               "data set: auto (text for model.kind gpt, else fashion-mnist), fashion-mnist (IDX files), text "
               "(a text file or directory), tensors (train/test.safetensors with inputs and targets), tokens "
               "(llm.c train.bin/val.bin), or a kind your binary registers", {}, 0, 0, false, false,
               at(&C::data, &DataConfig::kind), "'auto'"});
  f.push_back({"data.dir", Kind::kString, "where the data set is: a directory (or, for text, a file)", {}, 0, 0,
               false, false, at(&C::data, &DataConfig::dir)});
  f.push_back({"data.batch_size", Kind::kInt, "samples per step per rank", {}, 1, 65536, false, false,
               at(&C::data, &DataConfig::batch_size)});
  f.push_back({"data.last_batch", Kind::kChoice, "the last partial batch of an epoch", {"drop", "keep"},
               0, 0, false, false, at(&C::data, &DataConfig::last_batch)});
  f.push_back({"data.order", Kind::kChoice,
               "the epoch's order: feistel (a keyed bijection computed per position, no permutation held, O(1) "
               "state at any data size) or shuffle (a Fisher-Yates shuffle of every index each epoch)",
               {"feistel", "shuffle"}, 0, 0, false, false, at(&C::data, &DataConfig::order), "'shuffle'"});
  f.push_back({"data.eval_batch_size", Kind::kInt, "replaced by eval.batch_size (still read)", {}, 0, 1 << 20,
               false, false, at(&C::eval, &EvalConfig::batch_size), {}, Field::Era::kRetired, "eval.batch_size"});
  f.push_back({"data.context", Kind::kInt, "gpt: tokens per sample", {}, 1, 1 << 16, false, false,
               at(&C::data, &DataConfig::context)});
  f.push_back({"data.vocab_size", Kind::kInt, "tokens: vocabulary size (0: the largest token + 1)", {}, 0,
               1 << 30, false, false, at(&C::data, &DataConfig::vocab_size), "0"});
  f.push_back({"data.test_fraction", Kind::kFloat, "gpt: share of the corpus held out for evaluation", {}, 0, 1,
               false, true, at(&C::data, &DataConfig::test_fraction)});
  f.push_back({"model.kind", Kind::kString,
               "model: mlp (Fashion-MNIST), gpt (character language model), torchscript (model.path), or a kind "
               "your binary registers", {}, 0, 0, false, false, at(&C::model, &ModelConfig::kind)});
  f.push_back({"model.path", Kind::kString, "torchscript: the file saved with torch.jit.save", {}, 0, 0, false,
               false, at(&C::model, &ModelConfig::path), "''"});
  f.push_back({"model.hidden", Kind::kIntList, "widths of the hidden layers", {}, 1, 1 << 16, false,
               false, at(&C::model, &ModelConfig::hidden)});
  f.push_back({"model.activation", Kind::kChoice, "activation between layers", {"relu", "gelu", "tanh"},
               0, 0, false, false, at(&C::model, &ModelConfig::activation)});
  f.push_back({"model.dropout", Kind::kFloat, "dropout probability after each hidden layer", {}, 0, 1,
               false, true, at(&C::model, &ModelConfig::dropout)});
  f.push_back({"model.dropout_impl", Kind::kChoice,
               "how dropout masks are drawn on CPU: philox (one draw of torch's CPU generator keys a Philox4x32 "
               "mask, about 10x faster) or torch (LibTorch's bernoulli, one generator call per element)",
               {"philox", "torch"}, 0, 0, false, false, at(&C::model, &ModelConfig::dropout_impl), "'torch'"});
  f.push_back({"model.gelu_impl", Kind::kChoice,
               "how GELU (gpt, and mlp with activation gelu) is computed on CPU float32: retrace (its own kernel, "
               "the same bits with every LibTorch and CPU, about 3x faster) or torch (LibTorch's, whose bits change "
               "with the LibTorch version)",
               {"retrace", "torch"}, 0, 0, false, false, at(&C::model, &ModelConfig::gelu_impl), "'torch'"});
  f.push_back({"model.attention_matmul", Kind::kChoice,
               "gpt: how attention's batched matmuls run on CPU float32: lanes (the batch split between the two "
               "lanes, each matrix one OpenBLAS call on one thread, about 1.7x faster) or blas (ATen's bmm, "
               "OpenBLAS on runtime.blas_threads; other bits)",
               {"lanes", "blas"}, 0, 0, false, false, at(&C::model, &ModelConfig::attention_matmul), "'blas'"});
  f.push_back({"model.d_model", Kind::kInt, "gpt: width", {}, 1, 1 << 16, false, false,
               at(&C::model, &ModelConfig::d_model)});
  f.push_back({"model.n_layers", Kind::kInt, "gpt: transformer blocks", {}, 1, 1024, false, false,
               at(&C::model, &ModelConfig::n_layers)});
  f.push_back({"model.n_heads", Kind::kInt, "gpt: attention heads (must divide d_model)", {}, 1, 1024, false, false,
               at(&C::model, &ModelConfig::n_heads)});
  f.push_back({"model.checkpoint", Kind::kChoice, "gpt: activation checkpointing policy",
               {"none", "full", "sqrt", "selective"}, 0, 0, false, false, at(&C::model, &ModelConfig::checkpoint)});
  f.push_back({"model.checkpoint_every", Kind::kInt, "gpt: layers per segment with checkpoint = \"full\"", {}, 1,
               1024, false, false, at(&C::model, &ModelConfig::checkpoint_every)});
  f.push_back({"model.tie_embeddings", Kind::kBool,
               "gpt: the output layer is the token embedding's weight, without a bias (as GPT-2; off: a Linear "
               "layer of its own)", {}, 0, 0, false, false, at(&C::model, &ModelConfig::tie_embeddings), "false"});
  f.push_back({"optim.name", Kind::kChoice, "optimizer", {"adamw", "sgd"}, 0, 0, false, false,
               at(&C::optim, &OptimConfig::name)});
  f.push_back({"optim.lr", Kind::kFloat, "peak learning rate", {}, 0, 1e3, true, false,
               at(&C::optim, &OptimConfig::lr)});
  f.push_back({"optim.weight_decay", Kind::kFloat, "decoupled (adamw) or L2 (sgd) weight decay", {}, 0,
               1e3, false, false, at(&C::optim, &OptimConfig::weight_decay)});
  f.push_back({"optim.momentum", Kind::kFloat, "sgd momentum", {}, 0, 1, false, true,
               at(&C::optim, &OptimConfig::momentum)});
  f.push_back({"optim.nesterov", Kind::kBool, "sgd Nesterov momentum", {}, 0, 0, false, false,
               at(&C::optim, &OptimConfig::nesterov)});
  f.push_back({"optim.beta1", Kind::kFloat, "adamw beta1", {}, 0, 1, false, true,
               at(&C::optim, &OptimConfig::beta1)});
  f.push_back({"optim.beta2", Kind::kFloat, "adamw beta2", {}, 0, 1, false, true,
               at(&C::optim, &OptimConfig::beta2)});
  f.push_back({"optim.eps", Kind::kFloat, "adamw epsilon", {}, 0, 1, true, false,
               at(&C::optim, &OptimConfig::eps)});
  f.push_back({"optim.fused", Kind::kBool,
               "adamw: update each CPU float32 parameter in one pass (same bits as LibTorch's AdamW)", {}, 0, 0,
               false, false, at(&C::optim, &OptimConfig::fused), "false"});
  f.push_back({"optim.adamw_moment", Kind::kChoice,
               "adamw: the first moment as LibTorch's C++ AdamW computes it (mul_add: exp_avg * beta1 + (1 - "
               "beta1) * grad, two roundings) or as PyTorch 2.x's torch.optim.AdamW does (lerp: exp_avg.lerp_(grad, "
               "1 - beta1)), so that a Python loop with torch.optim.AdamW(foreach=False) is a bitwise twin; lerp "
               "needs optim.fused = false",
               {"mul_add", "lerp"}, 0, 0, false, false, at(&C::optim, &OptimConfig::adamw_moment), "'mul_add'"});
  f.push_back({"schedule.kind", Kind::kChoice, "learning-rate schedule after warmup",
               {"cosine", "constant"}, 0, 0, false, false, at(&C::schedule, &ScheduleConfig::kind)});
  f.push_back({"schedule.warmup_steps", Kind::kInt, "linear warmup steps", {}, 0, 1e12, false, false,
               at(&C::schedule, &ScheduleConfig::warmup_steps)});
  f.push_back({"schedule.min_lr_ratio", Kind::kFloat, "final lr of the cosine as a fraction of optim.lr",
               {}, 0, 1, false, false, at(&C::schedule, &ScheduleConfig::min_lr_ratio)});
  f.push_back({"train.epochs", Kind::kInt, "epochs to train when train.steps is 0", {}, 1, 1e6, false,
               false, at(&C::train, &TrainConfig::epochs)});
  f.push_back({"train.steps", Kind::kInt, "optimizer steps to train (0: train.epochs worth)", {}, 0, 1e12,
               false, false, at(&C::train, &TrainConfig::steps)});
  f.push_back({"train.accum_steps", Kind::kInt, "micro-batches of data.batch_size per optimizer step", {}, 1,
               1 << 16, false, false, at(&C::train, &TrainConfig::accum_steps)});
  f.push_back({"train.max_norm", Kind::kFloat, "clip the global gradient L2 norm to this (0: off)", {}, 0,
               1e12, false, false, at(&C::train, &TrainConfig::max_norm)});
  f.push_back({"train.eval_each_epoch", Kind::kBool, "replaced by eval.each_epoch (still read)", {}, 0, 0, false,
               false, at(&C::eval, &EvalConfig::each_epoch), {}, Field::Era::kRetired, "eval.each_epoch"});
  f.push_back({"train.loss", Kind::kString, "loss: cross_entropy, or a loss your binary registers", {}, 0, 0,
               false, false, at(&C::train, &TrainConfig::loss), "'cross_entropy'"});
  f.push_back({"amp.mode", Kind::kChoice, "autocast: off, bf16 (CPU or CUDA), fp16 (CUDA only)",
               {"off", "bf16", "fp16"}, 0, 0, false, false, at(&C::amp, &AmpConfig::mode)});
  f.push_back({"amp.scaler", Kind::kChoice, "loss scaler: auto (on for fp16), on (forced, e.g. to test it on CPU), off",
               {"auto", "on", "off"}, 0, 0, false, false, at(&C::amp, &AmpConfig::scaler)});
  f.push_back({"amp.init_scale", Kind::kFloat, "initial loss scale", {}, 0, 1e38, true, false,
               at(&C::amp, &AmpConfig::init_scale)});
  f.push_back({"amp.growth_factor", Kind::kFloat, "scale growth factor after growth_interval finite steps", {},
               1, 1e6, true, false, at(&C::amp, &AmpConfig::growth_factor)});
  f.push_back({"amp.backoff_factor", Kind::kFloat, "scale factor on a non-finite step", {}, 0, 1, true, true,
               at(&C::amp, &AmpConfig::backoff_factor)});
  f.push_back({"amp.growth_interval", Kind::kInt, "finite steps in a row before the scale grows", {}, 1, 1e12,
               false, false, at(&C::amp, &AmpConfig::growth_interval)});
  f.push_back({"guards.skip_window", Kind::kInt, "steps in the rolling skip-rate window", {}, 1, 1e9, false,
               false, at(&C::guards, &GuardConfig::skip_window)});
  f.push_back({"guards.skip_warn_rate", Kind::kFloat, "warn when the skip rate passes this", {}, 0, 1, false,
               false, at(&C::guards, &GuardConfig::skip_warn_rate)});
  f.push_back({"guards.spike_factor", Kind::kFloat,
               "roll back when the loss exceeds this times its recent median (0: off)", {}, 0, 1e9, false, false,
               at(&C::guards, &GuardConfig::spike_factor)});
  f.push_back({"guards.spike_window", Kind::kInt, "losses in the median that defines the recent level", {}, 1,
               1e6, false, false, at(&C::guards, &GuardConfig::spike_window)});
  f.push_back({"guards.spike_skip_batches", Kind::kInt, "batches skipped after a rollback, ending at the spike",
               {}, 1, 1e6, false, false, at(&C::guards, &GuardConfig::spike_skip_batches)});
  f.push_back({"faults.inject", Kind::kString, "faults to inject: KIND@STEP[:ARG],... (see --help)", {}, 0, 0,
               false, false, at(&C::faults, &FaultConfig::inject)});
  f.push_back({"runtime.device", Kind::kChoice, "device to train on", {"cpu", "cuda"}, 0, 0, false, false,
               at(&C::runtime, &RuntimeConfig::device)});
  f.push_back({"runtime.numerics", Kind::kChoice,
               "numerics profile: portable (the same bits on every x86-64-v3 machine; see numerics_version) or "
               "native (the machine's own kernels, faster on some, bits of this machine only)",
               {"portable", "native"}, 0, 0, false, false, at(&C::runtime, &RuntimeConfig::numerics), "'native'"});
  f.push_back({"runtime.numerics_version", Kind::kInt,
               "portable numerics: 1, thread counts pinned (torch 1, OpenBLAS 2: every run recorded before this "
               "key); 2, GEMMs on BLIS 0.9 (libblis4-pthread) and retrace's kernels, the same bits at any "
               "runtime.threads, so every core by default; 0: auto (2 under portable, 1 under native)",
               {}, 0, 2, false, false, at(&C::runtime, &RuntimeConfig::numerics_version), "1"});
  f.push_back({"runtime.threads", Kind::kInt,
               "threads (0: auto). numerics_version 1: torch intra-op threads (auto: portable 1); 2: the threads "
               "of the GEMMs and retrace's kernels, information, not numerics (auto: the cores this process may "
               "use: affinity, cgroup quota, local ranks)",
               {}, 0, 1024, false, false, at(&C::runtime, &RuntimeConfig::threads)});
  f.push_back({"runtime.blas_threads", Kind::kInt, "OpenBLAS threads (0: auto; portable 2, native the core count up to 8)", {}, 0,
               1024, false, false, at(&C::runtime, &RuntimeConfig::blas_threads)});
  f.push_back({"runtime.interop_threads", Kind::kInt, "torch inter-op threads", {}, 1, 1024, false, false,
               at(&C::runtime, &RuntimeConfig::interop_threads)});
  f.push_back({"runtime.elementwise_threads", Kind::kInt,
               "threads for the GPT's elementwise work and dropout masks, 1 or 2 (0: auto; the bits are the "
               "same at 1 and 2)", {}, 0, 2, false, false, at(&C::runtime, &RuntimeConfig::elementwise_threads), "0"});
  f.push_back({"runtime.deterministic", Kind::kBool, "deterministic algorithms only", {}, 0, 0, false,
               false, at(&C::runtime, &RuntimeConfig::deterministic)});
  f.push_back({"runtime.collective_timeout_s", Kind::kFloat,
               "data parallelism: seconds to wait for the other ranks before failing", {}, 0, 86400, true, false,
               at(&C::runtime, &RuntimeConfig::collective_timeout_s)});
  f.push_back({"runtime.bucket_mb", Kind::kFloat, "data parallelism: gradient all-reduce bucket size in MiB", {}, 0,
               1e6, true, false, at(&C::runtime, &RuntimeConfig::bucket_mb)});
  f.push_back({"runtime.invariance", Kind::kChoice,
               "batch: the same bits for any train.accum_steps and world size that split the global batch into "
               "whole chunks of runtime.invariance_chunk samples (each chunk computed alone, gradients summed over "
               "chunks in global order, dropout masks keyed by step and chunk, so by sample); none: the fastest "
               "layout-dependent arithmetic", {"none", "batch"}, 0, 0, false, false,
               at(&C::runtime, &RuntimeConfig::invariance), "'none'"});
  f.push_back({"runtime.invariance_chunk", Kind::kInt,
               "invariance = batch: samples per chunk; data.batch_size must be a multiple of it", {}, 1, 65536, false,
               false, at(&C::runtime, &RuntimeConfig::invariance_chunk), "8"});
  f.push_back({"runtime.zero_stage", Kind::kInt,
               "1: ZeRO stage 1, each rank holds and updates the optimizer state of its own range of the "
               "parameters (about 1/world of it), then the ranks all-gather the parameters; the same bits as 0 "
               "(trace.digest_version is then 4 unless set; 3 or 4 when digests are on); 0: every rank holds all of it", {}, 0, 1, false,
               false, at(&C::runtime, &RuntimeConfig::zero_stage), "0"});
  f.push_back({"runtime.zero_reduce", Kind::kChoice,
               "zero_stage = 1 without invariance: how a rank gets the reduced gradients of its range. all_reduce: "
               "every rank sums all of them (the bits of zero_stage = 0); reduce_scatter: each rank receives its "
               "range's only, added in rank order, and the clip norm adds the ranks' parts (2/3 of the traffic of "
               "all_reduce plus the all-gather; the same bits run to run and on any backend, within float rounding "
               "of zero_stage = 0)",
               {"all_reduce", "reduce_scatter"}, 0, 0, false, false, at(&C::runtime, &RuntimeConfig::zero_reduce),
               "'all_reduce'"});
  f.push_back({"trace.enabled", Kind::kBool, "write the step trace", {}, 0, 0, false, false,
               at(&C::trace, &TraceConfig::enabled)});
  f.push_back({"trace.digests", Kind::kBool, "digest parameters, optimizer and RNG state every step", {},
               0, 0, false, false, at(&C::trace, &TraceConfig::digests)});
  f.push_back({"trace.optimizer_digest_every", Kind::kInt,
               "digest the optimizer state every N steps (parameters and RNG are digested every step)", {}, 1, 1e9,
               false, false, at(&C::trace, &TraceConfig::optimizer_digest_every)});
  f.push_back({"trace.digest_version", Kind::kInt,
               "4: as 3 with a cheaper mix (one 32 x 32-bit multiply per element where 3's fmix64 has two 64-bit "
               "ones; about a third of the cost); 3: as 2, the tensors by position-mixed sums that add up over slices (a ZeRO run's digests equal "
               "an unsharded run's; computed on the tensor's device), and the gradients the optimizer used, "
               "every step; 2: parameters and optimizer by lane "
               "checksums, plus the rest of the state (scaler, guard windows, fired faults, set-aside batches, "
               "samples seen) and every rank's RNG, every step; 1: xxh3 of parameters, optimizer and rank 0's RNG "
               "only", {}, 1, 4, false, false,
               at(&C::trace, &TraceConfig::digest_version), "1"});
  f.push_back({"trace.zstd_level", Kind::kInt, "zstd level of trace frames", {}, 1, 19, false, false,
               at(&C::trace, &TraceConfig::zstd_level)});
  f.push_back({"checkpoint.every_steps", Kind::kInt, "save a checkpoint every N steps (0: off)", {}, 0,
               1e12, false, false, at(&C::checkpoint, &CheckpointConfig::every_steps)});
  f.push_back({"checkpoint.every_seconds", Kind::kFloat, "save a checkpoint every S seconds (0: off)", {},
               0, 1e9, false, false, at(&C::checkpoint, &CheckpointConfig::every_seconds)});
  f.push_back({"checkpoint.keep_last", Kind::kInt, "complete checkpoints kept by rotation", {}, 1, 1e6,
               false, false, at(&C::checkpoint, &CheckpointConfig::keep_last)});
  f.push_back({"checkpoint.at_end", Kind::kBool, "save a checkpoint when the run ends", {}, 0, 0, false,
               false, at(&C::checkpoint, &CheckpointConfig::at_end)});
  f.push_back({"checkpoint.async", Kind::kBool,
               "save in the background: the loop copies the state into a staging buffer (blocked about as long "
               "as a memcpy of it) and a writer thread writes, checks against the step's trace digests and "
               "commits it while training goes on (several ranks vote on a process group of their own); false: "
               "the loop waits for each save. Synchronous anyway under runtime.zero_stage = 1, without trace "
               "digests, and for the last and the interrupt's save (docs/checkpoints.md)",
               {}, 0, 0, false, false, at(&C::checkpoint, &CheckpointConfig::async_save), "false",
               Field::Era::kCurrent, {}, true});
  f.push_back({"checkpoint.lend_lane", Kind::kBool,
               "while a background save is written, the step runs on one lane fewer (runtime.threads - 1, at "
               "least one) and leaves that core to the writer, whose work would otherwise make one of the step's "
               "lanes a straggler the others wait for; the bits are the same (a tile's bits do not depend on the "
               "lane that computes it); the lane goes back to the step while the writer waits on the disk "
               "(fsync, a blocked writeback). false: the writer competes with the step's lanes",
               {}, 0, 0, false, false, at(&C::checkpoint, &CheckpointConfig::lend_lane), "false",
               Field::Era::kCurrent, {}, true});
  f.push_back({"checkpoint.direct_io", Kind::kBool,
               "write each shard past the page cache (O_DIRECT) from an aligned buffer and read it back the same "
               "way, so the read-back checks the device's bytes and the writer spends no CPU filling the cache; "
               "the same bytes either way. Where the file system refuses it (tmpfs) the shard goes through the "
               "page cache. false: through the page cache, so a resume soon after reads a warm cache",
               {}, 0, 0, false, false, at(&C::checkpoint, &CheckpointConfig::direct_io), "false",
               Field::Era::kCurrent, {}, true});
  f.push_back({"checkpoint.on_error", Kind::kChoice,
               "a background save that fails on the disk (full, read-only, I/O error), reported at the next "
               "step: stop (exit 4, the newest committed checkpoint named) or continue (a warning and an event; "
               "the next due save tries again)",
               {"stop", "continue"}, 0, 0, false, false, at(&C::checkpoint, &CheckpointConfig::on_error), "'stop'",
               Field::Era::kCurrent, {}, true});
  f.push_back({"eval.every_steps", Kind::kInt,
               "evaluate after every N steps (0: only at epoch ends, when eval.each_epoch, and at the end)", {}, 0,
               1e12, false, false, at(&C::eval, &EvalConfig::every_steps), "0"});
  f.push_back({"eval.each_epoch", Kind::kBool, "evaluate at the end of every epoch", {}, 0, 0, false, false,
               at(&C::eval, &EvalConfig::each_epoch), {}, Field::Era::kSuccessor, "train.eval_each_epoch"});
  f.push_back({"eval.max_batches", Kind::kInt,
               "batches of the validation split evaluated, always the first ones in its order (0: all; default "
               "20 for data.kind \"tokens\", as llm.c's val_max_steps, else 0)", {}, 0, 1e9, false, false,
               at(&C::eval, &EvalConfig::max_batches), "0"});
  f.push_back({"eval.batch_size", Kind::kInt,
               "samples per evaluation batch (0: data.batch_size, the training micro-batch, so an evaluation needs "
               "no more memory than a step)", {}, 0, 1 << 20, false, false, at(&C::eval, &EvalConfig::batch_size), {},
               Field::Era::kSuccessor, "data.eval_batch_size"});
  return f;
}
// clang-format on

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kInt: return "integer";
    case Kind::kFloat: return "number";
    case Kind::kBool: return "boolean";
    case Kind::kString: return "string";
    case Kind::kChoice: return "choice";
    case Kind::kIntList: return "list of integers";
  }
  return "?";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + std::string("\"") + x + "\"";
  return s;
}

}  // namespace config_detail

const char* optimizer_name(OptimizerKind k) { return k == OptimizerKind::kSgd ? "sgd" : "adamw"; }
const char* amp_name(AmpMode m) { return m == AmpMode::kBf16 ? "bf16" : m == AmpMode::kFp16 ? "fp16" : "off"; }

}  // namespace retrace::train
