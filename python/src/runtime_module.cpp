// pptrain._runtime: the pipeline runtime for a Python torch.nn.Module (python/pptrain/runtime.py
// is its Python face). The library's PipelineStage and PipelineSchedule (pptrain/api/pipeline.h)
// run it; this file only carries tensors, modules and errors across.
//
// Python and this extension share one libtorch (Debian builds python3-torch and libtorch-dev
// from the same source), so a tensor crosses without a copy and the module's parameters are the
// very tensors the executor's backward accumulates into.
//
// The GIL: step() releases it while the schedule runs (waits on messages included), and the
// module's forward and the loss take it back for as long as they run Python code.
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "pptrain/api/pipeline.h"
#include "pptrain/common/check.h"
#include "pptrain/common/keywords.h"
#include "pptrain/job/supervisor.h"
#include "pptrain/job/train_args.h"
#include "pptrain/models/pipe_linear.h"
#include "pptrain/sim/compare.h"
#include "pptrain/train/observers.h"
#include "python/src/family_keywords.h"

namespace py = pybind11;

namespace pptrain::python {
namespace {

// A stage's input or output as Python sees it: one tensor, a tuple of them, or a dict.
py::object to_python(const TensorBundle& bundle) {
  if (bundle.named()) {
    py::dict out;
    for (size_t i = 0; i < bundle.size(); ++i) out[py::str(bundle.names()[i])] = bundle[i];
    return std::move(out);
  }
  if (bundle.size() == 1) return py::cast(bundle[0]);
  py::tuple out(bundle.size());
  for (size_t i = 0; i < bundle.size(); ++i) out[i] = py::cast(bundle[i]);
  return std::move(out);
}

std::string type_name(py::handle object) {
  return py::str(py::type::handle_of(object).attr("__name__"));
}

// What Python gave (a tensor, a tuple or list of tensors, a dict of them) as a bundle; UserError
// starting with `what` otherwise.
TensorBundle from_python(py::handle object, const std::string& what) {
  const auto tensor_of = [&](py::handle item, const std::string& where) {
    PPTRAIN_CHECK(THPVariable_Check(item.ptr()), what, " holds a ", type_name(item), where,
                  "; expected tensors");
    return THPVariable_Unpack(item.ptr());
  };
  if (THPVariable_Check(object.ptr())) return TensorBundle(THPVariable_Unpack(object.ptr()));
  if (py::isinstance<py::dict>(object)) {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(object)) {
      PPTRAIN_CHECK(py::isinstance<py::str>(key), what, " is a dict whose keys are not all str");
      const std::string name = py::str(key);
      named.emplace_back(name, tensor_of(value, " under '" + name + "'"));
    }
    return TensorBundle(std::move(named));
  }
  if (py::isinstance<py::tuple>(object) || py::isinstance<py::list>(object)) {
    std::vector<torch::Tensor> tensors;
    size_t i = 0;
    for (const auto& item : py::reinterpret_borrow<py::sequence>(object)) {
      tensors.push_back(tensor_of(item, " at index " + std::to_string(i++)));
    }
    return TensorBundle(std::move(tensors));
  }
  throw UserError(what + " is a " + type_name(object) +
                  "; expected a tensor, a tuple or list of tensors, or a dict of them");
}

// A Python exception raised by the user's code: its traceback goes to stderr now (the rank's
// log shows where it happened), and it continues as a ModuleError that names `where`.
[[noreturn]] void rethrow_python_error(py::error_already_set& error, const std::string& where) {
  std::string text = py::str(error.value());
  const std::string kind = py::str(error.type().attr("__name__"));
  py::module_::import("traceback")
      .attr("print_exception")(error.type(), error.value(), error.trace());
  py::module_::import("sys").attr("stderr").attr("flush")();
  throw ModuleError(where + " raised " + kind + ": " + text);
}

// The user's module as one layer of a runtime Stage: its parameters registered as the layer's own
// (the same tensors), its forward called with the stage's input.
class PythonModuleImpl : public torch::nn::Module {
 public:
  PythonModuleImpl(py::object module, int stage) : module_(std::move(module)), stage_(stage) {
    int n = 0;
    for (const auto& item : module_.attr("named_parameters")()) {
      const auto pair = py::reinterpret_borrow<py::tuple>(item);
      const torch::Tensor parameter = THPVariable_Unpack(pair[1].ptr());
      // Module names may not hold dots; the number keeps them distinct.
      std::string name = py::str(pair[0]);
      for (char& c : name) c = c == '.' ? '_' : c;
      register_parameter(std::to_string(n++) + "_" + name, parameter, parameter.requires_grad());
    }
  }
  ~PythonModuleImpl() override {
    py::gil_scoped_acquire gil;
    module_ = py::object();
  }

