#include "pptrain/common/blas_kernels.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

using Names = std::vector<std::string>;

// The kernel sets Debian 12's OpenBLAS 0.3.21 holds (its gotoblas_* symbols).
const Names kDebianSets = {
    "Prescott", "Atom",        "Opteron_SSE3", "Core2",   "Nano",        "Barcelona", "Bobcat",
    "Penryn",   "Dunnington",  "Nehalem",      "Opteron", "Sandybridge", "Bulldozer", "Piledriver",
    "Haswell",  "Steamroller", "Excavator",    "Zen",     "SkylakeX",    "Cooperlake"};

CpuidWords vendor(const char* name) {
  CpuidWords w;
  std::memcpy(&w.vendor[0], name, 4);
  std::memcpy(&w.vendor[1], name + 4, 4);
  std::memcpy(&w.vendor[2], name + 8, 4);
  return w;
}

// What an Intel Xeon of family 6 model 207 (Emerald Rapids) reports under Linux: SSE3 to
// AVX-512 with BF16, AMX, and XCR0 saving the AVX, AVX-512 and tile registers.
CpuidWords xeon_model_207() {
  CpuidWords w = vendor("GenuineIntel");
  w.leaf1_ecx =
      (1u << 0) | (1u << 9) | (1u << 12) | (1u << 19) | (1u << 20) | (1u << 27) | (1u << 28);
  w.leaf7_ebx = (1u << 5) | (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);
  w.leaf7_edx = (1u << 22) | (1u << 24) | (1u << 25);
  w.leaf7_1_eax = 1u << 5;
  w.xcr0 = 0x600e7;
  return w;
}

TEST(CpuFeatures, XeonModel207RunsEverySet) {
  const CpuFeatures cpu = features_from_cpuid(xeon_model_207());
  EXPECT_FALSE(cpu.amd);
  EXPECT_TRUE(cpu.avx512 && cpu.avx512_bf16 && cpu.amx);
  EXPECT_EQ(runnable_kernels(cpu),
            (Names{"SapphireRapids", "Cooperlake", "SkylakeX", "Haswell", "Sandybridge", "Nehalem",
                   "Penryn", "Core2", "Prescott"}));
}

TEST(CpuFeatures, RegistersTheOsDoesNotSaveDoNotCount) {
  CpuidWords w = xeon_model_207();
  w.xcr0 = 0x7;  // AVX's registers saved, AVX-512's and the tiles' not
  EXPECT_EQ(runnable_kernels(features_from_cpuid(w)).front(), "Haswell");
  w.leaf1_ecx &= ~(1u << 27);  // no OSXSAVE: no AVX at all
  EXPECT_EQ(runnable_kernels(features_from_cpuid(w)).front(), "Nehalem");
}

TEST(CpuFeatures, AmdWithAvx512GetsZenAfterTheAvx512Sets) {
  CpuidWords w = xeon_model_207();
  const CpuidWords amd = vendor("AuthenticAMD");
  std::memcpy(w.vendor, amd.vendor, sizeof w.vendor);
  w.leaf7_edx = 0;  // no AMX
  EXPECT_EQ(runnable_kernels(features_from_cpuid(w)),
            (Names{"Cooperlake", "SkylakeX", "Zen", "Haswell", "Sandybridge", "Nehalem", "Penryn",
                   "Core2", "Prescott"}));
}

TEST(CpuFeatures, ThisCpuReadsWithoutCrashing) {
  const CpuFeatures cpu = cpu_features();
#if defined(__x86_64__)
  EXPECT_TRUE(cpu.sse3);  // every x86-64 CPU LibTorch runs on
#endif
  EXPECT_EQ(runnable_kernels(cpu).empty(), !cpu.sse3);
}

