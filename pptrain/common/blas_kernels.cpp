#include "pptrain/common/blas_kernels.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "pptrain/common/check.h"

namespace pptrain {

namespace {

// The soname LibTorch links (Debian's libopenblas0-pthread and -openmp both provide it).
constexpr const char* kOpenBlasLibrary = "libopenblas.so.0";
constexpr const char* kChoiceVariable = "PPTRAIN_BLAS_CHOICE";
constexpr const char* kCoretypeVariable = "OPENBLAS_CORETYPE";
// A probe or a check that takes longer is taken for a hang: killed, and failed.
constexpr auto kChildDeadline = std::chrono::seconds(10);

// OpenBLAS's x86-64 kernel sets (its `corename` table, DYNAMIC_ARCH) by the width of their
// vectors, with the symbol of each one's table in the library (gotoblas_<SYMBOL>), which says
// whether the installed build holds it.
struct KernelSet {
  const char* name;
  const char* symbol;
  int rank;
};
constexpr KernelSet kKernelSets[] = {
    {"Katmai", "KATMAI", 0},
    {"Coppermine", "COPPERMINE", 0},
    {"Northwood", "NORTHWOOD", 0},
    {"Banias", "BANIAS", 0},
    {"Athlon", "ATHLON", 0},
    {"Opteron", "OPTERON", 0},
    {"Prescott", "PRESCOTT", 1},
    {"Atom", "ATOM", 1},
    {"Opteron_SSE3", "OPTERON_SSE3", 1},
    {"Core2", "CORE2", 2},
    {"Nano", "NANO", 2},
    {"Barcelona", "BARCELONA", 2},
    {"Bobcat", "BOBCAT", 2},
    {"Penryn", "PENRYN", 3},
    {"Dunnington", "DUNNINGTON", 3},
    {"Nehalem", "NEHALEM", 4},
    {"Sandybridge", "SANDYBRIDGE", 5},
    {"Bulldozer", "BULLDOZER", 5},
    {"Piledriver", "PILEDRIVER", 5},
    {"Steamroller", "STEAMROLLER", 5},
    {"Excavator", "EXCAVATOR", 5},
    {"Haswell", "HASWELL", 6},
    {"Zen", "ZEN", 6},
    {"SkylakeX", "SKYLAKEX", 7},
    {"Cooperlake", "COOPERLAKE", 8},
    {"SapphireRapids", "SAPPHIRERAPIDS", 9},
};

bool bit(uint64_t word, int n) {
  return (word >> n) & 1;
}

std::string join(const std::vector<std::string>& names, const char* separator) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : separator) + name;
  return out;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.emplace_back();
  return parts;
}

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// ---- What a process's OpenBLAS is ----

// The version, kernels and kernel sets of the OpenBLAS behind `handle`.
OpenBlasState state_of(void* handle) {
  OpenBlasState state;
  using Text = const char* (*)();
  const auto corename = reinterpret_cast<Text>(dlsym(handle, "openblas_get_corename"));
  const auto config = reinterpret_cast<Text>(dlsym(handle, "openblas_get_config"));
  if (!corename || !config) return state;
  state.loaded = true;
  state.kernels = corename();
  // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64": its first two words.
  const std::vector<std::string> words = split(config(), ' ');
  state.version = words.size() >= 2 ? words[0] + " " + words[1] : "OpenBLAS";
  for (const KernelSet& set : kKernelSets) {
    if (dlsym(handle, (std::string("gotoblas_") + set.symbol).c_str())) {
      state.available.push_back(set.name);
    }
  }
  return state;
}

// Whether the library file that `address` lies in is an OpenBLAS one (Debian's own libblas.so.3
// of OpenBLAS lives in .../openblas-pthread/ or .../openblas-openmp/).
bool in_openblas_file(void* address) {
  Dl_info info{};
  if (!dladdr(address, &info) || !info.dli_fname) return false;
  char* real = realpath(info.dli_fname, nullptr);
  const std::string path = real ? real : info.dli_fname;
  std::free(real);
  return path.find("openblas") != std::string::npos;
}

// ---- Child processes ----

