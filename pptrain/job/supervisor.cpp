#include "pptrain/job/supervisor.h"

#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/common/error_report.h"
#include "pptrain/common/files.h"
#include "pptrain/device/compute_threads.h"
#include "pptrain/generators/registry.h"
#include "pptrain/job/relayout.h"
#include "pptrain/job/trainer.h"
#include "pptrain/job/worker_speeds.h"
#include "pptrain/runtime/cluster_env.h"
#include "pptrain/runtime/group.h"
#include "pptrain/runtime/launcher.h"
#include "pptrain/runtime/loopback_transport.h"
#include "pptrain/runtime/rendezvous.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/schedule/reductions.h"
#include "pptrain/train/checkpoint.h"
#include "pptrain/train/observers.h"
#include "pptrain/train/partition_plan.h"
#include "pptrain/train/plan_training.h"

namespace pptrain {
namespace {

// The plan's compute order (no SEND/RECV, no REDUCE_GRAD: each worker adds them again) in a
// new temporary CSV file; its path.
std::string solved_schedule_file(const TrainingPlan& plan) {
  std::string path = (std::filesystem::temp_directory_path() / "pptrain-solved-XXXXXX").string();
  const int fd = mkstemp(path.data());
  PPTRAIN_CHECK(fd >= 0, "cannot create a temporary file for the solved schedule in ",
                std::filesystem::temp_directory_path().string());
  close(fd);
  write_text_file(path, to_csv(remove_grad_reductions(strip_comms(*plan.schedule))),
                  "solved schedule file");
  return path;
}

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && access(path.c_str(), X_OK) == 0;
}

// The path execv() runs for `program`: as given when it has a '/', else found on PATH.
std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    PPTRAIN_CHECK(is_executable_file(program), "cannot run '", program,
                  "': not an executable file");
    return program;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t start = 0; start <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = dirs.substr(start, end - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  throw UserError("cannot run '" + program + "': no such program on PATH");
}

// The launcher's result as a run's.
RunResult result_of(const LaunchResult& launched, int max_restarts) {
  return {launched.exit_code,
          launched.exit_code == 0 ? std::string() : failure_text(launched, max_restarts)};
}

void say(const std::string& line) {
  std::fprintf(stderr, "pptrain: %s\n", line.c_str());
  std::fflush(stderr);
}

// This node's place for its `nproc` ranks: the one the flags give (static), or the one a c10d
// rendezvous gives in `round` (the restart count) after `last`, this node's place before.
// Said on stderr when the run spans nodes.
NodeAssignment place_node(const NodeGroup& group, int nproc, int round,
                          const std::optional<NodeAssignment>& last) {
  const NodeAssignment node = group.dynamic
                                  ? c10d_rendezvous(group, nproc, round, last ? &*last : nullptr)
                                  : static_assignment(group, nproc);
  if (group.multi_node()) say(describe_node(node, nproc));
  return node;
}

// "node 2 (host n3, 10.0.0.3) is gone; " for the nodes the meeting found gone; empty for none.
std::string gone_text(const NodeAssignment& node) {
  std::string text;
  for (const std::string& lost : node.lost) text += lost + " is gone; ";
  return text;
}

// This node's place in the meeting of restart `restart` (of `max_restarts`) after the run
// failed with `why`. A meeting that fails (the endpoint unreachable, too few nodes) ends the run
// with one line that says why it was held as well (`pptrain run` says that before it meets).
template <typename Place>
NodeAssignment meet_again(Place&& place, int restart, int max_restarts, const std::string& why) {
  try {
    return place(restart);
  } catch (const UserError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("restart " + std::to_string(restart) + "/" +
                             std::to_string(max_restarts) + " after: " + why +
                             "; the nodes did not meet again: " + e.what());
  }
}

// Under --nnodes MIN:MAX with room for more nodes, the launcher stops the ranks for a node that
// asks to join (rendezvous.h), while a restart is left to take it.
void stop_for_joining_nodes(const NodeGroup& group, LaunchOptions& launch) {
  if (!group.dynamic || group.min_nodes == group.max_nodes) return;
  launch.stop_for = [&launch] {
    if (launch.restart_count >= launch.max_restarts || !node_asks_to_join()) return std::string();
    return std::string("a node asks to join the run");
  };
}

// How many times an elastic launcher (torchrun, `pptrain run`) started this rank's group again,
// 0 on the first start or without one (TORCHELASTIC_RESTART_COUNT).
int launcher_restarts() {
  return cluster_env_of_process().restart_count;
}

// A rank started by an elastic launcher (TORCHELASTIC_RUN_ID: torchrun, `pptrain run`) in a
// world that does not fit --pp x --dp (its nodes met again without one, or with one more):
// the run goes on re-planned for that world, as `pptrain train --nnodes` re-plans as its own
// agent (job/relayout.h). Rank 0 chooses the layout (it alone may time the layers); the others
// receive its --pp and --dp and make the same plan.
Relayout relayout_for_launcher(const TrainOptions& options, const TrainingPlan& plan,
                               Transport& transport) {
  const int world = transport.world_size();
  PPTRAIN_CHECK(!plan.asynchronous(), "WORLD_SIZE=", world, " does not match --pp ", options.pp,
                " x --dp ", options.dp, ", and ", plan.schedule->name,
                " is asynchronous: its result depends on its stages, so it cannot be re-planned "
                "for another world");
  const bool restarted = launcher_restarts() > 0 && !options.save_dir.empty();
  torch::Tensor layout = torch::zeros({2}, torch::kInt64);
  std::optional<Relayout> chosen;
  if (transport.rank() == 0) {
    std::optional<Profile> layers;
    chosen.emplace(relayout(options, world, restarted, layers));
    layout[0] = chosen->options.pp;
    layout[1] = chosen->options.dp;
  }
  transport.allreduce_sum(layout);  // rank 0's choice, everywhere
  const int pp = static_cast<int>(layout[0].item<int64_t>());
  const int dp = static_cast<int>(layout[1].item<int64_t>());
  Relayout laid = relayout_as(options, pp, dp, restarted);
  if (transport.rank() == 0) {
    say("the launcher started " + std::to_string(world) + (world == 1 ? " rank" : " ranks") +
        ", not --pp " + std::to_string(options.pp) + " x --dp " + std::to_string(options.dp) +
        ": the run goes on as --pp " + std::to_string(pp) + " --dp " + std::to_string(dp) +
        (chosen->choice.empty() ? "" : " (" + chosen->choice + ")"));
  }
  return laid;
}

// Says where --resume auto continues from (the launching process, or rank 0 of a launcher's).
void tell_resume_auto(const TrainOptions& options, const TrainingPlan& plan) {
  for (const std::string& why : plan.resume_skipped) {
    std::fprintf(stderr, "pptrain: --resume auto: passing over a checkpoint: %s\n", why.c_str());
  }
  std::fprintf(
      stderr, "pptrain: --resume auto: %s\n",
      plan.resume_dir.empty()
          ? ("no checkpoint to continue in " + options.save_dir + ": starting at step 0").c_str()
          : ("continuing from step " + std::to_string(plan.first_step) + " of " + plan.resume_dir)
                .c_str());
}

// This process's rank of the run: the whole run when it is one process, else the rank its
// launcher names (a worker we forked, or one torchrun, `pptrain run`, srun or mpirun started).
// `tell_resume`: rank 0 says where --resume auto continues from (a launcher's ranks, whose
// launching process is not ours).
void train_here(const TrainOptions& launched_options, const TrainingPlan& launched_plan,
                bool tell_resume) {
  const TrainOptions* run_options = &launched_options;
  const TrainingPlan* run_plan = &launched_plan;
  std::optional<Relayout> relaid;  // the run re-planned for the launcher's world
  std::unique_ptr<Transport> transport;
  const int launched_world = launched_options.pp * launched_options.dp;
  TransportOptions transport_options;
  if (launched_world > 1 || std::getenv("WORLD_SIZE")) {
    transport_options = TransportOptions::from_env();
    if (launched_options.comm_timeout_s > 0) {
      transport_options.timeout = std::chrono::seconds(launched_options.comm_timeout_s);
    }
  }
  const auto connect = [&transport_options] {
    return transport_options.world_size == 1 ? std::move(make_loopback_transports(1).front())
                                             : connect_transport(transport_options);
  };
  if (std::getenv("TORCHELASTIC_RUN_ID") && transport_options.world_size != launched_world) {
    transport = connect();
    relaid.emplace(relayout_for_launcher(launched_options, launched_plan, *transport));
    run_options = &relaid->options;
    run_plan = &*relaid->plan;
  }
  const TrainOptions& options = *run_options;
  const TrainingPlan& plan = *run_plan;
  const int world = options.pp * options.dp;
  PPTRAIN_CHECK(world == 1 || transport_options.world_size == world,
                "WORLD_SIZE=", transport_options.world_size, " does not match --pp ", options.pp,
                " x --dp ", options.dp);
  if (!transport)
    transport = world == 1 ? std::move(make_loopback_transports(1).front()) : connect();
  if (tell_resume && options.resume_dir == "auto" && transport->rank() == 0) {
    tell_resume_auto(options, plan);
  }
  // --replan auto: where the ranks leave the checkpoint a new cut starts from: in memory
  // (/dev/shm) where the host has it, the run's port telling runs on one host apart.
  std::string moves;
  if (world > 1) {
    const std::filesystem::path shared_memory = "/dev/shm";
    moves = ((access(shared_memory.c_str(), W_OK) == 0 ? shared_memory
                                                       : std::filesystem::temp_directory_path()) /
             ("pptrain-replan-" + std::to_string(transport_options.master_port)))
                .string();
  }
  // --partition workers: the ranks cut the model now that they have met (and place it then).
  const bool measure = options.partition == kWorkersPartition && options.stage_layers.empty();
  const auto observers = make_observers(options);
  if (plan.replan) {  // places the ranks itself, anew at every move
    std::optional<WorkersCut> cut;
    if (measure) cut = plan_for_workers(options, plan, *transport);
    train_replanning(options, plan, std::move(cut), *transport, raw_pointers(observers), moves);
    return;
  }
  if (world > 1 && !plan.placement.empty() && !measure) {
    transport = placed_transport(std::move(transport), plan.placement);
  }
  if (measure && world > 1) {
    WorkersCut cut = plan_for_workers(options, plan, *transport);
    // The ranks measured themselves as the processes they are; now each plays its placed rank.
    if (!cut.plan.placement.empty()) {
      transport = placed_transport(std::move(transport), cut.plan.placement);
    }
    train(cut.plan, *transport, raw_pointers(observers));
    return;
  }
  train(plan, *transport, raw_pointers(observers));
}

// The workers of this node: all D x P on one node, else --nproc-per-node or an even share.
int workers_of_node(const TrainOptions& options, const NodeGroup& group, int nproc_per_node) {
  const int world = options.pp * options.dp;
  if (!group.multi_node()) {
    PPTRAIN_CHECK(nproc_per_node == 0 || nproc_per_node == world, "--nproc-per-node ",
                  nproc_per_node, " on one node: --pp ", options.pp, " x --dp ", options.dp,
                  " needs ", world);
    return world;
  }
  if (nproc_per_node > 0) return nproc_per_node;
  PPTRAIN_CHECK(world % group.max_nodes == 0, "--pp ", options.pp, " x --dp ", options.dp, " = ",
                world, " ranks do not divide over ", group.max_nodes,
                " nodes: give --nproc-per-node");
  return world / group.max_nodes;
}

// What every worker runs: `options` with what this process resolved for them in `plan`, so
// that all ranks hold the same layers, run the same solved order and continue the same
// checkpoint. --solver ilp: the order solved here (a time limit could end differently in each
// process) goes to a file of ours, whose path `solved` takes.
TrainOptions worker_options(const TrainOptions& options, const TrainingPlan& plan,
                            std::string& solved) {
  TrainOptions worker = options;
  // (--partition workers: the workers cut it themselves, job/worker_speeds.h.)
  if (worker.stage_layers.empty() && options.partition != kWorkersPartition) {
    worker.stage_layers = format_stage_layers(plan.stage_layers);
  }
  if (options.pp > 1 && options.solved_schedule.empty() &&
      parse_solver(options.solver) == ScheduleSolver::kIlp) {
    if (!solved.empty()) std::remove(solved.c_str());
    solved = solved_schedule_file(plan);
    worker.solved_schedule = solved;
  }
  // The workers continue the checkpoint resolved here (--resume auto, or after a restart).
  worker.resume_dir = plan.resume_dir;
  return worker;
}

// Starts this node's workers of `plan` (all D x P on one node) and supervises them, restarting
// a failed run from the newest whole checkpoint. Under --nnodes MIN:MAX a rendezvous that
// gathers another number of ranks (a node lost, or one more) re-plans the run for them
// (job/relayout.h).
RunResult supervise_workers(const TrainOptions& options, const TrainingPlan& plan,
                            const NodeGroup& group, int nproc) {
  std::string solved;
  TrainOptions worker = worker_options(options, plan, solved);
  std::optional<TrainingPlan> relaid;   // the plan for another number of ranks
  std::optional<Profile> timed_layers;  // the layers timed for it (job/relayout.h)
  const TrainingPlan* current = &plan;

  LaunchOptions launch;
  // This node's place in `round`, and the run re-planned when the ranks are not its own.
  const auto place = [&](int round) {
    const NodeAssignment node = place_node(group, nproc, round, launch.node);
    const int world = worker.pp * worker.dp;
    // (A node that came late met the others in their restart's round: it continues their run.)
    if (node.world_size == world && node.round == round) {
      if (!node.lost.empty()) say(gone_text(node) + "the run goes on as it was");
      return node;
    }
    PPTRAIN_CHECK(node.world_size == world || group.min_nodes < group.max_nodes, "the ",
                  node.nnodes, " nodes hold ", node.world_size, " ranks, but --pp ", worker.pp,
                  " x --dp ", worker.dp, " needs ", world);
    PPTRAIN_CHECK(!plan.asynchronous(), "the rendezvous gathered ", node.world_size, " ranks, not ",
                  world, ", and ", plan.schedule->name,
                  " is asynchronous: its result depends on its stages, so it cannot go on with "
                  "others (give --nnodes N)");
    Relayout next = relayout(options, node.world_size, node.round > 0, timed_layers);
    relaid.emplace(std::move(*next.plan));
    current = &*relaid;
    worker = worker_options(next.options, *relaid, solved);
    say(gone_text(node) + std::to_string(node.nnodes) + " nodes with " +
        std::to_string(node.world_size) + " ranks: the run goes on as --pp " +
        std::to_string(next.options.pp) + " --dp " + std::to_string(next.options.dp) + ", stages " +
        worker.stage_layers + (next.choice.empty() ? "" : " (" + next.choice + ")"));
    return node;
  };

  launch.workers = nproc;
  launch.max_restarts = options.max_restarts;
  launch.node = place(0);
  launch.stopped_timeout = std::chrono::seconds(options.stopped_timeout_s);
  stop_for_joining_nodes(group, launch);
  // The workers are this process forked, not executed again: LibTorch is loaded once, here.
  // Each forks with `worker` as it is at that moment.
  launch.run_in_child = [&worker](const std::vector<std::string>&) {
    return exit_status_of([&worker] { run_training(worker); });  // RANK is set: one rank
  };
  // --max-restarts: a failed run starts again from the newest whole checkpoint.
  const LaunchResult result = launch_with_restarts(
      launch, options.max_restarts, [&](int restart, const LaunchResult& failed) {
        // Killed after its last save: nothing is left to run.
        if (holds_finished_run(options.save_dir, *current)) {
          std::fprintf(stderr,
                       "pptrain: no restart after: %s; %s already holds the run's last step "
                       "(%d): the run is complete\n",
                       failed.message.c_str(), options.save_dir.c_str(), current->steps);
          std::fflush(stderr);
          return false;
        }
        // The nodes meet again first: a node lost or come changes the plan (place()).
        if (group.dynamic) {
          launch.node = meet_again(place, restart, options.max_restarts, failed.message);
        }
        std::vector<std::string> skipped;
        const std::string dir = newest_resumable(options.save_dir, *current, &skipped);
        for (const std::string& why : skipped) {
          std::fprintf(stderr, "pptrain: restart %d/%d: passing over a checkpoint: %s\n", restart,
                       options.max_restarts, why.c_str());
        }
        const int step = dir.empty() ? 0 : check_resume(dir, *current);
        std::fprintf(stderr, "pptrain: restart %d/%d after: %s; resuming from step %d%s\n", restart,
                     options.max_restarts, failed.message.c_str(), step,
                     dir.empty() ? " (no checkpoint yet)" : (" of " + dir).c_str());
        std::fflush(stderr);
        worker.resume_dir = dir;
        return true;
      });
  if (!solved.empty()) std::remove(solved.c_str());
  return result_of(result, options.max_restarts);
}

}  // namespace