TEST(BetterKernels, AboveTheCurrentAndHeldByTheLibrary) {
  const CpuFeatures cpu = features_from_cpuid(xeon_model_207());
  // SapphireRapids is not in Debian's build; the equally ranked are not "better".
  EXPECT_EQ(
      better_kernels(cpu, "Prescott", kDebianSets),
      (Names{"Cooperlake", "SkylakeX", "Haswell", "Sandybridge", "Nehalem", "Penryn", "Core2"}));
  EXPECT_EQ(better_kernels(cpu, "Haswell", kDebianSets), (Names{"Cooperlake", "SkylakeX"}));
  EXPECT_TRUE(better_kernels(cpu, "Cooperlake", kDebianSets).empty());
  EXPECT_TRUE(better_kernels(cpu, "Prescott", {}).empty());  // no DYNAMIC_ARCH
  // A name this table does not know (a newer OpenBLAS's) is never replaced.
  EXPECT_TRUE(better_kernels(cpu, "GraniteRapids", kDebianSets).empty());
  EXPECT_EQ(kernel_rank("GraniteRapids"), -1);
}

TEST(ChoiceNote, RoundTripsAndRejectsWhatItDidNotWrite) {
  BlasChoiceNote note;
  note.state = BlasChoiceNote::State::kChecked;
  note.kernels = "SkylakeX";
  note.detected = "Prescott";
  note.failed = {"Cooperlake"};
  EXPECT_EQ(note.to_string(), "checked:SkylakeX:Prescott:Cooperlake");
  const auto back = BlasChoiceNote::parse(note.to_string());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->to_string(), note.to_string());
  EXPECT_EQ(BlasChoiceNote::parse("kept:Haswell:Haswell:")->failed, Names{});
  for (const char* bad : {"", "checked", "done:Haswell:Haswell:", "checked:Fast:Haswell:",
                          "checked:Haswell:Haswell:Fast", "kept:Haswell:Haswell"}) {
    EXPECT_FALSE(BlasChoiceNote::parse(bad)) << bad;
  }
}

BlasEnvironment environment(const std::string& pptrain_blas, const std::string& coretype,
                            const std::string& choice = "", const std::string& test = "") {
  BlasEnvironment env;
  env.pptrain_blas = pptrain_blas;
  env.coretype = coretype;
  env.choice = choice;
  env.test_detected = test;
  return env;
}

TEST(BlasPolicy, UsersSettingAndSystemAreKept) {
  EXPECT_EQ(blas_policy(environment("", "")), BlasPolicy::kChoose);
  EXPECT_EQ(blas_policy(environment("pptrain", "")), BlasPolicy::kChoose);
  EXPECT_EQ(blas_policy(environment("system", "")), BlasPolicy::kSystem);
  EXPECT_EQ(blas_policy(environment("system", "Prescott")), BlasPolicy::kSystem);
  EXPECT_EQ(blas_policy(environment("", "Haswell")), BlasPolicy::kUser);
  // The tests' stand-in for OpenBLAS's own detection is not the user's setting.
  EXPECT_EQ(blas_policy(environment("", "Prescott", "", "Prescott")), BlasPolicy::kChoose);
  EXPECT_EQ(blas_policy(environment("", "Haswell", "", "Prescott")), BlasPolicy::kUser);
  // pptrain's note counts while the environment still says what it set.
  EXPECT_EQ(blas_policy(environment("", "Cooperlake", "checked:Cooperlake:Prescott:")),
            BlasPolicy::kChosen);
  EXPECT_EQ(blas_policy(environment("", "", "kept:Cooperlake:Cooperlake:")), BlasPolicy::kChosen);
  EXPECT_EQ(blas_policy(environment("", "Haswell", "checked:Cooperlake:Prescott:")),
            BlasPolicy::kUser);
  EXPECT_EQ(blas_policy(environment("", "Haswell", "kept:Cooperlake:Cooperlake:")),
            BlasPolicy::kUser);
  EXPECT_EQ(blas_policy(environment("", "", "checked:Cooperlake:Prescott:")), BlasPolicy::kChoose);
  EXPECT_EQ(blas_policy(environment("", "", "garbage")), BlasPolicy::kChoose);
  try {
    blas_policy(environment("fast", ""));
    FAIL() << "PPTRAIN_BLAS=fast was accepted";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "PPTRAIN_BLAS must be 'pptrain' or 'system', got 'fast'");
  }
}

// A stand-in for OpenBLAS in child processes: `detected` when loaded by itself; a set it holds
// when asked for one (another name falls back to `detected`, as OpenBLAS does); the sets in
// `wrong` compute wrong products. Records every round of probes.
struct FakeOpenBlas {
  std::string detected = "Prescott";
  Names available = kDebianSets;
  Names wrong;
  bool installed = true;
  std::vector<Names> rounds;