// Waits for `pid` until `deadline`, then kills it; whether it exited with status 0.
bool child_succeeded(pid_t pid, std::chrono::steady_clock::time_point deadline) {
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (done < 0) return false;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void quiet_child_output() {
  const int null = open("/dev/null", O_WRONLY);
  if (null >= 0) {
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    close(null);
  }
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// The body of a probe process: loads OpenBLAS with `kernels` (or as it loads by itself), writes
// "version\nkernels\navailable...\n", checks the product and writes "ok\n" or "wrong\n". A crash
// in the check leaves the last line out.
[[noreturn]] void run_probe(const std::string& kernels, int fd) {
  quiet_child_output();
  if (!kernels.empty()) setenv(kCoretypeVariable, kernels.c_str(), 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);  // the path a worker takes: one compute thread
  unsetenv("OPENBLAS_VERBOSE");
  void* handle = dlopen(kOpenBlasLibrary, RTLD_NOW | RTLD_LOCAL);
  const OpenBlasState state = handle ? state_of(handle) : OpenBlasState{};
  if (!state.loaded) _exit(0);
  write_all(fd, state.version + "\n" + state.kernels + "\n" + join(state.available, " ") + "\n");
  if (kernels.empty()) _exit(0);  // OpenBLAS's own choice is kept whatever it computes
  const auto sgemm = reinterpret_cast<SgemmFn>(dlsym(handle, "sgemm_"));
  write_all(fd, sgemm && sgemm_matches_reference(sgemm) ? "ok\n" : "wrong\n");
  _exit(0);
}

OpenBlasState parse_probe(const std::string& text, bool exited_cleanly) {
  OpenBlasState state;
  const std::vector<std::string> lines = split(text, '\n');
  if (lines.size() < 3) return state;
  state.loaded = true;
  state.version = lines[0];
  state.kernels = lines[1];
  for (const std::string& name : split(lines[2], ' ')) {
    if (!name.empty()) state.available.push_back(name);
  }
  state.product_ok = exited_cleanly && lines.size() >= 4 && lines[3] == "ok";
  return state;
}

}  // namespace

// The real BlasProber: a forked process per entry, all at once, each reporting through a pipe.
std::vector<OpenBlasState> probe_openblas(const std::vector<std::string>& kernel_sets) {
  struct Child {
    pid_t pid = -1;
    int fd = -1;
    std::string text;
  };
  std::vector<Child> children(kernel_sets.size());
  for (size_t i = 0; i < kernel_sets.size(); ++i) {
    int fds[2];
    if (pipe(fds) != 0) break;
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      run_probe(kernel_sets[i], fds[1]);
    }
    close(fds[1]);
    if (pid < 0) {
      close(fds[0]);
      break;
    }
    children[i].pid = pid;
    children[i].fd = fds[0];
  }
  const auto deadline = std::chrono::steady_clock::now() + kChildDeadline;
  std::vector<OpenBlasState> states;
  for (Child& child : children) {
    if (child.pid < 0) {
      states.emplace_back();
      continue;
    }
    // A report is a few hundred bytes: the child never blocks on the pipe, and EOF comes when it
    // exits (or is killed below).
    char buffer[512];
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd ready{child.fd, POLLIN, 0};
      if (left.count() <= 0 || poll(&ready, 1, static_cast<int>(left.count())) <= 0) break;
      const ssize_t n = read(child.fd, buffer, sizeof buffer);
      if (n <= 0) break;
      child.text.append(buffer, static_cast<size_t>(n));
    }
    close(child.fd);
    states.push_back(parse_probe(child.text, child_succeeded(child.pid, deadline)));
  }
  return states;
}

