#include "trace/record_codec.h"

#include <algorithm>
#include <cmath>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "core/error.h"
#include "trace/trace.capnp.h"

namespace retrace::trace {
namespace {

capnp::Text::Reader text(const std::string& s) { return capnp::Text::Reader(s.c_str(), s.size()); }
std::string str(capnp::Text::Reader t) { return std::string(t.begin(), t.size()); }

void set_digest(wire::Digest128::Builder b, const Digest128& d) {
  b.setHi(d.hi);
  b.setLo(d.lo);
}
Digest128 get_digest(wire::Digest128::Reader r) { return Digest128{r.getHi(), r.getLo()}; }

// Every message is small, so one first segment of this size usually holds it whole.
constexpr unsigned kFirstSegmentWords = 1024;

void flatten(capnp::MessageBuilder& builder, std::string& out) {
  kj::Array<capnp::word> flat = capnp::messageToFlatArray(builder);
  kj::ArrayPtr<const kj::byte> bytes = flat.asBytes();
  out.assign(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

capnp::ReaderOptions reader_options(size_t n_words) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = kTraversalFactor * n_words + kTraversalSlackWords;
  options.nestingLimit = kNestingLimit;
  return options;
}

// Runs `convert` over the message's root, turning any Cap'n Proto complaint about the bytes into
// a FormatError that says where the bad message is.
template <typename Root, typename Convert>
auto parse_root(const uint64_t* words, size_t n_words, const std::string& where, Convert convert) {
  try {
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(reinterpret_cast<const capnp::word*>(words), n_words),
                                         reader_options(n_words));
    return convert(reader.getRoot<Root>());
  } catch (const kj::Exception& e) {
    RETRACE_FAIL(FormatError, "malformed record in ", where, ": ", e.getDescription().cStr(),
                 "; the frame checksum matched, so the file was written by a different or broken "
                 "writer");
  }
}

}  // namespace

void serialize_header(const records::TraceHeader& h, std::string& out) {
  capnp::MallocMessageBuilder builder(kFirstSegmentWords);
  auto b = builder.initRoot<wire::Header>();
  b.setSchema(text(h.schema));
  b.setRetraceVersion(text(h.retrace_version));
  b.setConfigToml(text(h.config_toml));
  b.setConfigHash(text(h.config_hash));
  b.setSeed(h.seed);
  auto fp = b.initFingerprint(static_cast<unsigned>(h.fingerprint.size()));
  for (size_t i = 0; i < h.fingerprint.size(); ++i) {
    fp[i].setKey(text(h.fingerprint[i].key));
    fp[i].setValue(text(h.fingerprint[i].value));
  }
  b.setModelDescription(text(h.model_description));
  auto params = b.initParams(static_cast<unsigned>(h.params.size()));
  for (size_t i = 0; i < h.params.size(); ++i) {
    params[i].setName(text(h.params[i].name));
    auto shape = params[i].initShape(static_cast<unsigned>(h.params[i].shape.size()));
    for (size_t j = 0; j < h.params[i].shape.size(); ++j) shape.set(j, h.params[i].shape[j]);
    params[i].setDtype(text(h.params[i].dtype));
  }
  auto files = b.initDataFiles(static_cast<unsigned>(h.data_files.size()));
  for (size_t i = 0; i < h.data_files.size(); ++i) {
    files[i].setPath(text(h.data_files[i].path));
    files[i].setSize(h.data_files[i].size);
    files[i].setSha256(text(h.data_files[i].sha256));
  }
  auto faults = b.initFaults(static_cast<unsigned>(h.faults.size()));
  for (size_t i = 0; i < h.faults.size(); ++i) {
    faults[i].setKind(text(h.faults[i].kind));
    faults[i].setStep(h.faults[i].step);
    faults[i].setArg(text(h.faults[i].arg));
  }
  b.setTotalSteps(h.total_steps);
  b.setWorldSize(h.world_size);
  b.setEffectiveBatch(h.effective_batch);
  if (!h.step_dictionary.empty())
    b.setStepDictionary(
        capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(h.step_dictionary.data()), h.step_dictionary.size()));
  b.setCreatedUtc(text(h.created_utc));
  flatten(builder, out);
}

