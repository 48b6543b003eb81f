#include "run/async_save.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/disk_wait.h"
#include "core/error.h"
#include "run/loop_parts.h"
#include "train/step_digests.h"

namespace retrace::run {

namespace {

// Copies `from` into `into`, reusing into's tensors where name, shape and dtype still match.
uint64_t stage_into(NamedTensors& into, const NamedTensors& from) {
  uint64_t bytes = 0;
  const bool same = into.size() == from.size();
  if (!same) into.assign(from.size(), {});
  for (size_t i = 0; i < from.size(); ++i) {
    const auto& [name, t] = from[i];
    auto& [staged_name, staged] = into[i];
    if (!t.defined()) {
      staged_name = name;
      staged = torch::Tensor();
      continue;
    }
    if (staged_name != name || !staged.defined() || staged.sizes() != t.sizes() ||
        staged.scalar_type() != t.scalar_type()) {
      staged_name = name;
      staged = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(t.is_cuda()));
    }
    staged.copy_(t.detach());
    bytes += staged.nbytes();
  }
  return bytes;
}

// The first name whose share differs between the two lists (both sorted by name), or a note that
// the lists hold different tensors. No shares kept (trace.digest_version 1): which one is unknown.
std::string first_difference(const DigestParts& got, const DigestParts& want) {
  if (want.empty() && !got.empty())
    return "* (which tensor is unknown: trace.digest_version = 1 keeps no digest per tensor)";
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (got[i].first != want[i].first) return "the tensors differ from the step's (" + got[i].first + ")";
    if (got[i].second != want[i].second) return got[i].first;
  }
  return "the tensors differ from the step's (" + std::to_string(got.size()) + " staged, " +
         std::to_string(want.size()) + " in the step's digest)";
}

void check_group(const NamedTensors& staged, const char* prefix, DigestKind kind, const Digest128& want,
                 const DigestParts& want_parts, uint64_t step, const std::string& where) {
  DigestParts got_parts;
  const Digest128 got = digest_named(staged, kind, nullptr, &got_parts);
  if (got == want) return;
  RETRACE_FAIL(IntegrityError, "the background save of step ", step, " in ", where, " is not step ", step,
               "'s state: the staged copy of ", prefix, first_difference(got_parts, want_parts),
               " differs from the digest the trace holds for that step; nothing was committed (the newer "
               "checkpoints stay as they were). This is a fault of the copy or of memory, not of the input: "
               "resume from the newest checkpoint, and report it if it happens without an injected fault");
}

}  // namespace

ckpt::StateSnapshot StagingBuffer::stage(const ckpt::StateSnapshot& live) {
  ckpt::StateSnapshot out = live;
  bytes_ = stage_into(model_, live.model) + stage_into(optim_, live.optim);
  out.model = model_;
  out.optim = optim_;
  return out;
}

void check_staged(const ckpt::StateSnapshot& staged, const StepProof& proof, const std::string& where) {
  RETRACE_CHECK(proof.parts.step == proof.step && staged.step == proof.step, InvariantError,
                "a background save of step ", staged.step, " with the digests of step ", proof.parts.step);
  check_group(staged.model, "model/", proof.kind, proof.param, proof.parts.model, proof.step, where);
  if (proof.parts.with_optimizer)
    check_group(staged.optim, "optim/", proof.kind, proof.optim, proof.parts.optim, proof.step, where);
  RETRACE_CHECK(train::rng_digest(staged.rng) == proof.rng, IntegrityError, "the background save of step ", proof.step,
                " in ", where, " is not step ", proof.step,
                "'s state: its RNG state differs from the digest the trace holds for that step; nothing was "
                "committed");
}

void corrupt_staged(ckpt::StateSnapshot& staged, const std::string& name) {
  std::string names;
  for (auto* group : {&staged.model, &staged.optim}) {
    const std::string prefix = group == &staged.model ? "model/" : "optim/";
    for (auto& [n, t] : *group) {
      if (prefix + n == name && t.defined() && t.numel() > 0) {
        auto* byte = static_cast<unsigned char*>(t.data_ptr());
        *byte ^= 1;
        return;
      }
      if (names.size() < 400) names += (names.empty() ? "" : ", ") + prefix + n;
    }
  }
  RETRACE_FAIL(ConfigError, "fault corrupt-staging: no tensor \"", name, "\" in the checkpoint; its tensors are ",
               names, names.size() >= 400 ? ", ..." : "");
}

WriterLaneLoan::WriterLaneLoan() {
  take();
  fs::set_disk_wait_hooks({[this] { give_back(); }, [this] { take(); }});
}

WriterLaneLoan::~WriterLaneLoan() {
  fs::set_disk_wait_hooks({});
  give_back();
}

void WriterLaneLoan::take() {
  loan_.emplace();
  since_ = std::chrono::steady_clock::now();
}

void WriterLaneLoan::give_back() {
  if (!loan_) return;
  loan_.reset();
  lent_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
}

double WriterLaneLoan::seconds_lent() const {
  return lent_ + (loan_ ? std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count() : 0.0);
}

BackgroundSave::~BackgroundSave() {
  if (thread_.joinable()) thread_.join();
}

void BackgroundSave::start(Job job) {
  RETRACE_CHECK(!thread_.joinable(), InvariantError, "a background save started while step ", outcome_.step,
                "'s is in flight");
  done_.store(false, std::memory_order_release);
  outcome_ = SaveOutcome{};
  outcome_.step = job.snapshot.step;
  thread_ = std::thread([this, job = std::move(job)]() mutable {
    const auto start = std::chrono::steady_clock::now();
    std::optional<WriterLaneLoan> loan;
    if (job.lend_lane) loan.emplace();
    try {
      const std::string where = job.root + "/" + ckpt::step_dir_name(job.snapshot.step);
      const auto before_commit = [&] {
        check_staged(job.snapshot, job.proof, where);
        if (!job.crash_id.empty()) {
          mark_fired_on_disk(job.crash_run_dir, job.crash_id);
          std::fprintf(stderr, "crash: injected crash in the background save of step %llu: SIGKILL\n",
                       static_cast<unsigned long long>(job.snapshot.step));
          std::fflush(stderr);
          ::raise(SIGKILL);
        }
      };
      outcome_.dir = ckpt::save_snapshot(job.snapshot, job.root, job.position, job.keep_last, job.sync,
                                         &outcome_.rotation, job.anchor ? &*job.anchor : nullptr, before_commit);
      if (job.snapshot.rank == 0) outcome_.bytes = directory_bytes(outcome_.dir);
    } catch (const IoError&) {
      outcome_.error = std::current_exception();
      outcome_.disk_error = true;
    } catch (...) {
      outcome_.error = std::current_exception();
    }
    outcome_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (loan) outcome_.seconds_lent = loan->seconds_lent();
    loan.reset();  // before done_: the step has its lanes back once the outcome is there
    done_.store(true, std::memory_order_release);
  });
}

std::optional<SaveOutcome> BackgroundSave::wait() {
  if (!thread_.joinable()) return std::nullopt;
  thread_.join();
  return std::move(outcome_);
}

}  // namespace retrace::run
