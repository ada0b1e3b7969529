#include "pptrain/planner/run_request.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/partition/workers.h"

namespace pptrain {
namespace {

std::string stages_text(const std::vector<int>& stages) {
  std::string text;
  for (int s : stages) text += (text.empty() ? "" : ", ") + std::to_string(s);
  return text.empty() ? std::string("none") : text;
}

// Each tie checked against the schedule `made` is, its stages as numbers of 0..S-1.
std::vector<TiedParameter> resolve_ties(const std::vector<TiedParameter>& ties,
                                        const RequestedSchedule& made, const OptionNames& names) {
  const Schedule& s = made.validated.given();
  const int S = s.num_stages;
  std::vector<TiedParameter> out;
  for (const TiedParameter& tie : ties) {
    const bool seen = std::any_of(out.begin(), out.end(),
                                  [&](const TiedParameter& t) { return t.name == tie.name; });
    PPTRAIN_CHECK(!tie.name.empty() && !seen,
                  "tied parameter names must be non-empty and distinct, got '", tie.name, "'");
    const std::string label = names.tie.empty() ? "tied parameter '" + tie.name + "'" : names.tie;
    PPTRAIN_CHECK(!s.replicated(), label, ": ", s.name,
                  " is replicated; tied parameters run on schedules without replicas for now");
    PPTRAIN_CHECK(made.rule.ties_parameters(), label, ": ", s.name,
                  " has no rule for tied parameters; they run on synchronous schedules, "
                  "pipedream and 2bw");
    std::vector<int> given = tie.stages;
    std::sort(given.begin(), given.end());
    PPTRAIN_CHECK(!given.empty() && given.front() >= -S && given.back() < S &&
                      std::adjacent_find(given.begin(), given.end()) == given.end(),
                  label, " names stages ", stages_text(given), "; give distinct stages of 0..",
                  S - 1, " (or -1 for the last)");
    TiedParameter resolved{tie.name, {}};
    for (int stage : given) resolved.stages.push_back(stage < 0 ? stage + S : stage);
    std::sort(resolved.stages.begin(), resolved.stages.end());
    resolved.stages.erase(std::unique(resolved.stages.begin(), resolved.stages.end()),
                          resolved.stages.end());
    out.push_back(std::move(resolved));
  }
  return out;
}

}  // namespace

std::vector<SkipLink> skip_links(const std::vector<SkipConnection>& skips) {
  std::set<SkipLink> links;
  for (const SkipConnection& skip : skips) {
    if (skip.to > skip.from + 1) links.insert({skip.from, skip.to});
  }
  return {links.begin(), links.end()};
}

ResolvedRun with_skips(ResolvedRun run, std::vector<SkipConnection> skips,
                       const OptionNames& names) {
  const Schedule& s = run.schedule.validated.given();
  for (size_t k = 0; k < skips.size(); ++k) {
    const SkipConnection& skip = skips[k];
    PPTRAIN_CHECK(!run.schedule.rule.asynchronous(), names.skips, ": ", s.name,
                  " is asynchronous; skip connections run on synchronous schedules for now");
    PPTRAIN_CHECK(
        !skip.name.empty() && skip.from >= 0 && skip.from < skip.to && skip.to < s.num_stages,
        "skip connection '", skip.name, "' from stage ", skip.from, " to stage ", skip.to,
        ": give a name and stages 0 <= from < to <= ", s.num_stages - 1);
    for (size_t j = 0; j < k; ++j) {
      PPTRAIN_CHECK(skips[j].name != skip.name || skips[j].from != skip.from, "stage ", skip.from,
                    " has two skip connections named '", skip.name, "'");
    }
  }
  run.schedule = with_skips(std::move(run.schedule), skip_links(skips));
  run.skips = std::move(skips);
  return run;
}

double state_bytes_per_parameter_byte(const OptimizerOptions& options) {
  if (options.kind == "adamw") return 2;
  return options.momentum != 0 ? 1 : 0;
}

void check_optimizer(const OptimizerOptions& optimizer, const OptionNames& names) {
  const std::string& kind = optimizer.kind;
  PPTRAIN_CHECK(kind == "sgd" || kind == "adamw", names.optimizer, " must be sgd or adamw, got '",
                kind, "'");
  PPTRAIN_CHECK(optimizer.lr > 0 && std::isfinite(optimizer.lr), names.lr, " must be > 0, got ",
                optimizer.lr);
  PPTRAIN_CHECK(optimizer.momentum >= 0 && optimizer.momentum < 1, names.momentum,
                " must be in [0, 1), got ", optimizer.momentum);
  PPTRAIN_CHECK(optimizer.momentum == OptimizerOptions().momentum || kind == "sgd", names.momentum,
                " is sgd's; ", names.optimizer, " ", kind, " has none");
  PPTRAIN_CHECK(optimizer.warmup_steps >= 0, names.warmup_steps, " must be >= 0, got ",
                optimizer.warmup_steps);
  PPTRAIN_CHECK(optimizer.clip >= 0 && std::isfinite(optimizer.clip), names.clip,
                " must be >= 0, got ", optimizer.clip);
  PPTRAIN_CHECK(!optimizer.exact_rollback || optimizer.post_validation, names.exact_rollback,
                " applies to ", names.post_validation, " only");
}

ResolvedRun resolve_run(const RunRequest& request, const CostModel& cost) {
  return resolve_run(make_requested_schedule(request.schedule, cost), request);
}

ResolvedRun resolve_run(RequestedSchedule made, const RunRequest& request) {
  const OptionNames& names = request.schedule.names;
  const std::string& name = made.validated.given().name;
  const VersionRule& rule = made.rule;
  const int dp = request.schedule.dp;
  if (request.optimizer) {
    const OptimizerOptions& optimizer = *request.optimizer;
    check_optimizer(optimizer, names);
    PPTRAIN_CHECK(!rule.predicts() || optimizer.kind == "adamw" || optimizer.momentum > 0,
                  names.schedule, " ", name,
                  " predicts weights along the optimizer's smoothed direction, which sgd with ",
                  names.momentum, " 0 does not have (use ", names.momentum, " > 0 or ",
                  names.optimizer, " adamw)");
    PPTRAIN_CHECK(!optimizer.post_validation || !rule.asynchronous(), names.post_validation, ": ",
                  name, " is asynchronous and steps each stage on its own norm");
    PPTRAIN_CHECK(!optimizer.post_validation || dp == 1, names.post_validation, " needs ", names.dp,
                  " 1 (the copies all-reduce their gradients anyway)");
  }
  PPTRAIN_CHECK(request.zero == 0 || request.zero == 1, names.zero, " must be 0 or 1, got ",
                request.zero);
  PPTRAIN_CHECK(request.zero == 0 || dp >= 2, names.zero,
                " 1 shards the optimizer state over the copies of the pipeline; it needs ",
                names.dp, " 2 or more");
  // A schedule only looked at (`pptrain schedule`) may show one pipeline of averaging copies.
  if (made.averages_copies && request.optimizer) {
    PPTRAIN_CHECK(dp >= 2, names.schedule, " ", name, " averages the weights of ", names.dp,
                  " D >= 2 pipelines, got ", names.dp, " ", dp);
    PPTRAIN_CHECK(request.zero == 0, names.zero, " 1 shards an optimizer the copies share; ", name,
                  "'s copies each keep their own");
  }
  if (!request.dp_shares.empty()) {
    check_dp_shares(request.dp_shares, dp,
                    request.schedule.microbatches.value_or(made.validated.given().num_microbatches),
                    names.dp_shares);
    PPTRAIN_CHECK(!made.averages_copies || equal_shares(request.dp_shares), names.dp_shares, " ",
                  format_dp_shares(request.dp_shares), ": ", name,
                  "'s copies pull their weights together as equals; give them equal shares");
  }
  std::vector<TiedParameter> ties = resolve_ties(request.ties, made, names);
  ResolvedRun run(std::move(made));
  run.optimizer = request.optimizer;
  run.zero = request.zero;
  run.recompute = request.recompute;
  run.ties = std::move(ties);
  if (request.skips.empty()) return run;
  return with_skips(std::move(run), request.skips, names);
}

}  // namespace pptrain
