// pptrain._plan: the schedules of pptrain's planner for Python, without LibTorch (python/pptrain/
// plan.py is its Python face). It calls what `pptrain schedule` calls
// (planner/schedule_request.h), so both take the same options, give the same figures and fail
// with the same one-line messages.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/partition/profile.h"
#include "pptrain/planner/plan_file.h"
#include "pptrain/planner/planner.h"
#include "pptrain/planner/schedule_request.h"
#include "pptrain/render/svg.h"
#include "pptrain/schedule/grid.h"
#include "pptrain/sim/cost_model.h"

namespace py = pybind11;

namespace pptrain::python {
namespace {

// A schedule made or imported, ready to simulate, draw and export.
struct PlannedSchedule {
  RequestedSchedule made;
  ScheduleSolver solver = ScheduleSolver::kHeuristic;
  int dp = 1;

  CostModel cost(const std::string& text, double mem_w_ratio, double cores) const {
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
    const SimResult result = simulate_requested(made, c, memory_limit);
    return schedule_summary_json(made, c, memory_limit, result, solver).dump();
  }

  std::string svg(const std::string& text, double mem_w_ratio, bool with_comms,
                  double cores) const {
    const CostModel c = cost(text, mem_w_ratio, cores);
    SimResult result = simulate_requested(made, c, 0);
    result.timeline.title = schedule_timeline_title(made, c, result);
    SvgOptions options;
    options.show_comms = with_comms;
    return render_svg(result.timeline, options);
  }

  const Schedule& shown(bool with_comms) const {
    return with_comms ? *made.validated : made.schedule;
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

}  // namespace
}  // namespace pptrain::python

PYBIND11_MODULE(_plan, m) {
  using namespace pptrain;
  using namespace pptrain::python;
  m.doc() = "pptrain's schedules for Python, without torch (see pptrain.plan)";
  // A bad option or an invalid schedule: the CLI's one line (and the grid) as a ValueError.
  py::register_exception<UserError>(m, "PlanError", PyExc_ValueError);

  m.def("schedule_names", &schedule_names, "The registry's schedules, in its order");

  py::class_<PlannedSchedule>(m, "Schedule")
      .def_property_readonly("name", [](const PlannedSchedule& p) { return p.made.schedule.name; })
      .def_property_readonly("num_ranks",
                             [](const PlannedSchedule& p) { return p.made.schedule.num_ranks; })
      .def_property_readonly("num_stages",
                             [](const PlannedSchedule& p) { return p.made.schedule.num_stages; })
      .def_property_readonly(
          "num_microbatches",
          [](const PlannedSchedule& p) { return p.made.schedule.num_microbatches; })
      .def_property_readonly("chunks",
                             [](const PlannedSchedule& p) { return p.made.schedule.chunks(); })
      .def_property_readonly("synchronous",
                             [](const PlannedSchedule& p) { return !p.made.rule.asynchronous(); })
      .def_property_readonly("skips",
                             [](const PlannedSchedule& p) {
                               std::vector<std::pair<int, int>> out;
                               for (const SkipLink& s : p.made.schedule.skips) {
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
            return to_csv(with_comms ? *p.made.validated : strip_comms(p.made.schedule));
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
           py::arg("with_comms"), py::arg("cores"));

  m.def(
      "make_schedule",
      [](const std::string& name, std::optional<int> pp, std::optional<int> microbatches,
         int chunks, const std::string& cost, double mem_w_ratio, double memory_limit,
         const std::string& solver, double time_limit_s, int dp, int steps, bool vertical_sync,
         std::vector<int> replicas, std::vector<std::pair<int, int>> skips) {
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
        request.vertical_sync = vertical_sync;
        request.replicas = std::move(replicas);
        for (const auto& [from, to] : skips) request.skips.push_back({from, to});
        CostModel c = cost_model_from_flags(cost, mem_w_ratio);
        c.replicas = dp;
        PlannedSchedule out{make_requested_schedule(request, c), request.solver, dp};
        return out;
      },
      py::arg("name"), py::arg("pp"), py::arg("microbatches"), py::arg("chunks"), py::arg("cost"),
      py::arg("mem_w_ratio"), py::arg("memory_limit"), py::arg("solver"), py::arg("time_limit_s"),
      py::arg("dp"), py::arg("steps"), py::arg("vertical_sync"), py::arg("replicas"),
      py::arg("skips"));

  // The joint planner (`pptrain plan`): plan.json's text, and with `out` its folder written.
  m.def(
      "plan",
      [](const std::string& profile_path, int workers, double memory_limit, int batch,
         std::vector<int> microbatches, std::vector<std::string> partitions,
         std::vector<std::string> schedules, std::vector<bool> recompute,
         const std::string& optimizer, double mem_w_ratio, std::optional<double> w_fraction,
         int max_chunks, int top, const std::string& out) {
        PlannerOptions options;
        options.workers = workers;
        options.memory_limit_bytes = memory_limit;
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
        const Profile profile = read_profile(profile_path);
        if (w_fraction) check_w_fraction_applies(profile, *w_fraction);
        const PlanSearch search = search_plans(profile, options);
        return out.empty() ? plan_json(profile, options, search)
                           : write_plan_folder(out, profile, options, search, PlanFiles{});
      },
      py::arg("profile"), py::arg("workers"), py::arg("memory_limit"), py::arg("batch"),
      py::arg("microbatches"), py::arg("partitions"), py::arg("schedules"), py::arg("recompute"),
      py::arg("optimizer"), py::arg("mem_w_ratio"), py::arg("w_fraction"), py::arg("max_chunks"),
      py::arg("top"), py::arg("out"));

  m.def(
      "import_csv",
      [](const std::string& text, const std::string& name, int dp) {
        Schedule s = parse_csv(text, name);
        const int microbatches = s.num_microbatches;
        return PlannedSchedule{
            prepare_schedule(std::move(s), std::string(), false, microbatches, dp),
            ScheduleSolver::kHeuristic, dp};
      },
      py::arg("text"), py::arg("name"), py::arg("dp"));
}
