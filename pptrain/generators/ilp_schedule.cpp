#include "pptrain/generators/ilp_schedule.h"

// For CBC's types and the signatures its functions are loaded with: nothing here links CBC.
#include <Cbc_C_Interface.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

// CBC's C functions, from the shared library loaded the first time a program is built: a planner
// that never solves one does not load CBC and what CBC needs (CLP, CGL, OSI, CoinUtils, LAPACK
// and OpenBLAS), which took 19 ms of every start (docs/PERFORMANCE.md, "Loading CBC when it is
// used"). PPTRAIN_CBC_LIBRARY in the environment names another file to load.
// clang-format off
#define PPTRAIN_CBC_FUNCTIONS(X)                                                                 \
  X(Cbc_newModel) X(Cbc_deleteModel) X(Cbc_addCol) X(Cbc_addRow) X(Cbc_getNumCols)               \
  X(Cbc_setMIPStartI) X(Cbc_setLogLevel) X(Cbc_setParameter) X(Cbc_solve) X(Cbc_isProvenOptimal) \
  X(Cbc_getBestPossibleObjValue) X(Cbc_bestSolution)
// clang-format on

struct CbcLibrary {
#define PPTRAIN_CBC_MEMBER(name) decltype(&::name) name = nullptr;
  PPTRAIN_CBC_FUNCTIONS(PPTRAIN_CBC_MEMBER)
#undef PPTRAIN_CBC_MEMBER
};