  BlasProber prober() {
    return [this](const Names& asked) {
      rounds.push_back(asked);
      std::vector<OpenBlasState> states;
      for (const std::string& kernels : asked) {
        OpenBlasState state;
        state.loaded = installed;
        state.version = "OpenBLAS 0.3.21";
        state.available = available;
        const bool held = std::find(available.begin(), available.end(), kernels) != available.end();
        state.kernels = held ? kernels : detected;
        state.product_ok =
            std::find(wrong.begin(), wrong.end(), state.kernels) == wrong.end() && installed;
        states.push_back(state);
      }
      return states;
    };
  }
};

std::string value_set(const EnvChanges& env, const std::string& name) {
  for (const auto& [key, value] : env.set) {
    if (key == name) return value;
  }
  return "(not set)";
}

const CpuFeatures kXeon = features_from_cpuid(xeon_model_207());

TEST(ChooseBeforeLoad, PicksTheBestCheckedSetOnACpuOpenBlasDoesNotKnow) {
  FakeOpenBlas blas;
  const BlasChoice choice = choose_before_load(environment("", ""), kXeon, blas.prober());
  EXPECT_EQ(value_set(choice.env, "OPENBLAS_CORETYPE"), "Cooperlake");
  EXPECT_EQ(value_set(choice.env, "PPTRAIN_BLAS_CHOICE"), "checked:Cooperlake:Prescott:");
  EXPECT_TRUE(choice.env.unset.empty());
  EXPECT_EQ(choice.line,
            "BLAS: OpenBLAS 0.3.21 with Cooperlake kernels, chosen by pptrain for this CPU and "
            "checked (OpenBLAS's own choice: Prescott; PPTRAIN_BLAS=system keeps it)");
  // The own choice alone, then the better sets the build holds two at a time (SapphireRapids,
  // which this CPU runs, is not in it).
  EXPECT_EQ(blas.rounds, (std::vector<Names>{{""}, {"Cooperlake", "SkylakeX"}}));
}

TEST(ChooseBeforeLoad, ASetThatComputesWrongIsNeverUsed) {
  FakeOpenBlas blas;
  blas.wrong = {"Cooperlake"};
  const BlasChoice choice = choose_before_load(environment("", ""), kXeon, blas.prober());
  EXPECT_EQ(value_set(choice.env, "OPENBLAS_CORETYPE"), "SkylakeX");
  EXPECT_EQ(value_set(choice.env, "PPTRAIN_BLAS_CHOICE"), "checked:SkylakeX:Prescott:Cooperlake");
  EXPECT_NE(choice.line.find("Cooperlake not usable here"), std::string::npos) << choice.line;
  EXPECT_EQ(blas.rounds.size(), 2u);
}

TEST(ChooseBeforeLoad, KeepsOpenBlasOwnChoiceWhenEveryBetterSetFails) {
  FakeOpenBlas blas;
  blas.detected = "Sandybridge";
  blas.wrong = {"Cooperlake", "SkylakeX", "Haswell"};
  const BlasChoice choice = choose_before_load(environment("", ""), kXeon, blas.prober());
  EXPECT_EQ(value_set(choice.env, "OPENBLAS_CORETYPE"), "(not set)");
  EXPECT_EQ(value_set(choice.env, "PPTRAIN_BLAS_CHOICE"),
            "kept:Sandybridge:Sandybridge:Cooperlake,SkylakeX,Haswell");
  EXPECT_EQ(choice.line,
            "BLAS: OpenBLAS 0.3.21 with Sandybridge kernels, OpenBLAS's own choice: Cooperlake, "
            "SkylakeX, Haswell not usable here (not loaded when asked, or a wrong product)");
  EXPECT_EQ(blas.rounds, (std::vector<Names>{{""}, {"Cooperlake", "SkylakeX"}, {"Haswell"}}));
}

TEST(ChooseBeforeLoad, ASetTheLibraryIgnoresFailsToo) {
  FakeOpenBlas blas;
  blas.available = {"Prescott", "Haswell"};  // asked for anything else, it runs Prescott
  const BlasChoice choice = choose_before_load(environment("", ""), kXeon, blas.prober());
  EXPECT_EQ(value_set(choice.env, "OPENBLAS_CORETYPE"), "Haswell");
}