namespace {

// Computes the product with this process's OpenBLAS in a forked child (a crash or a hang is a
// failed check), on one thread as the workers run.
bool check_loaded_in_child() {
  void* handle = dlopen(kOpenBlasLibrary, RTLD_NOW | RTLD_NOLOAD);
  if (!handle) return false;
  const auto sgemm = reinterpret_cast<SgemmFn>(dlsym(handle, "sgemm_"));
  const auto set_threads =
      reinterpret_cast<void (*)(int)>(dlsym(handle, "openblas_set_num_threads"));
  if (!sgemm) return false;
  const pid_t pid = fork();
  if (pid == 0) {
    quiet_child_output();
    if (set_threads) set_threads(1);
    _exit(sgemm_matches_reference(sgemm) ? 0 : 1);
  }
  if (pid < 0) return false;
  return child_succeeded(pid, std::chrono::steady_clock::now() + kChildDeadline);
}

// ---- The line ----

std::string kernels_line(const OpenBlasState& state, const std::string& why) {
  return "BLAS: " + state.version + " with " + state.kernels + " kernels, " + why;
}

std::string chosen_why(const BlasChoiceNote& note) {
  std::string why =
      "chosen by pptrain for this CPU and checked (OpenBLAS's own choice: " + note.detected;
  if (!note.failed.empty()) why += "; " + join(note.failed, ", ") + " not usable here";
  return why + "; PPTRAIN_BLAS=system keeps it)";
}

std::string kept_why(const BlasChoiceNote& note) {
  if (note.failed.empty()) return "OpenBLAS's own choice, the best it has for this CPU";
  // Not usable: OpenBLAS did not load the set when asked (0.3.21 cannot be asked for Cooperlake),
  // or it computed a wrong product.
  return "OpenBLAS's own choice: " + join(note.failed, ", ") +
         " not usable here (not loaded when asked, or a wrong product)";
}

// "; pptrain would try Cooperlake" when the CPU runs better sets than `state`'s.
std::string better_hint(const CpuFeatures& cpu, const OpenBlasState& state) {
  const std::vector<std::string> better = better_kernels(cpu, state.kernels, state.available);
  return better.empty() ? "" : "; pptrain would try " + better.front();
}

// What an already loaded OpenBLAS runs, by the choice that led there.
std::string settled_line(const BlasEnvironment& env, BlasPolicy policy, const CpuFeatures& cpu,
                         const OpenBlasState& loaded) {
  switch (policy) {
    case BlasPolicy::kSystem:
      return kernels_line(loaded, env.coretype.empty()
                                      ? "OpenBLAS's own choice (PPTRAIN_BLAS=system" +
                                            better_hint(cpu, loaded) + ")"
                                      : "as OPENBLAS_CORETYPE asks (PPTRAIN_BLAS=system)");
    case BlasPolicy::kUser:
      return kernels_line(
          loaded, "as OPENBLAS_CORETYPE asks (yours" + better_hint(cpu, loaded) + " without it)");
    case BlasPolicy::kChosen:
    case BlasPolicy::kChoose:
      break;
  }
  const std::optional<BlasChoiceNote> note = BlasChoiceNote::parse(env.choice);
  if (!note) return kernels_line(loaded, "OpenBLAS's own choice");
  if (loaded.kernels != note->kernels) {
    return kernels_line(
        loaded, "not the " + note->kernels + " that pptrain chose: this OpenBLAS did not take it");
  }
  return kernels_line(
      loaded, note->state == BlasChoiceNote::State::kKept ? kept_why(*note) : chosen_why(*note));
}

std::string g_kernels_line;
bool g_kernels_changed = false;

}  // namespace

// ---- The CPU ----

CpuFeatures features_from_cpuid(const CpuidWords& w) {
  CpuFeatures cpu;
  const auto vendor_is = [&](const char* name) {
    return std::memcmp(&w.vendor[0], name, 4) == 0 && std::memcmp(&w.vendor[1], name + 4, 4) == 0 &&
           std::memcmp(&w.vendor[2], name + 8, 4) == 0;
  };
  cpu.amd = vendor_is("AuthenticAMD") || vendor_is("HygonGenuine");
  cpu.sse3 = bit(w.leaf1_ecx, 0);
  cpu.ssse3 = bit(w.leaf1_ecx, 9);
  cpu.sse4_1 = bit(w.leaf1_ecx, 19);
  cpu.sse4_2 = bit(w.leaf1_ecx, 20);
  // XCR0: bits 1-2 the SSE and AVX registers, 5-7 AVX-512's mask and upper ZMM registers, 17-18
  // AMX's tile configuration and data. Without OSXSAVE (leaf 1 ECX bit 27) there is no XCR0.
  const bool osxsave = bit(w.leaf1_ecx, 27);
  const bool ymm = osxsave && (w.xcr0 & 0x6) == 0x6;
  const bool zmm = ymm && (w.xcr0 & 0xe0) == 0xe0;
  const bool tiles = osxsave && (w.xcr0 & 0x60000) == 0x60000;
  cpu.avx = ymm && bit(w.leaf1_ecx, 28);
  cpu.avx2 = cpu.avx && bit(w.leaf7_ebx, 5) && bit(w.leaf1_ecx, 12);
  cpu.avx512 = zmm && cpu.avx2 && bit(w.leaf7_ebx, 16) && bit(w.leaf7_ebx, 17) &&
               bit(w.leaf7_ebx, 28) && bit(w.leaf7_ebx, 30) && bit(w.leaf7_ebx, 31);
  cpu.avx512_bf16 = cpu.avx512 && bit(w.leaf7_1_eax, 5);
  cpu.amx = tiles && bit(w.leaf7_edx, 22) && bit(w.leaf7_edx, 24) && bit(w.leaf7_edx, 25);
  return cpu;
}

