// Which of OpenBLAS's kernel sets computes LibTorch's matrix products, chosen for this CPU.
//
// OpenBLAS built for several CPUs (DYNAMIC_ARCH, as Debian's is) picks its kernels once, when it
// loads, from the CPU's model number; a model it does not know gets its most generic x86-64
// kernels. Debian 12's OpenBLAS 0.3.21 runs Prescott's (SSE3) on an Intel Xeon of family 6 model
// 207, which has AVX-512: a gpt step 3-4x slower than with SkylakeX's, for the same losses. Only
// OPENBLAS_CORETYPE, read as the library loads, overrides it. So before OpenBLAS loads, pptrain
// takes the best kernel set that the CPU's features (cpuid, and the registers the OS saves) allow,
// that the installed OpenBLAS holds and that computes a product right in a process where it runs
// (against a plain loop in double: a set that computes wrong results here is never used), and
// sets OPENBLAS_CORETYPE to it. Where:
//
//   pptrain (the planner; no LibTorch)  choose_blas_kernels(): a child process per kernel set
//                                       loads OpenBLAS with it and checks it; the planner sets
//                                       the environment, then runs pptrain-runtime (execv)
//   pptrain-runtime                     settle_blas_kernels(argv), first in main(): OpenBLAS is
//                                       loaded already, so when a better set exists the program
//                                       runs itself again with it and checks it there (a forked
//                                       child computes the product), once per set tried
//   import pptrain (Python)             choose_blas_kernels() while torch is not loaded;
//                                       after it, blas_warning_after_load(): one line saying how
//
// Environment: PPTRAIN_BLAS=pptrain (the default) chooses, PPTRAIN_BLAS=system keeps OpenBLAS's
// own choice (another value is a UserError); an OPENBLAS_CORETYPE of the user's own is kept.
// pptrain leaves a note for the processes it starts, PPTRAIN_BLAS_CHOICE (BlasChoiceNote), so that
// they trust the choice instead of making it again. For tests, PPTRAIN_BLAS_TEST_DETECTED=X makes
// an OPENBLAS_CORETYPE equal to X stand for OpenBLAS's own detection rather than the user's
// setting: OpenBLAS then runs X as it would on a CPU it does not know, and pptrain chooses as it
// would there.
//
// A BLAS other than OpenBLAS, a non-x86-64 CPU or an OpenBLAS without DYNAMIC_ARCH: nothing is
// changed. Nothing here needs LibTorch: the planner, which links no LibTorch, calls it too.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pptrain {

// The CPU features that decide which kernel sets can run. A vector extension counts only when
// the OS saves its registers (XCR0), as OpenBLAS and LibTorch require.
struct CpuFeatures {
  bool amd = false;  // AuthenticAMD or HygonGenuine: OpenBLAS's Zen kernels are meant for it
  bool sse3 = false, ssse3 = false, sse4_1 = false, sse4_2 = false;
  bool avx = false;
  bool avx2 = false;         // with FMA3
  bool avx512 = false;       // F, DQ, CD, BW and VL: what OpenBLAS's SkylakeX kernels use
  bool avx512_bf16 = false;  // Cooper Lake's addition
  bool amx = false;          // AMX tiles with BF16 and INT8
};

// The cpuid and XCR0 words CpuFeatures is read from: leaf 0's vendor (EBX, EDX, ECX), leaf 1's
// ECX, leaf 7 subleaf 0's EBX and EDX, leaf 7 subleaf 1's EAX, and XCR0 (0 without OSXSAVE).
struct CpuidWords {
  uint32_t vendor[3] = {0, 0, 0};
  uint32_t leaf1_ecx = 0;
  uint32_t leaf7_ebx = 0, leaf7_edx = 0;
  uint32_t leaf7_1_eax = 0;
  uint64_t xcr0 = 0;
};
CpuFeatures features_from_cpuid(const CpuidWords& words);
// This CPU's (all false off x86-64).
CpuFeatures cpu_features();

// OpenBLAS's x86-64 kernel sets this CPU can run, by the names OPENBLAS_CORETYPE takes, best
// first ("Cooperlake", "SkylakeX", ..., "Prescott").
std::vector<std::string> runnable_kernels(const CpuFeatures& cpu);
// A kernel set's place by the width of its vectors (Prescott 1 ... SapphireRapids 9): on a CPU
// that runs two sets, the higher is the faster. -1 for a name not known here, which pptrain never
// replaces (a newer OpenBLAS knows better).
int kernel_rank(const std::string& kernels);
// The sets this CPU runs, `available` holds and that rank above `current`, best first.
std::vector<std::string> better_kernels(const CpuFeatures& cpu, const std::string& current,
                                        const std::vector<std::string>& available);

// What one process found of OpenBLAS.
struct OpenBlasState {
  bool loaded = false;                 // OpenBLAS is there (loaded by LibTorch, or by the probe)
  std::string version;                 // "OpenBLAS 0.3.21"
  std::string kernels;                 // the set it runs (openblas_get_corename)
  std::vector<std::string> available;  // the sets it holds (DYNAMIC_ARCH; empty without)
  bool product_ok = false;             // its sgemm_ matched the reference (when it was checked)
};

// Fortran's sgemm_ as OpenBLAS exports it: C = alpha op(A) op(B) + beta C, column-major.
using SgemmFn = void (*)(const char* transa, const char* transb, const int* m, const int* n,
                         const int* k, const float* alpha, const float* a, const int* lda,
                         const float* b, const int* ldb, const float* beta, float* c,
                         const int* ldc);
