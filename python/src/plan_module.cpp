// pptrain._plan: the schedules of pptrain's planner for Python, without LibTorch (python/pptrain/
// plan.py is its Python face). It calls what `pptrain schedule`, `plan` and `compare` call
// (planner/schedule_request.h, planner/planner.h, compare/comparison.h), so both take the same
// options, give the same figures and fail with the same one-line messages.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/compare/comparison.h"
#include "pptrain/compare/report.h"
#include "pptrain/partition/partition.h"
#include "pptrain/partition/profile.h"
#include "pptrain/planner/plan_file.h"
#include "pptrain/planner/planner.h"
#include "pptrain/planner/run_request.h"
#include "pptrain/render/chrome_trace.h"
#include "pptrain/render/svg.h"
#include "pptrain/schedule/grid.h"
#include "pptrain/sim/cost_model.h"
#include "python/src/family_keywords.h"

namespace py = pybind11;

namespace pptrain::python {
namespace {

// A schedule in hand (a planned candidate's, a CSV's), resolved as synchronous with `dp` copies.
RequestedSchedule prepared(Schedule schedule, int microbatches, int dp) {
  ScheduleRequest request;
  request.microbatches = microbatches;
  request.dp = dp;
  return prepare_schedule(std::move(schedule), request);
}

// A schedule made or imported, ready to simulate, draw and export.
struct PlannedSchedule {
  RequestedSchedule made;
  ScheduleSolver solver = ScheduleSolver::kHeuristic;
  int dp = 1;
  // A planned candidate's own cost model (from the profile), used when no cost text is given.
  std::optional<CostModel> own_cost;

  CostModel cost(const std::string& text, double mem_w_ratio, double cores) const {
    if (text.empty() && own_cost) return *own_cost;
    CostModel c = cost_model_from_flags(text, mem_w_ratio);
    c.replicas = dp;
    PPTRAIN_CHECK(cores >= 0, "cores must be >= 0 (0: a core per rank), got ", cores);
    c.cores = cores / dp;
    return c;
  }

  // `pptrain schedule --json` for the cost model: makespan, bubble, each rank's figures.
  std::string summary_json(const std::string& text, double mem_w_ratio, double memory_limit,
                           double cores) const {
    const CostModel c = cost(text, mem_w_ratio, cores);
    const SimResult result = simulate_requested(made, c, memory_limit, Record::kFigures);
    return schedule_summary_json(made, c, memory_limit, result, solver).dump();
  }

  // The simulated timeline, titled as `pptrain schedule` titles it.
  Timeline timeline(const std::string& text, double mem_w_ratio, double cores) const {
    const CostModel c = cost(text, mem_w_ratio, cores);
    SimResult result = simulate_requested(made, c, 0, Record::kTimeline);
    result.timeline.title = schedule_timeline_title(made, c, result);
    return std::move(result.timeline);
  }

  std::string svg(const std::string& text, double mem_w_ratio, bool with_comms,
                  double cores) const {
    SvgOptions options;
    options.show_comms = with_comms;
    return render_svg(timeline(text, mem_w_ratio, cores), options);
  }

  // Chrome's trace-event JSON of the simulated timeline (chrome://tracing, Perfetto).
  std::string trace(const std::string& text, double mem_w_ratio, double cores) const {
    return render_chrome_trace(timeline(text, mem_w_ratio, cores));
  }

  const Schedule& shown(bool with_comms) const {
    return with_comms ? *made.validated : made.validated.given();
  }
};

std::vector<std::vector<std::string>> action_texts(const Schedule& schedule) {
  std::vector<std::vector<std::string>> out;
  for (const auto& list : schedule.actions) {
    out.emplace_back();
    for (const Action& a : list) out.back().push_back(to_string(a));
  }
  return out;
}

// A finished search of the joint planner: plan.json's text, and what evaluating one of its
// ranked candidates again needs.
struct PlanResult {
  Profile profile;
  PlannerOptions options;
  PlanSearch search;
  std::string json;

  // The ranked candidate's schedule (compute only, as the plan folder's schedule.csv) with its
  // own cost model: simulating it gives the candidate's step_ms as the makespan.
  PlannedSchedule candidate(int index) const {
    const int count = static_cast<int>(search.ranked.size());
    PPTRAIN_CHECK(index >= 0 && index < count, "candidate index must be 0 .. ", count - 1, ", got ",
                  index);
    Candidate c = search.ranked[static_cast<size_t>(index)];
    Evaluation evaluation = evaluate(profile, options, c);
    PlannedSchedule out{prepared(std::move(evaluation.schedule), c.microbatches, 1),
                        ScheduleSolver::kHeuristic, 1, std::move(evaluation.cost)};
    return out;
  }
};

// `pptrain partition --json` as text.
std::string partition_json(const std::string& profile_path, const std::string& method, int pp,
                           int workers, const std::vector<std::pair<int, double>>& levels,
                           double bandwidth, double memory_limit) {
  PartitionRequest request;
  request.method = method;
  request.pp = pp;
  request.workers = workers;
  for (const auto& [n, bytes_per_s] : levels) request.levels.push_back({n, bytes_per_s});
  request.bandwidth = bandwidth;
  request.memory_limit = memory_limit;
  const PartitionOptions options = partition_options(request);
  return to_json(make_partition(read_profile(profile_path), options));
}

// `pptrain compare` (the options' fields named as its flags): compare.json's text, and with
// `write_files` its three files in options.out. `progress` (None: nothing) gets a line per run.
// The runs take minutes: Python's other threads go on meanwhile.
std::string compare_json_text(CompareOptions options, bool write_files, py::object progress) {
  std::function<void(const std::string&)> report;
  if (!progress.is_none()) {
    report = [&progress](const std::string& line) {
      py::gil_scoped_acquire acquire;
      progress(line);
    };
  }
  py::gil_scoped_release release;
  const CompareResult result = run_compare(std::move(options), report);
  if (write_files) write_compare_files(result);
  return compare_json(result).dump(2);
}

}  // namespace
}  // namespace pptrain::python