CpuFeatures cpu_features() {
#if defined(__x86_64__)
  CpuidWords w;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return {};
  const unsigned max_leaf = eax;
  w.vendor[0] = ebx;
  w.vendor[1] = edx;
  w.vendor[2] = ecx;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) w.leaf1_ecx = ecx;
  if (max_leaf >= 7 && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    w.leaf7_ebx = ebx;
    w.leaf7_edx = edx;
    if (eax >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) w.leaf7_1_eax = eax;
  }
  if (bit(w.leaf1_ecx, 27)) {
    uint32_t low = 0, high = 0;
    __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
    w.xcr0 = (static_cast<uint64_t>(high) << 32) | low;
  }
  return features_from_cpuid(w);
#else
  return {};
#endif
}

std::vector<std::string> runnable_kernels(const CpuFeatures& cpu) {
  // Best first; Zen's kernels are Haswell's tuned for AMD's caches, so they go first on AMD.
  const std::pair<const char*, bool> sets[] = {
      {"SapphireRapids", cpu.avx512 && cpu.avx512_bf16 && cpu.amx},
      {"Cooperlake", cpu.avx512 && cpu.avx512_bf16},
      {"SkylakeX", cpu.avx512},
      {"Zen", cpu.amd && cpu.avx2},
      {"Haswell", cpu.avx2},
      {"Sandybridge", cpu.avx},
      {"Nehalem", cpu.sse4_2},
      {"Penryn", cpu.sse4_1},
      {"Core2", cpu.ssse3},
      {"Prescott", cpu.sse3},
  };
  std::vector<std::string> runnable;
  for (const auto& [name, runs] : sets) {
    if (runs) runnable.push_back(name);
  }
  return runnable;
}

int kernel_rank(const std::string& kernels) {
  for (const KernelSet& set : kKernelSets) {
    if (kernels == set.name) return set.rank;
  }
  return -1;
}

std::vector<std::string> better_kernels(const CpuFeatures& cpu, const std::string& current,
                                        const std::vector<std::string>& available) {
  const int rank = kernel_rank(current);
  std::vector<std::string> better;
  if (rank < 0) return better;
  for (const std::string& name : runnable_kernels(cpu)) {
    if (kernel_rank(name) > rank &&
        std::find(available.begin(), available.end(), name) != available.end()) {
      better.push_back(name);
    }
  }
  return better;
}

// ---- The product check ----