TEST(ChooseBeforeLoad, OwnChoiceAlreadyTheBestChangesNothingButTheNote) {
  FakeOpenBlas blas;
  blas.detected = "Cooperlake";
  const BlasChoice choice = choose_before_load(environment("", ""), kXeon, blas.prober());
  EXPECT_EQ(value_set(choice.env, "OPENBLAS_CORETYPE"), "(not set)");
  EXPECT_EQ(value_set(choice.env, "PPTRAIN_BLAS_CHOICE"), "kept:Cooperlake:Cooperlake:");
  EXPECT_EQ(choice.line, "");
  EXPECT_EQ(blas.rounds.size(), 1u);
}

TEST(ChooseBeforeLoad, UsersSettingSystemAndAnEarlierChoiceProbeNothing) {
  for (const BlasEnvironment& env :
       {environment("", "Haswell"), environment("system", ""), environment("system", "Prescott"),
        environment("", "Cooperlake", "checked:Cooperlake:Prescott:")}) {
    FakeOpenBlas blas;
    const BlasChoice choice = choose_before_load(env, kXeon, blas.prober());
    EXPECT_TRUE(choice.env.empty());
    EXPECT_EQ(choice.line, "");
    EXPECT_TRUE(blas.rounds.empty());
  }
}

TEST(ChooseBeforeLoad, TheTestsStandInIsReplaced) {
  FakeOpenBlas blas;
  const BlasChoice choice =
      choose_before_load(environment("", "Prescott", "", "Prescott"), kXeon, blas.prober());
  EXPECT_EQ(value_set(choice.env, "OPENBLAS_CORETYPE"), "Cooperlake");
}

TEST(ChooseBeforeLoad, WithoutOpenBlasNothingChanges) {
  FakeOpenBlas blas;
  blas.installed = false;
  EXPECT_TRUE(choose_before_load(environment("", ""), kXeon, blas.prober()).env.empty());
  EXPECT_TRUE(choose_before_load(environment("", ""), CpuFeatures{}, blas.prober()).env.empty());
}

OpenBlasState loaded(const std::string& kernels) {
  OpenBlasState state;
  state.loaded = true;
  state.version = "OpenBLAS 0.3.21";
  state.kernels = kernels;
  state.available = kDebianSets;
  return state;
}

// The environment after `changes`, as the program started again sees it.
BlasEnvironment after(BlasEnvironment env, const EnvChanges& changes) {
  for (const std::string& name : changes.unset) {
    if (name == "OPENBLAS_CORETYPE") env.coretype.clear();
  }
  for (const auto& [name, value] : changes.set) {
    if (name == "OPENBLAS_CORETYPE") env.coretype = value;
    if (name == "PPTRAIN_BLAS_CHOICE") env.choice = value;
  }
  return env;
}

// pptrain-runtime started directly, again and again until it stops starting itself: the
// OPENBLAS_CORETYPE of each start and the last line.
struct Starts {
  Names coretypes;
  std::string line;
  bool changed = false;
  BlasEnvironment last;
};
Starts run_starts(BlasEnvironment env, const std::string& detected, const Names& wrong) {
  Starts starts;
  for (int start = 0; start < 20; ++start) {
    starts.coretypes.push_back(env.coretype);
    const bool stand_in = !env.test_detected.empty() && env.coretype == env.test_detected;
    const std::string runs = env.coretype.empty() || stand_in ? detected : env.coretype;
    bool checked = false;
    const SettleStep step = settle_after_load(env, kXeon, loaded(runs), [&] {
      checked = true;
      return std::find(wrong.begin(), wrong.end(), runs) == wrong.end();
    });
    const auto note = BlasChoiceNote::parse(env.choice);
    EXPECT_EQ(checked, note && note->state == BlasChoiceNote::State::kUnchecked)
        << "a start checks only the set it was started to check";
    env = after(env, step.env);
    if (!step.reexec) {
      starts.line = step.line;
      starts.changed = step.changed;
      starts.last = env;
      return starts;
    }
  }
  ADD_FAILURE() << "pptrain-runtime kept starting itself";
  return starts;
}