PYBIND11_MODULE(_plan, m) {
  using namespace pptrain;
  using namespace pptrain::python;
  m.doc() = "pptrain's schedules for Python, without torch (see pptrain.plan)";
  // A bad option or an invalid schedule: the CLI's one line (and the grid) as a ValueError.
  // An invalid schedule: ScheduleError, a PlanError that also carries `rank`, `position` (in
  // that rank's list; -1 for none) and `reason` (the line without location and grid). The
  // classes live as long as the module (raw objects: no destructor at interpreter exit).
  static PyObject* plan_error =
      PyErr_NewException("pptrain._plan.PlanError", PyExc_ValueError, nullptr);
  static PyObject* schedule_error =
      PyErr_NewException("pptrain._plan.ScheduleError", plan_error, nullptr);
  m.add_object("PlanError", py::handle(plan_error));
  m.add_object("ScheduleError", py::handle(schedule_error));
  py::register_local_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const ScheduleError& e) {
      py::object raised = py::reinterpret_borrow<py::object>(schedule_error)(e.what());
      raised.attr("rank") = e.rank();
      raised.attr("position") = e.position();
      raised.attr("reason") = e.message();
      PyErr_SetObject(schedule_error, raised.ptr());
    } catch (const UserError& e) {
      PyErr_SetString(plan_error, e.what());
    }
  });

  m.def("schedule_names", &schedule_names, "The registry's schedules, in its order");

  py::class_<PlannedSchedule>(m, "Schedule")
      .def_property_readonly("name",
                             [](const PlannedSchedule& p) { return p.made.validated.given().name; })
      .def_property_readonly(
          "num_ranks", [](const PlannedSchedule& p) { return p.made.validated.given().num_ranks; })
      .def_property_readonly(
          "num_stages",
          [](const PlannedSchedule& p) { return p.made.validated.given().num_stages; })
      .def_property_readonly(
          "num_microbatches",
          [](const PlannedSchedule& p) { return p.made.validated.given().num_microbatches; })
      .def_property_readonly(
          "chunks", [](const PlannedSchedule& p) { return p.made.validated.given().chunks(); })
      .def_property_readonly("synchronous",
                             [](const PlannedSchedule& p) { return !p.made.rule.asynchronous(); })
      .def_property_readonly("skips",
                             [](const PlannedSchedule& p) {
                               std::vector<std::pair<int, int>> out;
                               for (const SkipLink& s : p.made.validated.given().skips) {
                                 out.emplace_back(s.from, s.to);
                               }
                               return out;
                             })
      .def(
          "actions",
          [](const PlannedSchedule& p, bool with_comms) {
            return action_texts(p.shown(with_comms));
          },
          py::arg("with_comms") = false)
      .def(
          "to_csv",
          [](const PlannedSchedule& p, bool with_comms) {
            return to_csv(with_comms ? *p.made.validated : strip_comms(p.made.validated.given()));
          },
          py::arg("with_comms") = false)
      .def(
          "grid",
          [](const PlannedSchedule& p, bool with_comms) {
            GridOptions options;
            options.with_comms = with_comms;
            return render_grid(p.shown(with_comms), options);
          },
          py::arg("with_comms") = false)
      .def("summary_json", &PlannedSchedule::summary_json, py::arg("cost"), py::arg("mem_w_ratio"),
           py::arg("memory_limit"), py::arg("cores"))
      .def("svg", &PlannedSchedule::svg, py::arg("cost"), py::arg("mem_w_ratio"),
           py::arg("with_comms"), py::arg("cores"))
      .def("trace", &PlannedSchedule::trace, py::arg("cost"), py::arg("mem_w_ratio"),
           py::arg("cores"));

  py::class_<PlanResult>(m, "PlanResult")
      .def_readonly("json", &PlanResult::json)
      .def("candidate", &PlanResult::candidate, py::arg("index"));

  m.def("partition_json", &partition_json, py::arg("profile"), py::arg("method"), py::arg("pp"),
        py::arg("workers"), py::arg("levels"), py::arg("bandwidth"), py::arg("memory_limit"));

  m.def(
      "make_schedule",
      [](const std::string& name, std::optional<int> pp, std::optional<int> microbatches,
         int chunks, const std::string& cost, double mem_w_ratio, double memory_limit,
         const std::string& solver, double time_limit_s, int dp, int steps,
         std::vector<int> replicas, std::vector<std::pair<int, int>> skips,
         const py::dict& family) {
        ScheduleRequest request;
        request.schedule = name;
        request.pp = pp;
        request.microbatches = microbatches;
        request.chunks = chunks;
        request.memory_limit = memory_limit;
        request.solver = parse_solver(solver);
        request.time_limit_s = time_limit_s;
        request.dp = dp;
        request.steps = steps;
        request.family = family_values_of(family);
        request.replicas = std::move(replicas);
        if (!skips.empty()) request.skips.emplace();
        for (const auto& [from, to] : skips) request.skips->push_back({from, to});
        CostModel c = cost_model_from_flags(cost, mem_w_ratio);
        c.replicas = dp;
        RunRequest run;  // a schedule to look at: nothing trains
        run.schedule = request;
        PlannedSchedule out{resolve_run(run, c).schedule, request.solver, dp, std::nullopt};
        return out;
      },
      py::arg("name"), py::arg("pp"), py::arg("microbatches"), py::arg("chunks"), py::arg("cost"),
      py::arg("mem_w_ratio"), py::arg("memory_limit"), py::arg("solver"), py::arg("time_limit_s"),
      py::arg("dp"), py::arg("steps"), py::arg("replicas"), py::arg("skips"), py::arg("family"));

  // The joint planner (`pptrain plan`): plan.json's text, and with `out` its folder written.
  m.def(
      "plan",
      [](const std::string& profile_path, int workers, double memory_limit, int batch,
         std::vector<int> microbatches, std::vector<std::string> partitions,
         std::vector<std::string> schedules, std::vector<bool> recompute,
         const std::string& optimizer, double mem_w_ratio, std::optional<double> w_fraction,
         int max_chunks, int top, double memory_margin, int jobs, const std::string& out) {
        PlannerOptions options;
        options.workers = workers;
        options.memory_limit_bytes = memory_limit;
        options.memory_margin = memory_margin;
        options.jobs = jobs;
        options.batch_size = batch;
        options.microbatches = std::move(microbatches);
        options.partitions = std::move(partitions);
        options.schedules = std::move(schedules);
        options.recompute = std::move(recompute);
        options.optimizer_state_factor = optimizer_state_factor(optimizer);
        options.mem_w_ratio = mem_w_ratio;
        options.w_fraction = w_fraction.value_or(0);
        options.max_chunks = max_chunks;
        options.keep = top;
        check_planner_options(options);
        Profile profile = read_profile(profile_path);
        if (w_fraction) check_w_fraction_applies(profile, *w_fraction);
        PlanSearch search = search_plans(profile, options);
        std::string json = out.empty()
                               ? plan_json(profile, options, search)
                               : write_plan_folder(out, profile, options, search, PlanFiles{});
        return PlanResult{profile, options, std::move(search), std::move(json)};
      },
      py::arg("profile"), py::arg("workers"), py::arg("memory_limit"), py::arg("batch"),
      py::arg("microbatches"), py::arg("partitions"), py::arg("schedules"), py::arg("recompute"),
      py::arg("optimizer"), py::arg("mem_w_ratio"), py::arg("w_fraction"), py::arg("max_chunks"),
      py::arg("top"), py::arg("memory_margin"), py::arg("jobs"), py::arg("out"));

  m.def(
      "compare",
      [](const std::string& out, bool write_files, std::optional<std::string> only,
         const std::string& pptrain, const std::string& model, int layers, int d_model, int heads,
         int seq_len, const std::string& data, int pp, int batch_size, int microbatches, int steps,
         int seed, int loss_at, py::object progress) {
        CompareOptions options;
        options.out = out;
        options.only = std::move(only);
        options.pptrain = pptrain;
        options.model = model;
        options.layers = layers;
        options.d_model = d_model;
        options.heads = heads;
        options.seq_len = seq_len;
        options.data = data;
        options.pp = pp;
        options.batch_size = batch_size;
        options.microbatches = microbatches;
        options.steps = steps;
        options.seed = seed;
        options.loss_at = loss_at;
        return compare_json_text(std::move(options), write_files, std::move(progress));
      },
      py::arg("out"), py::arg("write_files"), py::arg("only"), py::arg("pptrain"), py::arg("model"),
      py::arg("layers"), py::arg("d_model"), py::arg("heads"), py::arg("seq_len"), py::arg("data"),
      py::arg("pp"), py::arg("batch_size"), py::arg("microbatches"), py::arg("steps"),
      py::arg("seed"), py::arg("loss_at"), py::arg("progress"));

  m.def(
      "import_csv",
      [](const std::string& text, const std::string& name, int dp) {
        Schedule s = parse_csv(text, name);
        const int microbatches = s.num_microbatches;
        return PlannedSchedule{prepared(std::move(s), microbatches, dp), ScheduleSolver::kHeuristic,
                               dp, std::nullopt};
      },
      py::arg("text"), py::arg("name"), py::arg("dp"));
}