bool sgemm_matches_reference(SgemmFn sgemm) {
  struct Product {
    char transa, transb;
    int m, n, k;
  };
  // Sizes that are no multiple of any kernel's tile, so the edge code runs too; the second is
  // large enough for OpenBLAS to pack its operands, as LibTorch's products are.
  constexpr Product kProducts[] = {
      {'N', 'N', 67, 45, 83}, {'N', 'T', 96, 64, 160}, {'T', 'N', 33, 131, 70}};
  uint32_t seed = 12345;
  const auto next = [&seed] {  // uniform in [-1, 1)
    seed = seed * 1664525u + 1013904223u;
    return static_cast<float>(seed >> 8) / static_cast<float>(1 << 23) - 1.0f;
  };
  for (const Product& p : kProducts) {
    // op(A) is m x k and op(B) k x n; A and B are stored column-major as given (transposed or not).
    const int lda = p.transa == 'N' ? p.m : p.k, ldb = p.transb == 'N' ? p.k : p.n;
    std::vector<float> a(static_cast<size_t>(lda) * (p.transa == 'N' ? p.k : p.m));
    std::vector<float> b(static_cast<size_t>(ldb) * (p.transb == 'N' ? p.n : p.k));
    std::vector<float> c(static_cast<size_t>(p.m) * p.n);
    for (float& x : a) x = next();
    for (float& x : b) x = next();
    for (float& x : c) x = next();
    const std::vector<float> c0 = c;
    const float alpha = 1.5f, beta = 0.5f;
    sgemm(&p.transa, &p.transb, &p.m, &p.n, &p.k, &alpha, a.data(), &lda, b.data(), &ldb, &beta,
          c.data(), &p.m);
    const auto at_a = [&](int i, int l) {
      return p.transa == 'N' ? a[static_cast<size_t>(l) * lda + i]
                             : a[static_cast<size_t>(i) * lda + l];
    };
    const auto at_b = [&](int l, int j) {
      return p.transb == 'N' ? b[static_cast<size_t>(j) * ldb + l]
                             : b[static_cast<size_t>(l) * ldb + j];
    };
    for (int j = 0; j < p.n; ++j) {
      for (int i = 0; i < p.m; ++i) {
        double sum = 0, magnitude = 0;
        for (int l = 0; l < p.k; ++l) {
          const double term = static_cast<double>(at_a(i, l)) * at_b(l, j);
          sum += term;
          magnitude += std::abs(term);
        }
        const size_t at = static_cast<size_t>(j) * p.m + i;
        const double want = alpha * sum + beta * static_cast<double>(c0[at]);
        // float's rounding over k terms stays far below this; a wrong kernel lands far above.
        const double tolerance = 1e-4 * (alpha * magnitude + beta * std::abs(c0[at])) + 1e-6;
        if (!(std::abs(static_cast<double>(c[at]) - want) <= tolerance)) return false;
      }
    }
  }
  return true;
}

// ---- The environment ----

BlasEnvironment BlasEnvironment::read() {
  BlasEnvironment env;
  env.pptrain_blas = env_or_empty("PPTRAIN_BLAS");
  env.coretype = env_or_empty(kCoretypeVariable);
  env.choice = env_or_empty(kChoiceVariable);
  env.test_detected = env_or_empty("PPTRAIN_BLAS_TEST_DETECTED");
  return env;
}

std::string BlasChoiceNote::to_string() const {
  const char* name = state == State::kChecked     ? "checked"
                     : state == State::kUnchecked ? "unchecked"
                                                  : "kept";
  return std::string(name) + ":" + kernels + ":" + detected + ":" + join(failed, ",");
}

std::optional<BlasChoiceNote> BlasChoiceNote::parse(const std::string& text) {
  const std::vector<std::string> parts = split(text, ':');
  if (parts.size() != 4) return std::nullopt;
  BlasChoiceNote note;
  if (parts[0] == "checked") {
    note.state = State::kChecked;
  } else if (parts[0] == "unchecked") {
    note.state = State::kUnchecked;
  } else if (parts[0] == "kept") {
    note.state = State::kKept;
  } else {
    return std::nullopt;
  }
  note.kernels = parts[1];
  note.detected = parts[2];
  if (kernel_rank(note.kernels) < 0 || kernel_rank(note.detected) < 0) return std::nullopt;
  for (const std::string& name : split(parts[3], ',')) {
    if (kernel_rank(name) < 0) return std::nullopt;
    note.failed.push_back(name);
  }
  return note;
}

BlasPolicy blas_policy(const BlasEnvironment& env) {
  PPTRAIN_CHECK(
      env.pptrain_blas.empty() || env.pptrain_blas == "pptrain" || env.pptrain_blas == "system",
      "PPTRAIN_BLAS must be 'pptrain' or 'system', got '", env.pptrain_blas, "'");
  if (env.pptrain_blas == "system") return BlasPolicy::kSystem;
  // OpenBLAS's own detection: nothing in OPENBLAS_CORETYPE, or the tests' stand-in for it.
  const bool detected =
      env.coretype.empty() || (!env.test_detected.empty() && env.coretype == env.test_detected);
  if (const std::optional<BlasChoiceNote> note = BlasChoiceNote::parse(env.choice)) {
    const bool matches =
        note->state == BlasChoiceNote::State::kKept ? detected : env.coretype == note->kernels;
    if (matches) return BlasPolicy::kChosen;
  }
  return detected ? BlasPolicy::kChoose : BlasPolicy::kUser;
}