RunResult run_training(const TrainOptions& given, const NodeGroupOptions& nodes) {
  const bool worker = running_as_worker({nodes.master_addr, nodes.master_port});
  // A rank that its launcher started again (torchrun --max-restarts, `pptrain run`) continues
  // from the newest whole checkpoint in --save, as a restart by `pptrain train` itself does.
  TrainOptions options = given;
  if (worker && launcher_restarts() > 0 && !options.save_dir.empty() &&
      options.resume_dir.empty()) {
    options.resume_dir = "auto";
  }
  const int world = options.pp * options.dp;
  const NodeGroup group = resolve_node_group(nodes);
  PPTRAIN_CHECK(!worker || !group.multi_node(),
                "--nnodes is for the process that starts the ranks of its node; this one is a "
                "rank itself (RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK is set)");
  const int nproc = workers_of_node(options, group, nodes.nproc_per_node);
  // A launcher computes on one thread: its workers are forks of it, and a fork of a process in
  // which OpenMP ran a team of several threads hangs in its own first parallel region (the team's
  // threads are not in the child). Each worker then sets its own (--threads).
  if (!worker && world > 1) set_compute_threads(1);
  // Every user error surfaces here, before any worker starts. A rank started by torchrun cannot
  // time the layers the way the others would, so it does not profile (plan.h).
  const TrainingPlan plan = plan_training(options, /*may_profile=*/!worker || world == 1);
  if (plan.finished) {
    if (!worker) {
      std::fprintf(stderr,
                   "pptrain: --resume auto: %s already holds step %d of %d: the run is complete\n",
                   options.save_dir.c_str(), plan.steps, plan.steps);
    }
    return {};
  }
  if (options.resume_dir == "auto" && !worker) tell_resume_auto(options, plan);
  if (!worker && (world > 1 || group.multi_node())) {
    return supervise_workers(options, plan, group, nproc);
  }
  train_here(options, plan, /*tell_resume=*/worker);
  return {};
}