  TensorBundle forward(const TensorBundle& input) {
    py::gil_scoped_acquire gil;
    const std::string where = "the module of stage " + std::to_string(stage_);  // its forward
    try {
      py::object out;
      if (input.named()) {
        out = module_(**py::reinterpret_borrow<py::dict>(to_python(input)));
      } else {
        py::tuple args(input.size());
        for (size_t i = 0; i < input.size(); ++i) args[i] = py::cast(input[i]);
        out = module_(*args);
      }
      return from_python(out, "the output of stage " + std::to_string(stage_));
    } catch (py::error_already_set& error) {
      rethrow_python_error(error, where);
    } catch (const ModuleError&) {
      throw;
    } catch (const UserError& error) {
      throw ModuleError(error.what());  // the module's output: its own doing, not its input's
    }
  }

 private:
  py::object module_;
  int stage_;
};
TORCH_MODULE(PythonModule);

// The process's world, joined once (torchrun's environment, or `pptrain run`'s).
World& world() {
  static std::optional<World> joined;
  if (!joined) joined = init_from_env();
  return *joined;
}

// The user's module as a runtime Stage of one layer, numbered as the stage (so that the layers
// of different stages differ, as ZeRO-1's sharding of the optimizer state needs).
Stage stage_of(py::object module, int index) {
  return Stage(index, index, {torch::nn::AnyModule(PythonModule(std::move(module), index))},
               /*bundle_layers=*/{true});
}

// A stage for the Python side: the library's PipelineStage over the user's module, which it
// keeps alive. The copies an asynchronous schedule keeps its weight versions in are deep copies
// of the module (copy.deepcopy).
struct PyStage {
  PyStage(py::object module, int index, int num_stages)
      : module(module),
        stage(std::make_unique<PipelineStage>(stage_of(module, index), num_stages, [module, index] {
          py::gil_scoped_acquire gil;
          return stage_of(py::module_::import("copy").attr("deepcopy")(module), index);
        })) {}
  py::object module;
  std::unique_ptr<PipelineStage> stage;
};

// Keeps the latest step's report (rank 0 gets them all) as its --metrics line, and the measured
// timelines of the steps since the last comparison, for compare_sim().
class LatestReport : public StepObserver {
 public:
  void on_start(const RunInfo& run) override { steps_.start(run); }
  void on_step(const StepReport& report) override {
    latest_ = to_json(step_metrics(report)).dump();
    steps_.add(report);
  }
  const std::string& latest() const { return latest_; }

  // `pptrain train --compare-sim`'s figures over the steps kept (then forgotten): the schedule
  // simulated with their measured costs against their measured makespan; empty when no step
  // after the first was seen since the last call.
  std::string compare_sim() {
    const std::optional<Comparison> comparison = steps_.compare(/*or_warmup=*/false);
    steps_.clear();
    return comparison ? comparison_json(*comparison).dump() : "";
  }

 private:
  std::string latest_;
  MeasuredSteps steps_{/*kept=*/64};  // the latest steps' timelines, at most 64
};

// Where a schedule's observers write: `pptrain train`'s --metrics, --svg and --trace files.
struct ReportFiles {
  std::string metrics, svg, trace;
};

// A schedule for the Python side, holding its stages, loss and observers.
class PySchedule {
 public:
  PySchedule(std::vector<std::shared_ptr<PyStage>> stages, PipelineOptions options,
             py::object loss_fn, const ReportFiles& files)
      : stages_(std::move(stages)), loss_fn_(std::move(loss_fn)) {
    observers_.push_back(std::make_unique<LatestReport>());
    if (!files.metrics.empty())
      observers_.push_back(std::make_unique<MetricsWriter>(files.metrics));
    if (!files.svg.empty()) observers_.push_back(std::make_unique<SvgWriter>(files.svg));
    if (!files.trace.empty()) observers_.push_back(std::make_unique<TraceWriter>(files.trace));
    for (const auto& o : observers_) options.observers.push_back(o.get());
    std::vector<PipelineStage*> pointers;
    for (const auto& s : stages_) pointers.push_back(s->stage.get());
    py::object loss = loss_fn_;
    const BundleLossFn bundle_loss = [loss](const TensorBundle& output,
                                            const TensorBundle& target) {
      py::gil_scoped_acquire gil;
      try {
        py::object value = loss(to_python(output), to_python(target));
        PPTRAIN_CHECK(THPVariable_Check(value.ptr()), "loss_fn returned a ", type_name(value),
                      "; expected a scalar tensor");
        return THPVariable_Unpack(value.ptr());
      } catch (py::error_already_set& error) {
        rethrow_python_error(error, "loss_fn");
      }
    };
    schedule_ =
        std::make_unique<PipelineSchedule>(world(), pointers, std::move(options), bundle_loss);
  }
  // Dropped after its last step, the schedule waits for the other ranks (finish(): a rank that
  // left early would break their last transfers); after a failed step it waits for nobody, so
  // that a rank that failed never holds the others.
  ~PySchedule() {
    if (!schedule_) return;
    if (failed_) schedule_->abandon();
    py::gil_scoped_release release;
    schedule_.reset();
  }