// ---- Before OpenBLAS loads ----

BlasChoice choose_before_load(const BlasEnvironment& env, const CpuFeatures& cpu,
                              const BlasProber& probe) {
  BlasChoice choice;
  if (blas_policy(env) != BlasPolicy::kChoose) return choice;
  if (runnable_kernels(cpu).empty()) return choice;
  // OpenBLAS's own choice first, alone: where OpenBLAS knows the CPU it is the best already, and
  // one process decides.
  const OpenBlasState detected = probe({""}).at(0);
  if (!detected.loaded) return choice;
  BlasChoiceNote note;
  note.state = BlasChoiceNote::State::kKept;
  note.kernels = note.detected = detected.kernels;
  // Then the better sets two at a time, in parallel: the best one may not load when asked (0.3.21
  // cannot be asked for Cooperlake), and the next is then ready.
  const std::vector<std::string> better = better_kernels(cpu, detected.kernels, detected.available);
  constexpr size_t kAtOnce = 2;
  for (size_t from = 0; from < better.size() && note.state == BlasChoiceNote::State::kKept;
       from += kAtOnce) {
    const std::vector<std::string> batch(better.begin() + from,
                                         better.begin() + std::min(better.size(), from + kAtOnce));
    const std::vector<OpenBlasState> states = probe(batch);
    for (size_t i = 0; i < batch.size(); ++i) {
      const OpenBlasState& state = states.at(i);
      if (state.loaded && state.kernels == batch[i] && state.product_ok) {
        note.state = BlasChoiceNote::State::kChecked;
        note.kernels = batch[i];
        choice.env.set.emplace_back(kCoretypeVariable, batch[i]);
        choice.line = kernels_line(state, chosen_why(note));
        break;
      }
      note.failed.push_back(batch[i]);
    }
  }
  if (note.state == BlasChoiceNote::State::kKept && !note.failed.empty()) {
    choice.line = kernels_line(detected, kept_why(note));
  }
  if (kernel_rank(note.kernels) >= 0)
    choice.env.set.emplace_back(kChoiceVariable, note.to_string());
  return choice;
}

BlasChoice choose_blas_kernels() {
  return choose_before_load(BlasEnvironment::read(), cpu_features(), probe_openblas);
}

void apply_env(const EnvChanges& changes) {
  for (const std::string& name : changes.unset) unsetenv(name.c_str());
  for (const auto& [name, value] : changes.set) setenv(name.c_str(), value.c_str(), 1);
}

// ---- After OpenBLAS loaded ----