namespace {
// True when `ms` is exactly ns / 1e6 for a whole ns (below 2^53, where doubles hold every integer).
bool whole_nanoseconds(double ms, uint64_t& ns) {
  if (!(ms >= 0) || !(ms * 1e6 < 9007199254740992.0)) return false;
  ns = static_cast<uint64_t>(std::llround(ms * 1e6));
  return static_cast<double>(ns) / 1e6 == ms;
}
}  // namespace

void serialize_step(const records::StepRecord& r, std::string& out) {
  capnp::MallocMessageBuilder builder(kFirstSegmentWords);
  auto b = builder.initRoot<wire::Step>();
  b.setStep(r.step);
  b.setEpoch(r.epoch);
  b.setBatchInEpoch(r.batch_in_epoch);
  b.setBatchSize(r.batch_size);
  set_digest(b.initSampleDigest(), r.sample_digest);
  b.setLoss(r.loss);
  b.setLossBits(r.loss_bits);
  b.setGradNormPre(r.grad_norm_pre);
  b.setGradNormPost(r.grad_norm_post);
  b.setLr(r.lr);
  b.setLossScale(r.loss_scale);
  b.setOutcome(r.outcome == records::Outcome::kSkip ? wire::Outcome::SKIP : wire::Outcome::STEP);
  b.setSkipReason(text(r.skip_reason));
  set_digest(b.initParamDigest(), r.param_digest);
  set_digest(b.initOptimDigest(), r.optim_digest);
  set_digest(b.initRngDigest(), r.rng_digest);
  auto sizes = b.initMicroBatchSizes(static_cast<unsigned>(r.micro_batch_sizes.size()));
  for (size_t i = 0; i < r.micro_batch_sizes.size(); ++i) sizes.set(i, r.micro_batch_sizes[i]);
  auto losses = b.initMicroLosses(static_cast<unsigned>(r.micro_losses.size()));
  for (size_t i = 0; i < r.micro_losses.size(); ++i) losses.set(i, r.micro_losses[i]);
  auto grads = b.initRankGradDigests(static_cast<unsigned>(r.rank_grad_digests.size()));
  for (size_t i = 0; i < r.rank_grad_digests.size(); ++i) set_digest(grads[i], r.rank_grad_digests[i]);
  set_digest(b.initContentDigest(), r.content_digest);
  set_digest(b.initChainDigest(), r.chain_digest);
  const double ms[7] = {r.timings.data_ms,  r.timings.forward_ms,   r.timings.backward_ms,  r.timings.optimizer_ms,
                        r.timings.trace_ms, r.timings.allreduce_ms, r.timings.checkpoint_ms};
  uint64_t ns[7] = {};
  bool whole = true;
  for (int i = 0; i < 7; ++i) whole = whole && whole_nanoseconds(ms[i], ns[i]);
  if (whole) {
    auto t = b.initTimingsNs();
    t.setDataNs(ns[0]);
    t.setForwardNs(ns[1]);
    t.setBackwardNs(ns[2]);
    t.setOptimizerNs(ns[3]);
    t.setTraceNs(ns[4]);
    t.setAllreduceNs(ns[5]);
    t.setCheckpointNs(ns[6]);
  } else {
    auto t = b.initTimings();
    t.setDataMs(ms[0]);
    t.setForwardMs(ms[1]);
    t.setBackwardMs(ms[2]);
    t.setOptimizerMs(ms[3]);
    t.setTraceMs(ms[4]);
    t.setAllreduceMs(ms[5]);
    t.setCheckpointMs(ms[6]);
  }
  b.setAllreduceCalls(r.allreduce_calls);
  b.setAllreduceBytes(r.allreduce_bytes);
  if (r.state_digest != Digest128{}) set_digest(b.initStateDigest(), r.state_digest);
  if (r.grad_digest != Digest128{}) set_digest(b.initGradDigest(), r.grad_digest);
  if (!r.rank_rng_digests.empty()) {
    auto rngs = b.initRankRngDigests(static_cast<unsigned>(r.rank_rng_digests.size()));
    for (size_t i = 0; i < r.rank_rng_digests.size(); ++i) set_digest(rngs[i], r.rank_rng_digests[i]);
  }
  if (!r.module_digests.empty()) {
    auto mods = b.initModuleDigests(static_cast<unsigned>(r.module_digests.size()));
    for (size_t i = 0; i < r.module_digests.size(); ++i) {
      const records::ModuleDigest& m = r.module_digests[i];
      mods[i].setModule(m.module);
      set_digest(mods[i].initParam(), m.param);
      set_digest(mods[i].initGrad(), m.grad);
      set_digest(mods[i].initOptim(), m.optim);
    }
  }
  flatten(builder, out);
}