// Whether `sgemm` computes three products (NN, NT, TN, sizes that leave partial tiles, one large
// enough for OpenBLAS's packed path) within float rounding of a double-precision loop: about
// 1.5 million multiply-adds, a few ms.
bool sgemm_matches_reference(SgemmFn sgemm);

// The environment variables that steer the choice.
struct BlasEnvironment {
  std::string pptrain_blas;   // PPTRAIN_BLAS: "", "pptrain" or "system"
  std::string coretype;       // OPENBLAS_CORETYPE
  std::string choice;         // PPTRAIN_BLAS_CHOICE: a BlasChoiceNote
  std::string test_detected;  // PPTRAIN_BLAS_TEST_DETECTED
  static BlasEnvironment read();
};

// What pptrain chose, for the processes it starts (PPTRAIN_BLAS_CHOICE), as
// "<state>:<kernels>:<detected>:<failed>,<failed>".
struct BlasChoiceNote {
  enum class State {
    kChecked,    // OPENBLAS_CORETYPE = kernels, checked in a process that ran them
    kUnchecked,  // OPENBLAS_CORETYPE = kernels, to be checked by the process started with it
    kKept,       // OpenBLAS's own choice (`detected`) stays: none better, or all failed the check
  };
  State state = State::kKept;
  std::string kernels;              // the set in effect
  std::string detected;             // OpenBLAS's own choice on this CPU
  std::vector<std::string> failed;  // sets that failed the check, best first
  std::string to_string() const;
  static std::optional<BlasChoiceNote> parse(const std::string& text);
};

enum class BlasPolicy {
  kChoose,  // pptrain chooses
  kSystem,  // PPTRAIN_BLAS=system: OpenBLAS's own choice
  kUser,    // the user's OPENBLAS_CORETYPE
  kChosen,  // a process that started this one chose already (its note matches the environment)
};
// Throws UserError for a PPTRAIN_BLAS other than "pptrain" and "system".
BlasPolicy blas_policy(const BlasEnvironment& env);

// Changes to the environment: unset first, then set.
struct EnvChanges {
  std::vector<std::string> unset;
  std::vector<std::pair<std::string, std::string>> set;
  bool empty() const { return unset.empty() && set.empty(); }
};

// The choice made before OpenBLAS loads: the environment to set, and a line for the user when
// pptrain changed the kernels or kept them after a failed check (empty otherwise).
struct BlasChoice {
  EnvChanges env;
  std::string line;
};
// Loads OpenBLAS in one fresh process per entry of `kernels` ("" for as it loads by itself:
// OPENBLAS_CORETYPE as in the environment), all at once, and reports each: what it runs, what it
// holds and whether its product is right (not checked for ""). A process that crashes reports a
// failed product. choose_before_load() asks for "" alone, then for the better sets two at a time.
using BlasProber = std::function<std::vector<OpenBlasState>(const std::vector<std::string>&)>;
BlasChoice choose_before_load(const BlasEnvironment& env, const CpuFeatures& cpu,
                              const BlasProber& probe);
// The BlasProber of choose_blas_kernels(): forked children that load libopenblas.so.0 (one
// thread, OPENBLAS_VERBOSE unset, output to /dev/null), killed after 10 s. Each child costs what
// loading OpenBLAS costs, about 10 ms.
std::vector<OpenBlasState> probe_openblas(const std::vector<std::string>& kernels);
// choose_before_load() for this process (its environment, its CPU, child processes as probes),
// which must not have loaded OpenBLAS: it applies nothing.
BlasChoice choose_blas_kernels();
// Applies `changes` to this process's environment (setenv, unsetenv).
void apply_env(const EnvChanges& changes);

// What a process with OpenBLAS loaded does at its start (pptrain-runtime).
struct SettleStep {
  EnvChanges env;        // for this process and those it starts
  bool reexec = false;   // then run this program again, with OPENBLAS_CORETYPE changed
  std::string line;      // what runs (see blas_kernels_line()); empty when reexec or no OpenBLAS
  bool changed = false;  // pptrain's choice differs from OpenBLAS's own, or a set failed
};
// `loaded` is what runs in this process; `check_here` computes the product with it (in a child,
// so a crash is a failed check) and is only called for a set this process is to check.
SettleStep settle_after_load(const BlasEnvironment& env, const CpuFeatures& cpu,
                             const OpenBlasState& loaded, const std::function<bool()>& check_here);
// settle_after_load() in this process: applies the environment and, for a re-execution, runs
// /proc/self/exe with `argv` (no return unless it fails, when the process goes on with what it
// has). Keeps the line for blas_kernels_line(). Throws UserError for a bad PPTRAIN_BLAS.
void settle_blas_kernels(char** argv);
// One line saying which kernels this process's OpenBLAS runs and why ("BLAS: OpenBLAS 0.3.21
// with Cooperlake kernels, chosen by pptrain ..."), set by settle_blas_kernels() (a forked child
// has its parent's); empty before, and when LibTorch's BLAS is not OpenBLAS.
const std::string& blas_kernels_line();
// Whether that line says pptrain changed the kernels (or found a set that fails its check).
bool blas_kernels_changed();

// For a process that loaded OpenBLAS before pptrain could choose (Python, torch imported first):
// one line saying how to get better kernels when the policy is kChoose and the CPU runs better
// sets than `loaded`'s; empty otherwise.
std::string blas_warning_after_load(const BlasEnvironment& env, const CpuFeatures& cpu,
                                    const OpenBlasState& loaded);
// What this process's OpenBLAS runs, if it is loaded (not loaded otherwise; nothing is loaded).
OpenBlasState loaded_openblas();

}  // namespace pptrain