SettleStep settle_after_load(const BlasEnvironment& env, const CpuFeatures& cpu,
                             const OpenBlasState& loaded, const std::function<bool()>& check_here) {
  const BlasPolicy policy = blas_policy(env);
  SettleStep step;
  if (!loaded.loaded) return step;
  if (policy == BlasPolicy::kChoose) {
    const std::vector<std::string> better = better_kernels(cpu, loaded.kernels, loaded.available);
    BlasChoiceNote note;
    note.kernels = note.detected = loaded.kernels;
    if (better.empty()) {
      // A set not known here (a newer OpenBLAS's) is its own business: no claim, no note.
      if (kernel_rank(loaded.kernels) < 0) {
        step.line = kernels_line(loaded, "OpenBLAS's own choice");
        return step;
      }
      note.state = BlasChoiceNote::State::kKept;
      step.env.set.emplace_back(kChoiceVariable, note.to_string());
      step.line = kernels_line(loaded, kept_why(note));
      return step;
    }
    // The best set, checked by this program started again with it.
    note.state = BlasChoiceNote::State::kUnchecked;
    note.kernels = better.front();
    step.env.set = {{kCoretypeVariable, note.kernels}, {kChoiceVariable, note.to_string()}};
    step.reexec = true;
    return step;
  }
  std::optional<BlasChoiceNote> note = BlasChoiceNote::parse(env.choice);
  if (policy != BlasPolicy::kChosen || note->state != BlasChoiceNote::State::kUnchecked) {
    step.line = settled_line(env, policy, cpu, loaded);
    step.changed = policy == BlasPolicy::kChosen &&
                   (note->state == BlasChoiceNote::State::kChecked || !note->failed.empty());
    return step;
  }
  // Started again with a set to check.
  if (loaded.kernels == note->kernels && check_here()) {
    note->state = BlasChoiceNote::State::kChecked;
    step.env.set.emplace_back(kChoiceVariable, note->to_string());
    step.line = kernels_line(loaded, chosen_why(*note));
    step.changed = true;
    return step;
  }
  // Failed: the next better set, or OpenBLAS's own. Each start adds a failed set, so this ends.
  note->failed.push_back(note->kernels);
  std::vector<std::string> rest;
  for (const std::string& name : better_kernels(cpu, note->detected, loaded.available)) {
    if (std::find(note->failed.begin(), note->failed.end(), name) == note->failed.end()) {
      rest.push_back(name);
    }
  }
  if (!rest.empty()) {
    note->kernels = rest.front();
    step.env.set = {{kCoretypeVariable, note->kernels}, {kChoiceVariable, note->to_string()}};
  } else {
    note->state = BlasChoiceNote::State::kKept;
    note->kernels = note->detected;
    // OpenBLAS's own detection again (the tests' stand-in is what it "detected").
    if (!env.test_detected.empty() && env.test_detected == note->detected) {
      step.env.set.emplace_back(kCoretypeVariable, env.test_detected);
    } else {
      step.env.unset.push_back(kCoretypeVariable);
    }
    step.env.set.emplace_back(kChoiceVariable, note->to_string());
  }
  step.reexec = true;
  return step;
}

OpenBlasState loaded_openblas() {
  void* handle = dlopen(kOpenBlasLibrary, RTLD_NOW | RTLD_NOLOAD);
  if (!handle) return {};
  // The sgemm_ a program linked with LibTorch calls, where one is in the global scope: when it is
  // not OpenBLAS's (libblas.so.3 pointing at another BLAS), OpenBLAS's kernels do not matter.
  if (void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_"); sgemm && !in_openblas_file(sgemm)) return {};
  return state_of(handle);
}

void settle_blas_kernels(char** argv) {
  const BlasEnvironment env = BlasEnvironment::read();
  const SettleStep step =
      settle_after_load(env, cpu_features(), loaded_openblas(), check_loaded_in_child);
  if (step.reexec) {
    // OpenBLAS reads OPENBLAS_CORETYPE as it loads: only a new start of the program takes it.
    std::vector<std::pair<std::string, std::optional<std::string>>> before;
    for (const char* name : {kCoretypeVariable, kChoiceVariable}) {
      const char* value = std::getenv(name);
      before.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
    }
    apply_env(step.env);
    execv("/proc/self/exe", argv);
    const int error = errno;
    // Could not start again: go on with what runs, and leave the environment as it was.
    for (const auto& [name, value] : before) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
    const OpenBlasState loaded = loaded_openblas();
    g_kernels_line = kernels_line(loaded,
                                  "OpenBLAS's own choice (pptrain could not start again "
                                  "to change it: " +
                                      std::string(std::strerror(error)) + ")");
    return;
  }
  apply_env(step.env);
  g_kernels_line = step.line;
  g_kernels_changed = step.changed;
}

const std::string& blas_kernels_line() {
  return g_kernels_line;
}

bool blas_kernels_changed() {
  return g_kernels_changed;
}

std::string blas_warning_after_load(const BlasEnvironment& env, const CpuFeatures& cpu,
                                    const OpenBlasState& loaded) {
  if (!loaded.loaded || blas_policy(env) != BlasPolicy::kChoose) return "";
  const std::vector<std::string> better = better_kernels(cpu, loaded.kernels, loaded.available);
  if (better.empty()) return "";
  return "OpenBLAS was loaded before pptrain (by torch, or another module imported first) and "
         "runs its " +
         loaded.kernels + " kernels on a CPU that runs " + better.front() +
         "'s: import pptrain before torch for the fastest kernels that pass pptrain's check "
         "(or set PPTRAIN_BLAS=system to keep these and silence this)";
}

}  // namespace pptrain