TEST(SettleAfterLoad, StartsAgainOnceWithTheBestSetAndChecksIt) {
  const Starts starts = run_starts(environment("", ""), "Prescott", {});
  EXPECT_EQ(starts.coretypes, (Names{"", "Cooperlake"}));
  EXPECT_EQ(starts.last.choice, "checked:Cooperlake:Prescott:");
  EXPECT_TRUE(starts.changed);
  EXPECT_EQ(starts.line,
            "BLAS: OpenBLAS 0.3.21 with Cooperlake kernels, chosen by pptrain for this CPU and "
            "checked (OpenBLAS's own choice: Prescott; PPTRAIN_BLAS=system keeps it)");
}

TEST(SettleAfterLoad, FailedSetsAreLeftOneStartEachThenOpenBlasOwnChoice) {
  Starts starts = run_starts(environment("", ""), "Prescott", {"Cooperlake"});
  EXPECT_EQ(starts.coretypes, (Names{"", "Cooperlake", "SkylakeX"}));
  EXPECT_EQ(starts.last.choice, "checked:SkylakeX:Prescott:Cooperlake");

  starts = run_starts(environment("", ""), "Haswell", {"Cooperlake", "SkylakeX"});
  EXPECT_EQ(starts.coretypes, (Names{"", "Cooperlake", "SkylakeX", ""}));
  EXPECT_EQ(starts.last.coretype, "");
  EXPECT_EQ(starts.last.choice, "kept:Haswell:Haswell:Cooperlake,SkylakeX");
  EXPECT_TRUE(starts.changed);  // nothing changed, but a set failed: worth a line
  EXPECT_EQ(starts.line,
            "BLAS: OpenBLAS 0.3.21 with Haswell kernels, OpenBLAS's own choice: Cooperlake, "
            "SkylakeX not usable here (not loaded when asked, or a wrong product)");

  // With the tests' stand-in, OpenBLAS's "own choice" comes back as the stand-in.
  starts = run_starts(environment("", "Sandybridge", "", "Sandybridge"), "Sandybridge",
                      {"Cooperlake", "SkylakeX", "Haswell"});
  EXPECT_EQ(starts.coretypes.back(), "Sandybridge");
  EXPECT_EQ(starts.coretypes.size(), 5u);
}

TEST(SettleAfterLoad, AStartFromThePlannerTrustsItsCheck) {
  const Starts starts =
      run_starts(environment("", "Cooperlake", "checked:Cooperlake:Prescott:"), "Prescott", {});
  EXPECT_EQ(starts.coretypes.size(), 1u);
  EXPECT_NE(starts.line.find("chosen by pptrain"), std::string::npos);
  EXPECT_TRUE(starts.changed);
}

TEST(SettleAfterLoad, OwnChoiceBestUserAndSystemStartOnce) {
  Starts starts = run_starts(environment("", ""), "Cooperlake", {});
  EXPECT_EQ(starts.coretypes.size(), 1u);
  EXPECT_EQ(starts.last.choice, "kept:Cooperlake:Cooperlake:");
  EXPECT_FALSE(starts.changed);
  EXPECT_EQ(starts.line,
            "BLAS: OpenBLAS 0.3.21 with Cooperlake kernels, OpenBLAS's own choice, the best it has "
            "for this CPU");

  starts = run_starts(environment("", "Haswell"), "Prescott", {});
  EXPECT_EQ(starts.coretypes.size(), 1u);
  EXPECT_FALSE(starts.changed);
  EXPECT_EQ(starts.line,
            "BLAS: OpenBLAS 0.3.21 with Haswell kernels, as OPENBLAS_CORETYPE asks (yours; pptrain "
            "would try Cooperlake without it)");

  starts = run_starts(environment("system", "Prescott"), "Haswell", {});
  EXPECT_EQ(starts.coretypes.size(), 1u);
  EXPECT_EQ(starts.line,
            "BLAS: OpenBLAS 0.3.21 with Prescott kernels, as OPENBLAS_CORETYPE asks "
            "(PPTRAIN_BLAS=system)");

  starts = run_starts(environment("system", ""), "Prescott", {});
  EXPECT_EQ(starts.line,
            "BLAS: OpenBLAS 0.3.21 with Prescott kernels, OpenBLAS's own choice "
            "(PPTRAIN_BLAS=system; pptrain would try Cooperlake)");
}