CbcLibrary load_cbc() {
  const char* chosen = std::getenv("PPTRAIN_CBC_LIBRARY");
  const std::string file = chosen && *chosen ? chosen : PPTRAIN_CBC_LIBRARY;
  // Never unloaded: the library stays for the process's life, as a linked one would.
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  PPTRAIN_CHECK(handle != nullptr, "--solver ilp needs COIN-OR CBC, which could not be loaded (",
                dlerror(), "); install it (Debian: coinor-libcbc3) or set PPTRAIN_CBC_LIBRARY");
  CbcLibrary cbc;
#define PPTRAIN_CBC_LOAD(name)                                           \
  cbc.name = reinterpret_cast<decltype(cbc.name)>(dlsym(handle, #name)); \
  PPTRAIN_CHECK(cbc.name != nullptr, "--solver ilp: ", file,             \
                " has no function " #name                                \
                ", which pptrain calls; is it COIN-OR CBC's libCbcSolver?");
  PPTRAIN_CBC_FUNCTIONS(PPTRAIN_CBC_LOAD)
#undef PPTRAIN_CBC_LOAD
  return cbc;
}

// Loaded once per process (thread-safe); a failure is thrown again on the next try.
const CbcLibrary& cbc() {
  static const CbcLibrary library = load_cbc();
  return library;
}

#undef PPTRAIN_CBC_FUNCTIONS

constexpr double kEps = 1e-9;  // times and memory compare with this slack
constexpr Op kOps[] = {Op::F, Op::I, Op::W};

int op_index(Op op) {
  return op == Op::F ? 0 : op == Op::I ? 1 : 2;
}

double duration(const StageCosts& c, Op op, int s) {
  if (op == Op::F) return c.forward[s];
  return op == Op::I ? c.backward_input[s] : c.backward_weight[s];
}

// Memory an action adds to its rank (negative: frees), memory-model units (peak_in_order()).
double memory_delta(const StageCosts& c, Op op, int s) {
  if (op == Op::F) return c.activation[s];
  return op == Op::I ? -(c.activation[s] - c.weight_stash[s]) : -c.weight_stash[s];
}

// When stage s's first F starts: its input's arrival, as the simulator runs it.
std::vector<double> stage_starts(const StageCosts& c) {
  std::vector<double> start(c.stages(), 0.0);
  for (int s = 1; s < c.stages(); ++s) start[s] = start[s - 1] + c.forward[s - 1] + c.comm;
  return start;
}

// One action of a stage: op and microbatch.
struct Node {
  Op op;
  int microbatch;
};

// Whether the chains alone put x before y on one stage (the pairs without a binary).
bool implied_before(const Node& x, const Node& y) {
  if (x.op == y.op) return x.microbatch < y.microbatch;
  if (op_index(x.op) < op_index(y.op)) return x.microbatch <= y.microbatch;
  return false;
}

// The program's columns and rows, built through CBC's C interface.
class Program {
 public:
  Program(int P, int M, const StageCosts& c, const std::vector<double>& limits,
          double heuristic_span)
      : P_(P), M_(M), c_(c), limits_(limits), start_(stage_starts(c)) {
    model_ = cbc_.Cbc_newModel();
    // The warm start's span, with room for rounding: no action ends later than its stage's
    // start plus this.
    span_bound_ = heuristic_span * (1 + 1e-7) + 1e-7;
    bound_times();
    add_times();
    add_orders();
    add_memory();
  }
  ~Program() { cbc_.Cbc_deleteModel(model_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  // Gives CBC the order of `warm` (its binaries; CBC finds the times).
  void warm_start(const Schedule& warm) {
    std::vector<std::vector<int>> position(3 * P_, std::vector<int>(M_, 0));
    for (int r = 0; r < P_; ++r) {
      for (size_t k = 0; k < warm.actions[r].size(); ++k) {
        const Action& a = warm.actions[r][k];
        position[a.stage * 3 + op_index(a.op)][a.microbatch] = static_cast<int>(k);
      }
    }
    std::vector<int> columns;
    std::vector<double> values;
    for (const Pair& p : pairs_) {
      columns.push_back(p.column);
      values.push_back(position[p.stage * 3 + op_index(p.x.op)][p.x.microbatch] <
                               position[p.stage * 3 + op_index(p.y.op)][p.y.microbatch]
                           ? 1.0
                           : 0.0);
    }
    cbc_.Cbc_setMIPStartI(model_, static_cast<int>(columns.size()), columns.data(), values.data());
  }

  // Solves; the order CBC found, or nothing when it has no integer solution.
  std::optional<Schedule> solve(double time_limit_s, IlpReport& report) {
    cbc_.Cbc_setLogLevel(model_, std::getenv("PPTRAIN_CBC_LOG") ? 1 : 0);
    // Wall time: on a shared host the CPU time runs slower than the clock the user waits on.
    cbc_.Cbc_setParameter(model_, "timeMode", "elapsed");
    cbc_.Cbc_setParameter(model_, "seconds", std::to_string(time_limit_s).c_str());
    cbc_.Cbc_solve(model_);
    report.proven_optimal = cbc_.Cbc_isProvenOptimal(model_) != 0;
    report.best_bound = cbc_.Cbc_getBestPossibleObjValue(model_);
    const double* solution = cbc_.Cbc_bestSolution(model_);
    if (!solution) return std::nullopt;
    return order_of(solution);
  }

 private:
  struct Pair {
    int stage;
    Node x, y;  // the binary is 1 when x runs before y
    int column;
  };

  int end_column(Op op, int s, int j) const { return (s * 3 + op_index(op)) * M_ + j; }

  // Columns need distinct names: CBC matches a MIP start to the preprocessed model by name.
  void add_column(double lower, double upper, double objective, bool integer) {
    const std::string name = "x" + std::to_string(cbc_.Cbc_getNumCols(model_));
    cbc_.Cbc_addCol(model_, name.c_str(), lower, upper, objective, integer ? 1 : 0, 0, nullptr,
                    nullptr);
  }

  // sum(coefficient x column) sense rhs, sense 'G' (>=) or 'L' (<=).
  void add_row(const std::vector<int>& columns, const std::vector<double>& coefficients, char sense,
               double rhs) {
    cbc_.Cbc_addRow(model_, "", static_cast<int>(columns.size()), columns.data(),
                    coefficients.data(), sense, rhs);
  }

  // Bounds valid for every order of span <= the warm start's, which tighten the relaxation:
  // an action ends no earlier than its chains allow (the first F exactly then), and no later
  // than its stage's start + that span - the work the chains put after it on its stage.
  void bound_times() {
    earliest_.assign(3 * P_ * M_, 0.0);
    latest_.assign(3 * P_ * M_, 0.0);
    const auto at = [&](std::vector<double>& v, Op op, int s, int j) -> double& {
      return v[end_column(op, s, j)];
    };
    for (int s = 0; s < P_; ++s) {
      for (int j = 0; j < M_; ++j) {
        double ready = j > 0 ? at(earliest_, Op::F, s, j - 1) : start_[s];
        if (s > 0) ready = std::max(ready, at(earliest_, Op::F, s - 1, j) + c_.comm);
        at(earliest_, Op::F, s, j) = ready + c_.forward[s];
      }
    }
    for (int s = P_ - 1; s >= 0; --s) {
      for (int j = 0; j < M_; ++j) {
        double ready = at(earliest_, Op::F, s, j);
        if (j > 0) ready = std::max(ready, at(earliest_, Op::I, s, j - 1));
        if (s + 1 < P_) ready = std::max(ready, at(earliest_, Op::I, s + 1, j) + c_.comm);
        at(earliest_, Op::I, s, j) = ready + c_.backward_input[s];
        ready = at(earliest_, Op::I, s, j);
        if (j > 0) ready = std::max(ready, at(earliest_, Op::W, s, j - 1));
        at(earliest_, Op::W, s, j) = ready + c_.backward_weight[s];
      }
    }
    for (int s = 0; s < P_; ++s) {
      const double f = c_.forward[s], i = c_.backward_input[s], w = c_.backward_weight[s];
      for (int j = 0; j < M_; ++j) {
        const int after = M_ - 1 - j;  // same-type actions after microbatch j
        const double end = start_[s] + span_bound_;
        at(latest_, Op::F, s, j) = end - after * f - (after + 1) * (i + w);
        at(latest_, Op::I, s, j) = end - after * i - (after + 1) * w;
        at(latest_, Op::W, s, j) = end - after * w;
      }
      // The span is at least the stage's work, and at least the wait for its first gradient
      // plus every I and W (none runs before that gradient).
      const double first_i_start = at(earliest_, Op::I, s, 0) - i;
      span_floor_ =
          std::max({span_floor_, M_ * (f + i + w), first_i_start - start_[s] + M_ * (i + w)});
    }
    for (int s = 0; s < P_; ++s) at(latest_, Op::F, s, 0) = at(earliest_, Op::F, s, 0);
  }

  // E(op, s, j) for every action, then the objective's span; the chains.
  void add_times() {
    for (int k = 0; k < 3 * P_ * M_; ++k) {
      add_column(earliest_[k], std::max(earliest_[k], latest_[k]), 0, false);
    }
    span_column_ = 3 * P_ * M_;
    add_column(std::min(span_floor_, span_bound_), span_bound_, 1, false);
    for (int s = 0; s < P_; ++s) {
      for (int j = 0; j < M_; ++j) {
        const auto after = [&](Op op, int other_column, double gap) {
          add_row({end_column(op, s, j), other_column}, {1, -1}, 'G', gap + duration(c_, op, s));
        };
        if (s > 0) after(Op::F, end_column(Op::F, s - 1, j), c_.comm);
        if (j > 0) after(Op::F, end_column(Op::F, s, j - 1), 0);
        if (s + 1 < P_) after(Op::I, end_column(Op::I, s + 1, j), c_.comm);
        after(Op::I, end_column(Op::F, s, j), 0);
        if (j > 0) after(Op::I, end_column(Op::I, s, j - 1), 0);
        after(Op::W, end_column(Op::I, s, j), 0);
        if (j > 0) after(Op::W, end_column(Op::W, s, j - 1), 0);
      }
      // span >= E(W(s, M-1)) - start(s): that W always ends the stage.
      add_row({span_column_, end_column(Op::W, s, M_ - 1)}, {1, -1}, 'G', -start_[s]);
    }
  }

  // A binary for every pair the chains leave open: (F(a), I(b)), (I(a), W(b)), (F(a), W(b)),
  // a > b; and its two big-M rows.
  void add_orders() {
    const std::pair<Op, Op> kinds[] = {{Op::F, Op::I}, {Op::I, Op::W}, {Op::F, Op::W}};
    for (int s = 0; s < P_; ++s) {
      for (const auto& [first, second] : kinds) {
        for (int a = 1; a < M_; ++a) {
          for (int b = 0; b < a; ++b) {
            const int o = cbc_.Cbc_getNumCols(model_);
            add_column(0, 1, 0, true);
            const Pair p{s, {first, a}, {second, b}, o};
            pairs_.push_back(p);
            const int x = end_column(first, s, a), y = end_column(second, s, b);
            const double tx = duration(c_, first, s), ty = duration(c_, second, s);
            // Each big-M is the most its row can be violated by when the binary switches it off.
            const double mx = std::max(0.0, latest_[x] + ty - earliest_[y]);
            const double my = std::max(0.0, latest_[y] + tx - earliest_[x]);
            // O = 1: E(y) - E(x) >= T(y) - M (1 - O), i.e. E(y) - E(x) - M O >= T(y) - M.
            add_row({y, x, o}, {1, -1, -mx}, 'G', ty - mx);
            // O = 0: E(x) - E(y) >= T(x) - M O.
            add_row({x, y, o}, {1, -1, my}, 'G', tx);
          }
        }
      }
    }
  }

  // After F(b): (b + 1) activations, less what each I(a), W(a) (a < b) freed when it ran first.
  void add_memory() {
    std::map<std::pair<int, int>, std::vector<Pair>> freed_before;  // [(stage, b)]: (F(b), y)
    for (const Pair& p : pairs_) {
      if (p.x.op == Op::F) freed_before[{p.stage, p.x.microbatch}].push_back(p);
    }
    for (int s = 0; s < P_; ++s) {
      if (limits_[s] <= 0) continue;  // no limit on this rank
      for (int b = 1; b < M_; ++b) {
        std::vector<int> columns;
        std::vector<double> coefficients;
        double rhs = limits_[s] - (b + 1) * c_.activation[s];
        // Binary 1: F(b) runs first and the other frees nothing before it; 0: it frees delta.
        // sum delta (1 - O) <= rhs  <=>  -sum delta O <= rhs - sum delta.
        for (const Pair& p : freed_before[{s, b}]) {
          const double delta = memory_delta(c_, p.y.op, s);
          columns.push_back(p.column);
          coefficients.push_back(-delta);
          rhs -= delta;
        }
        add_row(columns, coefficients, 'L', rhs);
      }
    }
  }

  // The stage lists of a solution: each action's position is how many of its stage's actions
  // run before it (by the chains or the binaries).
  std::optional<Schedule> order_of(const double* solution) const {
    Schedule out;
    out.name = "zb-auto";
    out.num_ranks = P_;
    out.num_stages = P_;
    out.num_microbatches = M_;
    std::vector<std::vector<char>> before(3 * M_, std::vector<char>(3 * M_, 0));
    const auto node_index = [&](const Node& n) { return op_index(n.op) * M_ + n.microbatch; };
    for (int s = 0; s < P_; ++s) {
      std::vector<Node> nodes;
      for (Op op : kOps) {
        for (int j = 0; j < M_; ++j) nodes.push_back({op, j});
      }
      for (const Node& x : nodes) {
        for (const Node& y : nodes) before[node_index(x)][node_index(y)] = implied_before(x, y);
      }
      for (const Pair& p : pairs_) {
        if (p.stage != s) continue;
        const bool x_first = solution[p.column] > 0.5;
        before[node_index(p.x)][node_index(p.y)] = x_first;
        before[node_index(p.y)][node_index(p.x)] = !x_first;
      }
      std::vector<Action> list(3 * M_, Action::make(Op::F, s, -1));
      for (const Node& y : nodes) {
        int position = 0;
        for (const Node& x : nodes) position += before[node_index(x)][node_index(y)];
        if (list[position].microbatch >= 0) return std::nullopt;  // not a total order
        list[position] = Action::make(y.op, s, y.microbatch);
      }
      out.stage_to_rank.push_back(s);
      out.actions.push_back(std::move(list));
    }
    return out;
  }

  const int P_, M_;
  const StageCosts& c_;
  const std::vector<double>& limits_;  // [rank] cap, 0: none
  const std::vector<double> start_;
  double span_bound_ = 0;                  // the warm start's span (a little more)
  double span_floor_ = 0;                  // no order's span is below it
  std::vector<double> earliest_, latest_;  // [end column] bounds of every E
  int span_column_ = 0;
  const CbcLibrary& cbc_ = cbc();
  Cbc_Model* model_ = nullptr;
  std::vector<Pair> pairs_;
};

}  // namespace

Schedule make_zb_ilp(const AutoScheduleOptions& o, double time_limit_s, IlpReport* report) {
  PPTRAIN_CHECK(std::isfinite(time_limit_s) && time_limit_s > 0,
                "--time-limit must be a number of seconds > 0, got ", time_limit_s);
  const auto begin = std::chrono::steady_clock::now();
  double heuristic = 0;
  Schedule greedy = make_zb_auto(o, &heuristic);  // checks the options
  const StageCosts costs = o.costs.stages() == 0 ? StageCosts::uniform(o.ranks) : o.costs;
  const long long binaries = 3LL * o.ranks * o.microbatches * (o.microbatches - 1) / 2;
  PPTRAIN_CHECK(binaries <= kMaxIlpBinaries, "--solver ilp: P=", o.ranks, " M=", o.microbatches,
                " needs ", binaries, " order variables, more than the ", kMaxIlpBinaries,
                " it solves; use the heuristic");

  IlpReport out;
  out.heuristic = heuristic;
  out.objective = heuristic;
  out.binaries = static_cast<int>(binaries);
  Schedule result = greedy;
  if (binaries == 0) {
    out.proven_optimal = true;  // one order per rank: the greedy's
    out.best_bound = heuristic;
  } else {
    const std::vector<double> limits = resolved_memory_limits(o);
    Program program(o.ranks, o.microbatches, costs, limits, heuristic);
    program.warm_start(greedy);
    const std::optional<Schedule> found = program.solve(time_limit_s, out);
    const std::optional<ScheduleTiming> timing = found && within_limits(*found, costs, limits)
                                                     ? timed_in_order(*found, costs)
                                                     : std::optional<ScheduleTiming>();
    const std::optional<double> span =
        timing ? std::optional<double>(timing->span) : std::optional<double>();
    if (span && *span < heuristic - kEps * std::max(1.0, heuristic)) {
      result = *found;
      out.objective = *span;
      out.improved = true;
    }
  }
  // The bound may pass the objective by CBC's tolerance; a bound that reaches it is a proof too.
  out.best_bound = std::min(out.best_bound, out.objective);
  if (out.objective - out.best_bound <= kEps * std::max(1.0, out.objective)) {
    out.proven_optimal = true;
  }
  out.gap = out.proven_optimal || out.objective <= 0
                ? 0
                : (out.objective - out.best_bound) / out.objective;
  out.solve_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  if (report) *report = out;
  return result;
}

}  // namespace pptrain
