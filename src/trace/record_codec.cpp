#include "trace/record_codec.h"

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
    capnp::FlatArrayMessageReader reader(
        kj::arrayPtr(reinterpret_cast<const capnp::word*>(words), n_words), reader_options(n_words));
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
  b.setCreatedUtc(text(h.created_utc));
  flatten(builder, out);
}

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
  auto t = b.initTimings();
  t.setDataMs(r.timings.data_ms);
  t.setForwardMs(r.timings.forward_ms);
  t.setBackwardMs(r.timings.backward_ms);
  t.setOptimizerMs(r.timings.optimizer_ms);
  t.setTraceMs(r.timings.trace_ms);
  t.setAllreduceMs(r.timings.allreduce_ms);
  b.setAllreduceCalls(r.allreduce_calls);
  b.setAllreduceBytes(r.allreduce_bytes);
  if (r.state_digest != Digest128{}) set_digest(b.initStateDigest(), r.state_digest);
  if (!r.rank_rng_digests.empty()) {
    auto rngs = b.initRankRngDigests(static_cast<unsigned>(r.rank_rng_digests.size()));
    for (size_t i = 0; i < r.rank_rng_digests.size(); ++i) set_digest(rngs[i], r.rank_rng_digests[i]);
  }
  flatten(builder, out);
}

void serialize_eval(const records::EvalRecord& r, std::string& out) {
  capnp::MallocMessageBuilder builder(kFirstSegmentWords);
  auto b = builder.initRoot<wire::Eval>();
  b.setStep(r.step);
  b.setEpoch(r.epoch);
  b.setSamples(r.samples);
  b.setLoss(r.loss);
  b.setAccuracy(r.accuracy);
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
    RETRACE_CHECK(outcome == wire::Outcome::STEP || outcome == wire::Outcome::SKIP, FormatError,
                  where, " has step outcome ", static_cast<int>(outcome),
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
    r.timings.data_ms = t.getDataMs();
    r.timings.forward_ms = t.getForwardMs();
    r.timings.backward_ms = t.getBackwardMs();
    r.timings.optimizer_ms = t.getOptimizerMs();
    r.timings.trace_ms = t.getTraceMs();
    r.timings.allreduce_ms = t.getAllreduceMs();
    r.allreduce_calls = b.getAllreduceCalls();
    r.allreduce_bytes = b.getAllreduceBytes();
    if (b.hasStateDigest()) r.state_digest = get_digest(b.getStateDigest());
    for (auto d : b.getRankRngDigests()) r.rank_rng_digests.push_back(get_digest(d));
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