  void finish() {
    py::gil_scoped_release release;  // waits for the other ranks
    schedule_->finish();
  }

  // The batches from `source`, called with the step number and returning (inputs, target): what
  // an asynchronous schedule needs.
  py::object step_from(py::object source) {
    const BatchSource batches = [source](int step) {
      py::gil_scoped_acquire gil;
      try {
        const py::object batch = source(step);
        PPTRAIN_CHECK(py::isinstance<py::tuple>(batch) && py::len(batch) == 2,
                      "the batch source returned a ", type_name(batch), " for step ", step,
                      "; expected a tuple (inputs, target)");
        const auto pair = py::reinterpret_borrow<py::tuple>(batch);
        return Batch{from_python(pair[0], "the inputs of step " + std::to_string(step)),
                     from_python(pair[1], "the target of step " + std::to_string(step))};
      } catch (py::error_already_set& error) {
        rethrow_python_error(error, "the batch source");
      }
    };
    const torch::Tensor loss = run([&] { return schedule_->step(batches); });
    if (!loss.defined()) return py::none();
    return py::cast(loss);
  }

  py::object step(py::object inputs, py::object target) {
    const TensorBundle in = inputs.is_none() ? TensorBundle() : from_python(inputs, "the input");
    const TensorBundle targets =
        target.is_none() ? TensorBundle() : from_python(target, "the target");
    const torch::Tensor loss = run([&] { return schedule_->step(in, targets); });
    if (!loss.defined()) return py::none();
    return py::cast(loss);
  }

  std::string schedule_csv() const { return to_csv(schedule_->schedule()); }

  // PipelineSchedule::save with `files` ({name: bytes}: the stage files and the program's own).
  void save(const std::string& dir, int steps_done, const py::dict& files, int keep) {
    std::vector<ArchiveFile> archives;
    for (const auto& [name, bytes] : files) {
      archives.push_back(ArchiveFile::of_bytes(py::str(name), bytes.cast<std::string>()));
    }
    py::gil_scoped_release release;  // a collective: waits for the other ranks
    schedule_->save(dir, steps_done, std::move(archives), keep);
  }
  std::vector<int> saved_stages() const { return schedule_->saved_stages(); }
  // The checkpoint it continued, as read_checkpoint gives it.
  py::object resume(const std::string& dir) {
    return py::module_::import("json").attr("loads")(to_json_text(schedule_->resume(dir)));
  }

  // The latest step's figures as a dict (its --metrics line) on rank 0; None elsewhere.
  py::object report() const { return json_or_none(latest_report().latest()); }
  // LatestReport::compare_sim() as a dict on rank 0; None elsewhere and before a second step.
  py::object compare_sim() { return json_or_none(latest_report().compare_sim()); }

 private:
  // One step without the GIL; a step that fails marks the schedule failed.
  template <typename Step>
  torch::Tensor run(Step step) {
    py::gil_scoped_release release;
    try {
      return step();
    } catch (...) {
      failed_ = true;
      throw;
    }
  }

  LatestReport& latest_report() const { return static_cast<LatestReport&>(*observers_.front()); }
  static py::object json_or_none(const std::string& text) {
    if (text.empty()) return py::none();
    return py::module_::import("json").attr("loads")(text);
  }