std::string step_dictionary_for(const records::TraceHeader& h, uint32_t micro_batches) {
  records::StepRecord t;
  const uint32_t world = std::max<uint32_t>(1, h.world_size);
  const uint32_t micro = std::max<uint32_t>(1, micro_batches);
  t.step = 1;
  t.batch_size = static_cast<uint32_t>(h.effective_batch / world);
  t.micro_batch_sizes.assign(micro, t.batch_size / micro);
  t.micro_losses.assign(micro, 1.0);
  t.loss = 1.0;
  t.lr = 1e-3;
  t.loss_scale = 1.0;
  const Digest128 marker{0x0101010101010101ull, 0x0101010101010101ull};  // any non-zero value
  t.sample_digest = t.param_digest = t.optim_digest = t.rng_digest = t.state_digest = marker;
  t.content_digest = t.chain_digest = marker;
  if (world > 1) {
    t.rank_grad_digests.assign(world, marker);
    t.rank_rng_digests.assign(world, marker);
  }
  std::string out;
  serialize_step(t, out);
  return out;
}

void serialize_eval(const records::EvalRecord& r, std::string& out) {
  capnp::MallocMessageBuilder builder(kFirstSegmentWords);
  auto b = builder.initRoot<wire::Eval>();
  b.setStep(r.step);
  b.setEpoch(r.epoch);
  b.setSamples(r.samples);
  b.setLoss(r.loss);
  b.setAccuracy(r.accuracy);
  b.setTokens(r.tokens);
  b.setBatches(r.batches);
  b.setPerplexity(r.perplexity());
  flatten(builder, out);
}

void serialize_event(const records::EventRecord& r, std::string& out) {
  capnp::MallocMessageBuilder builder(kFirstSegmentWords);
  auto b = builder.initRoot<wire::Event>();
  b.setStep(r.step);
  b.setKind(text(r.kind));
  b.setMessage(text(r.message));
  flatten(builder, out);
}

records::TraceHeader parse_header(const uint64_t* words, size_t n_words, const std::string& where) {
  return parse_root<wire::Header>(words, n_words, where, [](wire::Header::Reader b) {
    records::TraceHeader h;
    h.schema = str(b.getSchema());
    h.retrace_version = str(b.getRetraceVersion());
    h.config_toml = str(b.getConfigToml());
    h.config_hash = str(b.getConfigHash());
    h.seed = b.getSeed();
    for (auto kv : b.getFingerprint()) h.fingerprint.push_back({str(kv.getKey()), str(kv.getValue())});
    h.model_description = str(b.getModelDescription());
    for (auto p : b.getParams()) {
      records::ParamInfo info;
      info.name = str(p.getName());
      for (int64_t d : p.getShape()) info.shape.push_back(d);
      info.dtype = str(p.getDtype());
      h.params.push_back(std::move(info));
    }
    for (auto f : b.getDataFiles()) h.data_files.push_back({str(f.getPath()), f.getSize(), str(f.getSha256())});
    for (auto f : b.getFaults()) h.faults.push_back({str(f.getKind()), f.getStep(), str(f.getArg())});
    h.total_steps = b.getTotalSteps();
    h.world_size = b.getWorldSize();
    h.effective_batch = b.getEffectiveBatch();
    if (b.hasStepDictionary()) {
      auto d = b.getStepDictionary();
      h.step_dictionary.assign(reinterpret_cast<const char*>(d.begin()), d.size());
    }
    h.created_utc = str(b.getCreatedUtc());
    return h;
  });
}

