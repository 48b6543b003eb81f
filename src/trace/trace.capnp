# The records of a trace (see records.h for their meaning, framing.h for how they sit in a file).
# Every frame payload is one message whose root is Header, Step, Eval or Event, chosen by the
# frame's kind. Add fields only at the end of a struct with the next ordinal; anything an old
# reader cannot read needs a new kTraceSchema.
@0xe68a187a32967e13;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("retrace::trace::wire");

struct Digest128 {
  hi @0 :UInt64;
  lo @1 :UInt64;
}

struct KeyValue {
  key @0 :Text;
  value @1 :Text;
}

struct ParamInfo {
  name @0 :Text;
  shape @1 :List(Int64);
  dtype @2 :Text;
}

struct FileInfo {
  path @0 :Text;
  size @1 :UInt64;
  sha256 @2 :Text;
}

struct Fault {
  kind @0 :Text;
  step @1 :UInt64;
  arg @2 :Text;
}

struct Header {
  schema @0 :Text;
  retraceVersion @1 :Text;
  configToml @2 :Text;
  configHash @3 :Text;
  seed @4 :UInt64;
  fingerprint @5 :List(KeyValue);
  modelDescription @6 :Text;
  params @7 :List(ParamInfo);
  dataFiles @8 :List(FileInfo);
  faults @9 :List(Fault);
  totalSteps @10 :UInt64;
  worldSize @11 :UInt32;
  createdUtc @12 :Text;
  effectiveBatch @13 :UInt64;  # samples per optimizer step: micro batch x accum steps x world size
  # Format 2: a zstd raw-content dictionary (a template Step message of this run's shape) for the
  # step frames whose flags have bit 0 set. Empty in format 1 traces.
  stepDictionary @14 :Data;
}

enum Outcome {
  step @0;
  skip @1;
}

struct Timings {
  dataMs @0 :Float64;
  forwardMs @1 :Float64;
  backwardMs @2 :Float64;
  optimizerMs @3 :Float64;
  traceMs @4 :Float64;
  allreduceMs @5 :Float64;  # part of backwardMs: the data-parallel collectives
  checkpointMs @6 :Float64; # the loop held by the previous step's checkpoint (0 in older traces)
}

# The same six times as whole nanoseconds, which is what the clock measures: a step frame holds
# this instead of Timings when every value v is exactly ns / 1e6 for its ns (then it reads back to
# the same double), and these compress to about half the bytes of six Float64s.
struct TimingsNs {
  dataNs @0 :UInt64;
  forwardNs @1 :UInt64;
  backwardNs @2 :UInt64;
  optimizerNs @3 :UInt64;
  traceNs @4 :UInt64;
  allreduceNs @5 :UInt64;
  checkpointNs @6 :UInt64;
}

struct Step {
  step @0 :UInt64;
  epoch @1 :UInt64;
  batchInEpoch @2 :UInt64;
  batchSize @3 :UInt32;
  sampleDigest @4 :Digest128;
  loss @5 :Float64;
  lossBits @6 :UInt32;
  gradNormPre @7 :Float64;
  gradNormPost @8 :Float64;
  lr @9 :Float64;
  lossScale @10 :Float64;
  outcome @11 :Outcome;
  skipReason @12 :Text;
  paramDigest @13 :Digest128;
  optimDigest @14 :Digest128;
  rngDigest @15 :Digest128;
  microBatchSizes @16 :List(UInt32);
  microLosses @17 :List(Float64);
  rankGradDigests @18 :List(Digest128);
  contentDigest @19 :Digest128;
  chainDigest @20 :Digest128;
  timings @21 :Timings;
  # Collectives of the step (data parallelism): informational, not in the content digest.
  allreduceCalls @22 :UInt32;
  allreduceBytes @23 :UInt64;
  # Added later; absent (zero, empty) in traces from before them.
  stateDigest @24 :Digest128;          # scaler, guards, fired faults, set-aside batches, counters
  rankRngDigests @25 :List(Digest128);  # data parallelism: every rank's RngState after the step
  timingsNs @26 :TimingsNs;  # instead of timings (left unset) when the times are whole nanoseconds
  gradDigest @27 :Digest128;  # trace.digest_version 3: the gradients the optimizer used
  moduleDigests @28 :List(ModuleDigest);  # a recorder run's, per module in the model's order
}

# One module's share of a step's digests: its parameters and buffers, their gradients, their
# optimizer state (records.h, ModuleDigest).
struct ModuleDigest {
  module @0 :Text;
  param @1 :Digest128;
  grad @2 :Digest128;
  optim @3 :Digest128;
}

struct Eval {
  step @0 :UInt64;
  epoch @1 :UInt64;
  samples @2 :UInt64;
  loss @3 :Float64;
  accuracy @4 :Float64;
  # Language models (traces from before these fields read 0): the target tokens evaluated, the
  # batches, and the perplexity exp(loss). A classifier has tokens 0 and no perplexity.
  tokens @5 :UInt64;
  batches @6 :UInt64;
  perplexity @7 :Float64;
}

struct Event {
  step @0 :UInt64;
  kind @1 :Text;
  message @2 :Text;
}