  std::vector<std::shared_ptr<PyStage>> stages_;
  py::object loss_fn_;
  std::vector<std::unique_ptr<StepObserver>> observers_;  // outlive the schedule, which ends them
  std::unique_ptr<PipelineSchedule> schedule_;
  bool failed_ = false;
};

PipelineOptions options_of(const std::string& name, int microbatches, int chunks,
                           const std::string& schedule_file, bool recompute, int data_parallel) {
  PipelineOptions options;
  options.schedule = name;
  options.microbatches = microbatches;
  options.chunks = chunks;
  options.schedule_file = schedule_file;
  options.recompute = recompute;
  options.data_parallel = data_parallel;
  return options;
}

// pptrain.schedule's `tied`: {name: [the stages holding a copy]}.
std::vector<TiedParameter> tied_of(const py::dict& given) {
  std::vector<TiedParameter> out;
  for (const auto& [key, value] : given) {
    PPTRAIN_CHECK(py::isinstance<py::str>(key), "tied: the names must be str, got ",
                  std::string(py::repr(key)));
    const std::string name = py::str(key);
    PPTRAIN_CHECK(py::isinstance<py::sequence>(value) && !py::isinstance<py::str>(value), "tied: '",
                  name, "' must map to a list of stages, got ", std::string(py::repr(value)));
    out.push_back({name, value.cast<std::vector<int>>()});
  }
  return out;
}

// pptrain.schedule's `skips`: [(name, from_stage, to_stage)].
std::vector<SkipConnection> skips_of(const py::list& given) {
  std::vector<SkipConnection> out;
  for (const auto& item : given) {
    const bool fits = py::isinstance<py::sequence>(item) && !py::isinstance<py::str>(item) &&
                      py::len(item) == 3 && py::isinstance<py::str>(item[py::int_(0)]) &&
                      py::isinstance<py::int_>(item[py::int_(1)]) &&
                      py::isinstance<py::int_>(item[py::int_(2)]);
    PPTRAIN_CHECK(fits, "skips: each must be (name, from_stage, to_stage), got ",
                  std::string(py::repr(item)));
    out.push_back(
        {py::str(item[py::int_(0)]), item[py::int_(1)].cast<int>(), item[py::int_(2)].cast<int>()});
  }
  return out;
}

// Fills `out` from a Python dict of keywords, each a field `fields` names; UserError naming
// `what` and the keywords it takes for any other.
template <typename Options>
void read_keywords(
    const py::dict& given, const std::string& what,
    const std::vector<std::pair<std::string, void (*)(Options&, py::handle)>>& fields,
    Options& out) {
  for (const auto& [key, value] : given) {
    const std::string name = py::str(key);
    const auto field = std::find_if(fields.begin(), fields.end(),
                                    [&name](const auto& f) { return f.first == name; });
    if (field == fields.end()) {
      std::string names;
      for (const auto& f : fields) names += (names.empty() ? "" : ", ") + f.first;
      throw UserError(what + ": unknown option '" + name + "' (expected " + names + ")");
    }
    field->second(out, value);
  }
}

// pptrain's optimizer from Python's keywords (pptrain.runtime.schedule's `optimizer` dict).
OptimizerOptions optimizer_of(const py::dict& given) {
  using O = OptimizerOptions;
  OptimizerOptions out;
  read_keywords<O>(given, "optimizer",
                   {{"kind", [](O& o, py::handle v) { o.kind = py::str(v); }},
                    {"lr", [](O& o, py::handle v) { o.lr = v.cast<double>(); }},
                    {"momentum", [](O& o, py::handle v) { o.momentum = v.cast<double>(); }},
                    {"warmup_steps", [](O& o, py::handle v) { o.warmup_steps = v.cast<int>(); }},
                    {"clip", [](O& o, py::handle v) { o.clip = v.cast<double>(); }}},
                   out);
  return out;  // checked with the run (planner/run_request.h)
}

// pptrain.train()'s keywords as `pptrain train`'s flags (job/train_args.h: the same list, a
// flag's keyword is its name without the dashes, '_' for '-'), resolved as the CLI resolves
// them; the keywords of the nodes (nnodes, node_rank, ...) go to `nodes`.
TrainOptions train_options_of(const py::dict& keywords, NodeGroupOptions* nodes) {
  TrainArgs args;
  std::set<std::string> given;
  for (const auto& [key, value] : keywords) {
    const std::string keyword = py::str(key);
    const auto& flags = train_flags();
    const auto flag = std::find_if(flags.begin(), flags.end(), [&keyword](const TrainFlag& f) {
      return !f.has(TrainFlag::kHidden) && keyword_of(f.name) == keyword;
    });
    PPTRAIN_CHECK(flag != flags.end(), "pptrain.train: unknown keyword '", keyword,
                  "' (the keywords are `pptrain train`'s flags: --batch-size is batch_size)");
    std::visit(
        [&](auto* target) {
          using T = std::remove_pointer_t<decltype(target)>;
          const char* expected = std::is_same_v<T, bool>          ? "True or False"
                                 : std::is_same_v<T, std::string> ? "a str or a path"
                                 : std::is_same_v<T, double>      ? "a number"
                                                                  : "a whole number";
          const bool fits =
              std::is_same_v<T, bool> ? py::isinstance<py::bool_>(value)
              : std::is_same_v<T, std::string>
                  ? py::isinstance<py::str>(value) || py::hasattr(value, "__fspath__")
              : std::is_same_v<T, double>
                  ? py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value)
                  : py::isinstance<py::int_>(value) && !py::isinstance<py::bool_>(value);
          PPTRAIN_CHECK(fits, "pptrain.train: ", keyword, " must be ", expected, ", got ",
                        std::string(py::repr(value)));
          if constexpr (std::is_same_v<T, std::string>) {
            *target = py::str(py::module_::import("os").attr("fspath")(value));
          } else {
            *target = value.template cast<T>();
          }
        },
        flag->target(args));
    given.insert(flag->name);
  }
  *nodes = args.nodes;
  return resolve_train_args(args, given);
}

}  // namespace
}  // namespace pptrain::python