records::StepRecord parse_step(const uint64_t* words, size_t n_words, const std::string& where) {
  return parse_root<wire::Step>(words, n_words, where, [&where](wire::Step::Reader b) {
    records::StepRecord r;
    r.step = b.getStep();
    r.epoch = b.getEpoch();
    r.batch_in_epoch = b.getBatchInEpoch();
    r.batch_size = b.getBatchSize();
    r.sample_digest = get_digest(b.getSampleDigest());
    r.loss = b.getLoss();
    r.loss_bits = b.getLossBits();
    r.grad_norm_pre = b.getGradNormPre();
    r.grad_norm_post = b.getGradNormPost();
    r.lr = b.getLr();
    r.loss_scale = b.getLossScale();
    wire::Outcome outcome = b.getOutcome();
    RETRACE_CHECK(outcome == wire::Outcome::STEP || outcome == wire::Outcome::SKIP, FormatError, where,
                  " has step outcome ", static_cast<int>(outcome),
                  ", which this binary does not know; read it with the retrace that wrote it");
    r.outcome = outcome == wire::Outcome::SKIP ? records::Outcome::kSkip : records::Outcome::kStep;
    r.skip_reason = str(b.getSkipReason());
    r.param_digest = get_digest(b.getParamDigest());
    r.optim_digest = get_digest(b.getOptimDigest());
    r.rng_digest = get_digest(b.getRngDigest());
    for (uint32_t v : b.getMicroBatchSizes()) r.micro_batch_sizes.push_back(v);
    for (double v : b.getMicroLosses()) r.micro_losses.push_back(v);
    for (auto d : b.getRankGradDigests()) r.rank_grad_digests.push_back(get_digest(d));
    r.content_digest = get_digest(b.getContentDigest());
    r.chain_digest = get_digest(b.getChainDigest());
    auto t = b.getTimings();
    if (b.hasTimingsNs()) {
      auto n = b.getTimingsNs();
      r.timings.data_ms = double(n.getDataNs()) / 1e6;
      r.timings.forward_ms = double(n.getForwardNs()) / 1e6;
      r.timings.backward_ms = double(n.getBackwardNs()) / 1e6;
      r.timings.optimizer_ms = double(n.getOptimizerNs()) / 1e6;
      r.timings.trace_ms = double(n.getTraceNs()) / 1e6;
      r.timings.allreduce_ms = double(n.getAllreduceNs()) / 1e6;
      r.timings.checkpoint_ms = double(n.getCheckpointNs()) / 1e6;
    } else {
      r.timings.data_ms = t.getDataMs();
      r.timings.forward_ms = t.getForwardMs();
      r.timings.backward_ms = t.getBackwardMs();
      r.timings.optimizer_ms = t.getOptimizerMs();
      r.timings.trace_ms = t.getTraceMs();
      r.timings.allreduce_ms = t.getAllreduceMs();
      r.timings.checkpoint_ms = t.getCheckpointMs();
    }
    r.allreduce_calls = b.getAllreduceCalls();
    r.allreduce_bytes = b.getAllreduceBytes();
    if (b.hasStateDigest()) r.state_digest = get_digest(b.getStateDigest());
    if (b.hasGradDigest()) r.grad_digest = get_digest(b.getGradDigest());
    for (auto d : b.getRankRngDigests()) r.rank_rng_digests.push_back(get_digest(d));
    for (auto m : b.getModuleDigests())
      r.module_digests.push_back(
          {m.getModule().cStr(), get_digest(m.getParam()), get_digest(m.getGrad()), get_digest(m.getOptim())});
    return r;
  });
}

records::EvalRecord parse_eval(const uint64_t* words, size_t n_words, const std::string& where) {
  return parse_root<wire::Eval>(words, n_words, where, [](wire::Eval::Reader b) {
    records::EvalRecord r;
    r.step = b.getStep();
    r.epoch = b.getEpoch();
    r.samples = b.getSamples();
    r.loss = b.getLoss();
    r.accuracy = b.getAccuracy();
    r.tokens = b.getTokens();
    r.batches = b.getBatches();
    return r;
  });
}

records::EventRecord parse_event(const uint64_t* words, size_t n_words, const std::string& where) {
  return parse_root<wire::Event>(words, n_words, where, [](wire::Event::Reader b) {
    records::EventRecord r;
    r.step = b.getStep();
    r.kind = str(b.getKind());
    r.message = str(b.getMessage());
    return r;
  });
}

}  // namespace retrace::trace