RunResult run_program(const ProgramRun& run) {
  PPTRAIN_CHECK(!run.program.empty(),
                "pptrain run needs a program: pptrain run --nproc N PROGRAM [ARGS...]");
  PPTRAIN_CHECK(run.ranks >= 1 && run.ranks <= 1024,
                "--nproc (--nproc-per-node) must be in 1..1024, got ", run.ranks);
  const NodeGroup group = resolve_node_group(run.nodes);
  PPTRAIN_CHECK(run.stopped_timeout_s >= 1, "--stopped-timeout must be >= 1 s, got ",
                run.stopped_timeout_s);
  PPTRAIN_CHECK(run.max_restarts >= 0, "--max-restarts must be >= 0, got ", run.max_restarts);
  LaunchOptions launch;
  launch.workers = run.ranks;
  launch.executable = resolve_program(run.program);
  launch.args = run.args;
  launch.stopped_timeout = std::chrono::seconds(run.stopped_timeout_s);
  launch.hold_error_lines = false;  // a program's stderr is its own
  launch.max_restarts = run.max_restarts;
  launch.node = place_node(group, run.ranks, 0, std::nullopt);
  stop_for_joining_nodes(group, launch);
  const LaunchResult result =
      launch_with_restarts(launch, run.max_restarts, [&](int restart, const LaunchResult& failed) {
        say("restart " + std::to_string(restart) + "/" + std::to_string(run.max_restarts) +
            " after: " + failed.message);
        if (!group.dynamic) return true;
        launch.node = place_node(group, run.ranks, restart, launch.node);
        if (!launch.node->lost.empty()) {
          say(gone_text(*launch.node) + "going on with " + std::to_string(launch.node->nnodes) +
              " nodes");
        }
        return true;
      });
  return result_of(result, run.max_restarts);
}

}  // namespace pptrain