TEST(SettleAfterLoad, NoOpenBlasNoLine) {
  const SettleStep step = settle_after_load(environment("", ""), kXeon, OpenBlasState{}, [] {
    ADD_FAILURE() << "nothing to check";
    return false;
  });
  EXPECT_FALSE(step.reexec);
  EXPECT_TRUE(step.env.empty());
  EXPECT_EQ(step.line, "");
}

TEST(WarningAfterLoad, SaysHowWhenBetterKernelsExist) {
  const std::string warning =
      blas_warning_after_load(environment("", ""), kXeon, loaded("Prescott"));
  EXPECT_NE(warning.find("import pptrain before torch"), std::string::npos) << warning;
  EXPECT_NE(warning.find("Cooperlake"), std::string::npos) << warning;
  EXPECT_EQ(warning.find('\n'), std::string::npos);
  EXPECT_EQ(blas_warning_after_load(environment("", ""), kXeon, loaded("Cooperlake")), "");
  EXPECT_EQ(blas_warning_after_load(environment("system", ""), kXeon, loaded("Prescott")), "");
  EXPECT_EQ(blas_warning_after_load(environment("", "Prescott"), kXeon, loaded("Prescott")), "");
}

// Column-major C = alpha op(A) op(B) + beta C, as a BLAS computes it; `skew` adds an error to one
// element, as a broken kernel would.
float g_skew = 0;
void plain_sgemm(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                 const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                 const float* beta, float* c, const int* ldc) {
  for (int j = 0; j < *n; ++j) {
    for (int i = 0; i < *m; ++i) {
      float sum = 0;
      for (int l = 0; l < *k; ++l) {
        const float x = *transa == 'N' ? a[l * *lda + i] : a[i * *lda + l];
        const float y = *transb == 'N' ? b[j * *ldb + l] : b[l * *ldb + j];
        sum += x * y;
      }
      c[j * *ldc + i] = *alpha * sum + *beta * c[j * *ldc + i];
    }
  }
  c[*ldc + 1] += g_skew;
}

TEST(ProductCheck, ARightProductPassesAndAWrongOneFails) {
  g_skew = 0;
  EXPECT_TRUE(sgemm_matches_reference(&plain_sgemm));
  g_skew = 0.01f;
  EXPECT_FALSE(sgemm_matches_reference(&plain_sgemm));
  g_skew = std::nanf("");
  EXPECT_FALSE(sgemm_matches_reference(&plain_sgemm));
  g_skew = 0;
}

// The real thing on this machine: OpenBLAS loaded in child processes (skipped without it).
TEST(ProbeOpenBlas, ChildrenLoadTheSetTheyAreGivenAndCheckIt) {
  if (dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD) != nullptr) {
    GTEST_SKIP() << "OpenBLAS is loaded in this process already";  // not in pptrain::plan's tests
  }
  const std::vector<OpenBlasState> own = probe_openblas({"", "Prescott", "NoSuchKernels"});
  ASSERT_EQ(own.size(), 3u);
  if (!own[0].loaded) GTEST_SKIP() << "no libopenblas.so.0 on this machine";
  EXPECT_EQ(own[0].version.rfind("OpenBLAS ", 0), 0u) << own[0].version;
  EXPECT_FALSE(own[0].product_ok);  // OpenBLAS's own choice is not checked: it is kept anyway
  if (own[0].available.empty()) GTEST_SKIP() << "this OpenBLAS holds one kernel set only";
  EXPECT_EQ(own[1].kernels, "Prescott");
  EXPECT_TRUE(own[1].product_ok);
  EXPECT_NE(own[2].kernels, "NoSuchKernels");  // OpenBLAS falls back to its own detection
  // The best set this CPU runs that the library holds loads and computes right here.
  const CpuFeatures cpu = cpu_features();
  const Names better = better_kernels(cpu, "Prescott", own[0].available);
  if (better.empty()) GTEST_SKIP() << "nothing above Prescott for this CPU";
  const OpenBlasState best = probe_openblas({better.front()}).at(0);
  EXPECT_EQ(best.kernels, better.front());
  EXPECT_TRUE(best.product_ok);
}

}  // namespace
}  // namespace pptrain
