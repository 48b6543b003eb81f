// The numerics profile's torch-free half: parsing, the environment plan (what a portable or
// native process must set or drop, what a user's own setting keeps), the CPU check, the config key.
#include "train/numerics.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "core/error.h"
#include "train/config.h"

namespace retrace::train {
namespace {

// Sets the variables a test names for its lifetime and puts back what was there (the test
// executable itself runs with the portable pins in its environment).
class EnvScope {
 public:
  EnvScope(std::initializer_list<std::pair<const char*, std::optional<std::string>>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      if (value) setenv(name, value->c_str(), 1);
      else unsetenv(name);
    }
  }
  ~EnvScope() {
    for (const auto& [name, value] : saved_) {
      if (value) setenv(name.c_str(), value->c_str(), 1);
      else unsetenv(name.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

std::optional<std::string> value_in(const std::vector<std::pair<std::string, std::string>>& v, const std::string& k) {
  for (const auto& [key, value] : v)
    if (key == k) return value;
  return std::nullopt;
}

TEST(Numerics, ParsesBothProfilesAndRejectsOthersNamingTheKey) {
  EXPECT_EQ(parse_numerics("portable"), Numerics::kPortable);
  EXPECT_EQ(parse_numerics("native"), Numerics::kNative);
  try {
    parse_numerics("fast");
    FAIL() << "no error for an unknown profile";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("runtime.numerics"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"native\""), std::string::npos) << e.what();
  }
}

TEST(Numerics, ConfigDefaultsToPortableAndRecordedConfigsWithoutTheKeyAreNative) {
  EXPECT_EQ(parse_config("", "test", {}).runtime.numerics, Numerics::kPortable);
  // A config retrace wrote before the key existed ran with whatever the machine picked.
  EXPECT_EQ(parse_config("", "test", {}, ConfigSource::kRecorded).runtime.numerics, Numerics::kNative);
  EXPECT_EQ(parse_config("", "test", {"runtime.numerics=native"}).runtime.numerics, Numerics::kNative);
  EXPECT_THROW(parse_config("", "test", {"runtime.numerics=fast"}), ConfigError);
  // The resolved text keeps a portable config portable when it is read back as recorded.
  const std::string text = to_toml(parse_config("", "test", {}));
  EXPECT_EQ(parse_config(text, "test", {}, ConfigSource::kRecorded).runtime.numerics, Numerics::kPortable);
}

TEST(Numerics, PortablePlanSetsEveryPinInAFreshEnvironment) {
  EnvScope env{{"OPENBLAS_CORETYPE", std::nullopt},
               {"ATEN_CPU_CAPABILITY", std::nullopt},
               {kPinnedVariable, std::nullopt}};
  EnvPlan plan = plan_environment(Numerics::kPortable);
  EXPECT_FALSE(plan.ready());
  EXPECT_EQ(value_in(plan.set, "OPENBLAS_CORETYPE"), "Haswell");
  EXPECT_EQ(value_in(plan.set, "ATEN_CPU_CAPABILITY"), "avx2");
  EXPECT_TRUE(plan.unset.empty());
  EXPECT_TRUE(plan.respected.empty());
  // Native needs nothing from a fresh environment.
  EXPECT_TRUE(plan_environment(Numerics::kNative).ready());
}

TEST(Numerics, AVariableTheUserSetIsKeptAndReportedNeverOverridden) {
  EnvScope env{{"OPENBLAS_CORETYPE", "Prescott"}, {"ATEN_CPU_CAPABILITY", "avx2"}, {kPinnedVariable, std::nullopt}};
  EnvPlan plan = plan_environment(Numerics::kPortable);
  EXPECT_TRUE(plan.ready());
  EXPECT_EQ(value_in(plan.respected, "OPENBLAS_CORETYPE"), "Prescott");
  EXPECT_FALSE(value_in(plan.respected, "ATEN_CPU_CAPABILITY"));  // the user's value equals the pin
  const std::string line = describe_numerics(Numerics::kPortable, plan);
  EXPECT_NE(line.find("OPENBLAS_CORETYPE=Prescott"), std::string::npos) << line;
  EXPECT_NE(line.find("portable only among machines with the same setting"), std::string::npos) << line;
  // Native keeps the user's settings too.
  EXPECT_TRUE(plan_environment(Numerics::kNative).ready());
}

TEST(Numerics, PinsRetraceSetAreRenewedForPortableAndDroppedForNative) {
  EnvScope env{{"OPENBLAS_CORETYPE", "Haswell"},
               {"ATEN_CPU_CAPABILITY", "avx512"},
               {kPinnedVariable, "OPENBLAS_CORETYPE,ATEN_CPU_CAPABILITY"}};
  EnvPlan portable = plan_environment(Numerics::kPortable);
  // Ours and right: kept; ours and wrong: set again (never "respected": it was not the user's).
  EXPECT_FALSE(value_in(portable.set, "OPENBLAS_CORETYPE"));
  EXPECT_EQ(value_in(portable.set, "ATEN_CPU_CAPABILITY"), "avx2");
  EXPECT_TRUE(portable.respected.empty());
  EnvPlan native = plan_environment(Numerics::kNative);
  EXPECT_FALSE(native.ready());
  EXPECT_EQ(native.unset.size(), 2u);
}

TEST(Numerics, PortableRefusesACpuWithoutAvx2AndFmaNamingNative) {
  EnvScope env{{"RETRACE_CPU_FEATURES", "sse4_2,avx,popcnt"}};
  CpuFeatures cpu = detect_cpu_features();
  EXPECT_FALSE(cpu.x86_64_v3);
  try {
    check_cpu(Numerics::kPortable, cpu);
    FAIL() << "portable accepted a CPU without AVX2";
  } catch (const IoError& e) {  // exit code 4: an environment problem
    const std::string m = e.what();
    EXPECT_NE(m.find("avx2"), std::string::npos) << m;
    EXPECT_NE(m.find("fma"), std::string::npos) << m;
    EXPECT_NE(m.find("runtime.numerics=native"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(check_cpu(Numerics::kNative, cpu));
}

TEST(Numerics, AnX86_64_v3CpuIsAcceptedAndItsNotableFlagsListed) {
  EnvScope env{{"RETRACE_CPU_FEATURES", "avx2,fma,bmi1,bmi2,f16c,movbe,avx512f,avx512_bf16"}};
  CpuFeatures cpu = detect_cpu_features();
  EXPECT_TRUE(cpu.x86_64_v3);
  EXPECT_NO_THROW(check_cpu(Numerics::kPortable, cpu));
  EXPECT_EQ(cpu.flags, (std::vector<std::string>{"avx2", "fma", "avx512f", "avx512_bf16"}));
}

TEST(Numerics, PreparedTestProcessRunsWithThePins) {
  // numerics_main re-executed this binary: every pin is in force, and listed as retrace's own
  // unless the environment that started the tests set it.
  EXPECT_TRUE(plan_environment(Numerics::kPortable).ready());
  for (const auto& pin : portable_pins()) EXPECT_NE(std::getenv(pin.variable), nullptr) << pin.variable;
}

}  // namespace
}  // namespace retrace::train
