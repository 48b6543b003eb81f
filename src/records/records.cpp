#include "records/records.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>

#include "core/le.h"
#include "records/step_fields.h"

namespace retrace::records {

bool is_numerics_key(const std::string& key) {
  return key.rfind("info.", 0) != 0 && key.rfind("env.", 0) != 0 && key != "allocator" && key != "cuda_device_count";
}

std::vector<KeyValue> numerics_fields(const std::vector<KeyValue>& fingerprint) {
  std::vector<KeyValue> out;
  for (const auto& kv : fingerprint)
    if (is_numerics_key(kv.key)) out.push_back(kv);
  return out;
}

std::vector<std::string> numerics_differences(const std::vector<KeyValue>& a, const std::vector<KeyValue>& b) {
  std::map<std::string, std::string> ma, mb;
  for (const auto& kv : numerics_fields(a)) ma[kv.key] = kv.value;
  for (const auto& kv : numerics_fields(b)) mb[kv.key] = kv.value;
  std::vector<std::string> keys;
  for (const auto& [k, v] : ma)
    if (auto it = mb.find(k); it == mb.end() || it->second != v) keys.push_back(k);
  for (const auto& [k, v] : mb)
    if (!ma.count(k)) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  return keys;
}

const char* skip_text(SkipReason reason) {
  switch (reason) {
    case SkipReason::kNone: return "";
    case SkipReason::kNonFiniteLoss: return "non_finite_loss";
    case SkipReason::kNonFiniteGrad: return "non_finite_grad";
    case SkipReason::kLossSpike: return "loss_spike";
    case SkipReason::kOther: break;
  }
  return "other";
}

SkipReason skip_reason_of(const std::string& text) {
  for (SkipReason r :
       {SkipReason::kNone, SkipReason::kNonFiniteLoss, SkipReason::kNonFiniteGrad, SkipReason::kLossSpike})
    if (text == skip_text(r)) return r;
  return SkipReason::kOther;
}

namespace {

template <typename T>
struct is_vector : std::false_type {};
template <typename T>
struct is_vector<std::vector<T>> : std::true_type {};

// Builds the canonical byte string of a record: fixed-width little-endian scalars, doubles by
// their bit pattern, strings length-prefixed, vectors count-prefixed. Hashing one contiguous
// buffer is faster than streaming many 8-byte updates.
class Canonical {
 public:
  void u8(uint8_t v) { bytes_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    uint8_t b[4];
    put_u32(b, v);
    bytes_.append(reinterpret_cast<const char*>(b), 4);
  }
  void u64(uint64_t v) {
    uint8_t b[8];
    put_u64(b, v);
    bytes_.append(reinterpret_cast<const char*>(b), 8);
  }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    u64(bits);
  }
  void digest(const Digest128& d) {
    u64(d.hi);
    u64(d.lo);
  }
  void str(const std::string& s) {
    u64(s.size());
    bytes_.append(s);
  }
  // A field's value: vectors count-prefixed, a module's digests as its name and three digests.
  void put(uint64_t v) { u64(v); }
  void put(uint32_t v) { u32(v); }
  void put(double v) { f64(v); }
  void put(const Digest128& d) { digest(d); }
  void put(Outcome o) { u8(static_cast<uint8_t>(o)); }
  void put(const std::string& s) { str(s); }
  void put(const ModuleDigest& m) {
    str(m.module);
    digest(m.param);
    digest(m.grad);
    digest(m.optim);
  }
  template <typename T>
  void put(const std::vector<T>& v) {
    u64(v.size());
    for (const T& x : v) put(x);
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

}  // namespace

Digest128 content_digest(const StepRecord& r) {
  Canonical c;
  for_each_field(
      [&c](const StepField& f, const auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (!std::is_same_v<T, Timings>) {  // timings are never digested
          if (f.digest == InDigest::kNever) return;
          if constexpr (std::is_same_v<T, Digest128> || is_vector<T>::value) {
            if (f.digest == InDigest::kWhenSet) {
              if (unset(value)) return;
              c.u8(f.tag);
            }
          }
          c.put(value);
        }
      },
      r);
  return xxh3_128(c.bytes().data(), c.bytes().size());
}

const std::vector<StepField>& step_fields() {
  static const std::vector<StepField> kFields = [] {
    std::vector<StepField> v;
    const StepRecord empty;
    for_each_field([&v](const StepField& f, const auto&) { v.push_back(f); }, empty);
    return v;
  }();
  return kFields;
}

size_t step_field_index(const std::string& name) {
  const std::vector<StepField>& fields = step_fields();
  size_t i = 0;
  while (i < fields.size() && name != fields[i].name) ++i;
  return i;
}

std::string value_text(uint64_t v) { return std::to_string(v); }
std::string value_text(uint32_t v) { return std::to_string(v); }
std::string value_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
std::string value_text(const Digest128& d) { return d.hex(); }
std::string value_text(Outcome o) { return outcome_text(o); }
std::string value_text(const std::string& s) { return s; }
std::string value_text(const ModuleDigest& m) {
  return m.module + ':' + m.param.hex() + ':' + m.grad.hex() + ':' + m.optim.hex();
}

bool is_process_event(const EventRecord& e) {
  return e.kind == "resume" || e.kind == "crash" || e.kind == "checkpoint";
}

Digest128 chain_digest(const Digest128& previous_chain, const Digest128& content) {
  uint8_t b[32];
  put_u64(b, previous_chain.hi);
  put_u64(b + 8, previous_chain.lo);
  put_u64(b + 16, content.hi);
  put_u64(b + 24, content.lo);
  return xxh3_128(b, sizeof(b));
}

}  // namespace retrace::records