PYBIND11_MODULE(_runtime, m) {
  using namespace pptrain;
  using namespace pptrain::python;
  m.def(
      "linear",
      [](const torch::Tensor& input, const torch::Tensor& weight,
         const std::optional<torch::Tensor>& bias) {
        return pipe_linear(input, weight, bias.value_or(torch::Tensor()));
      },
      py::arg("input"), py::arg("weight"), py::arg("bias"),
      "y = x W^T + b whose weight gradients a zero-bubble schedule's W computes "
      "(weight_split='deferred')");
  m.doc() = "pptrain's pipeline runtime for torch.nn.Module (see pptrain.runtime)";
  py::register_exception<UserError>(m, "PipelineError", PyExc_ValueError);

  m.def(
      "world", [] { return py::make_tuple(world().rank, world().size); },
      "(rank, size) of this process, joining the run (torchrun's, srun's or mpirun's "
      "environment) on first use");
  m.def(
      "placement",
      [](const std::string& name, int microbatches, int chunks, const std::string& file,
         int data_parallel) {
        PipelineOptions options =
            options_of(name, microbatches, chunks, file, false, data_parallel);
        options.steps = 1;  // an asynchronous schedule's run length does not move its stages
        const StagePlacement placed = place_stages(world(), options);
        return py::make_tuple(placed.num_stages, placed.local);
      },
      py::arg("name"), py::arg("microbatches"), py::arg("chunks") = 0,
      py::arg("schedule_file") = "", py::arg("data_parallel") = 1,
      "(number of stages, this rank's stages) of the schedule");

  m.def(
      "train",
      [](const py::dict& keywords) {
        NodeGroupOptions nodes;
        const TrainOptions options = train_options_of(keywords, &nodes);
        // LibTorch's autograd refuses to run under the GIL, and the workers (forks of this
        // process) never touch Python.
        RunResult result;
        {
          py::gil_scoped_release no_python;
          result = run_training(options, nodes);
        }
        return py::make_tuple(result.exit_code, result.message);
      },
      py::arg("keywords"),
      "`pptrain train` with its flags as keywords: (exit code, the failure's line or '')");

  m.def(
      "read_checkpoint",
      [](const std::string& dir, const std::string& flag) {
        const std::string text = to_json_text(read_module_checkpoint(dir, flag));
        return py::module_::import("json").attr("loads")(text);
      },
      py::arg("dir"), py::arg("flag"),
      "the manifest of a whole checkpoint of modules (its files checked) as a dict");
  m.def(
      "newest_checkpoint",
      [](const std::string& save_dir) { return newest_module_checkpoint(save_dir); },
      py::arg("save_dir"),
      "the newest whole checkpoint of modules at save_dir or kept beside it; '' if none");

  py::class_<PyStage, std::shared_ptr<PyStage>>(m, "Stage")
      .def(py::init<py::object, int, int>(), py::arg("module"), py::arg("stage_index"),
           py::arg("num_stages"))
      .def_property_readonly("index", [](const PyStage& s) { return s.stage->index(); })
      .def_property_readonly("num_stages", [](const PyStage& s) { return s.stage->num_stages(); })
      .def_readonly("module", &PyStage::module)
      .def(
          "tie",
          [](PyStage& s, const std::string& name, const torch::Tensor& parameter) {
            s.stage->tie(name, parameter);
          },
          py::arg("name"), py::arg("parameter"))
      .def(
          "take_from_batch",
          [](PyStage& s, std::vector<std::string> names) {
            s.stage->take_from_batch(std::move(names));
          },
          py::arg("names"))
      .def(
          "keep_dtype",
          [](PyStage& s, std::vector<std::string> names) { s.stage->keep_dtype(std::move(names)); },
          py::arg("names"));

  py::class_<PySchedule>(m, "Schedule")
      .def(py::init([](std::vector<std::shared_ptr<PyStage>> stages, const std::string& name,
                       int microbatches, py::object loss_fn, int chunks,
                       const std::string& schedule_file, bool recompute, py::object optimizer,
                       int steps, bool one_process, const std::string& metrics,
                       const std::string& svg, const std::string& trace, const py::dict& family,
                       const std::string& weight_split, double tokens_per_sample, int data_parallel,
                       int zero, const py::dict& tied, const py::list& skips,
                       std::vector<int> data_parallel_shares, const std::string& precision,
                       const std::string& weight_casts) {
             PipelineOptions options =
                 options_of(name, microbatches, chunks, schedule_file, recompute, data_parallel);
             options.precision = parse_precision(precision, "precision");
             PPTRAIN_CHECK(weight_casts == "microbatch" || weight_casts == "step",
                           "weight_casts must be microbatch or step, got '", weight_casts, "'");
             options.casts_per_step = weight_casts == "step";
             options.data_parallel_shares = std::move(data_parallel_shares);
             options.zero = zero;
             options.tied = tied_of(tied);
             options.skips = skips_of(skips);
             PPTRAIN_CHECK(weight_split == "autograd" || weight_split == "deferred",
                           "weight_split must be autograd or deferred, got '", weight_split, "'");
             if (weight_split == "deferred") {
               options.weight_split = ExecutorOptions::WeightSplit::kDeferredLayers;
             }
             PPTRAIN_CHECK(tokens_per_sample >= 0, "tokens_per_sample must be >= 0, got ",
                           tokens_per_sample);
             options.tokens_per_sample = tokens_per_sample;
             if (!optimizer.is_none()) options.optimizer = optimizer_of(optimizer.cast<py::dict>());
             options.family = family_values_of(family);
             options.steps = steps;
             // The rule an asynchronous pipeline must reproduce: every stage on this one rank,
             // one microbatch after the other.
             if (one_process) {
               options.planned = serial_reference(options, static_cast<int>(stages.size()));
             }
             return std::make_unique<PySchedule>(std::move(stages), std::move(options),
                                                 std::move(loss_fn),
                                                 ReportFiles{metrics, svg, trace});
           }),
           py::arg("stages"), py::arg("name"), py::arg("microbatches"), py::arg("loss_fn"),
           py::arg("chunks") = 0, py::arg("schedule_file") = "", py::arg("recompute") = false,
           py::arg("optimizer") = py::none(), py::arg("steps") = 0, py::arg("one_process") = false,
           py::arg("metrics") = "", py::arg("svg") = "", py::arg("trace") = "",
           py::arg("family") = py::dict(), py::arg("weight_split") = "autograd",
           py::arg("tokens_per_sample") = 1.0, py::arg("data_parallel") = 1, py::arg("zero") = 0,
           py::arg("tied") = py::dict(), py::arg("skips") = py::list(),
           py::arg("data_parallel_shares") = std::vector<int>(), py::arg("precision") = "fp32",
           py::arg("weight_casts") = "microbatch")
      .def("report", &PySchedule::report)
      .def("compare_sim", &PySchedule::compare_sim)
      .def("step_from", &PySchedule::step_from, py::arg("source"))
      .def("step", &PySchedule::step, py::arg("inputs"), py::arg("target"))
      .def("finish", &PySchedule::finish)
      .def("csv", &PySchedule::schedule_csv)
      .def("save", &PySchedule::save, py::arg("dir"), py::arg("steps_done"), py::arg("files"),
           py::arg("keep") = 1)
      .def("saved_stages", &PySchedule::saved_stages)
      .def("resume", &PySchedule::resume, py::arg("dir"));
}
