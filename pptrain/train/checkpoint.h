// A checkpoint: the folder `--save DIR` writes and `--load DIR` reads.
//
//   DIR/layer_<i>.pt    the parameters of model layer i (any split can load any other's)
//   DIR/optim_<i>.pt    the optimizer's state for layer i (momentum, or AdamW's moments and step
//                       count), for every layer with parameters
//   DIR/in_flight_rank<r>.pt  an asynchronous run saved before its end: pipeline rank r's
//                       weight versions, pipemare's delta, predictions, and the executor's
//                       microbatches and messages in flight (only the same run continues it)
//   DIR/manifest.json   written last: format and version, the model's settings, the stage layout
//                       and schedule that wrote it, the steps run, the optimizer and data settings
//                       a resume must share, the data position, and each file's size and
//                       checksum (FNV-1a 64)
//
// What a resume needs is all there: the data of step k is a function of (seed, k) and training
// draws no other random numbers, so the step count is the data position and the whole random
// state. `--load DIR` starts a run from the parameters only (step 0, fresh optimizer); `--resume
// DIR` continues the run that saved it: parameters, optimizer state, and from the step after the
// saved one, so 3 steps + save + resume to 6 equals 6 steps, with any --pp. An asynchronous
// schedule is one list over the run: its checkpoint (manifest field "asynchronous") resumes only
// with the same steps, schedule, pp, microbatches and stage layout.
//
// A save never changes the previous checkpoint until the new one is whole: every rank writes its
// layers into DIR.partial (each file on the disk, fsync'd, before the manifest lists it), rank 0
// adds the manifest and then swaps DIR.partial and DIR in one rename (renameat2
// RENAME_EXCHANGE; a plain rename when DIR does not exist yet) and removes the old one. A rank
// that cannot write (a full disk) says so at the save's next collective, and every rank stops
// with the previous checkpoint whole. A kill at any moment leaves either the old checkpoint or the
// new one at DIR, and no layer file of an earlier, larger model survives a save. With `--keep K` (K
// > 1) the checkpoint a save replaces is kept beside it as DIR.step-<its step>, up to K - 1 of
// them.
//
//   check_checkpoint(plan.load_dir, plan.model, "--load");   // before any worker starts
//   int done = check_resume(options.resume_dir, plan);      // --resume: the steps it holds
//   save_checkpoint(plan, {stages, optimizers}, 6, transport);   // every rank
//   CheckpointWriter writer(plan, transport);                    // or in the background
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pptrain/models/model.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/tensor_file.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/train/optimizer.h"
#include "pptrain/train/plan.h"

namespace pptrain {

// UserError (one line, starting with `flag` and naming the field or file) unless `dir` is a
// whole checkpoint of a model with `model`'s shapes: a manifest of this version, the same kind,
// layers, d_model, heads and seq_len (gpt) as the flags, every layer file present, and every
// file the manifest lists with its size and checksum.
void check_checkpoint(const std::string& dir, const ModelOptions& model, const std::string& flag);

// The precision the run that saved `dir` computed in ("fp32" for a checkpoint that says none).
std::string checkpoint_precision(const std::string& dir);

// For --resume: check_checkpoint(), and the settings a continued run must share with the one
// that saved it (--optimizer, --momentum, --data, --seed, --batch-size) are the plan's, and it
// holds fewer steps than plan.steps. UserError naming the field otherwise. Returns the steps
// the checkpoint holds (the step the run continues from, 0-based).
int check_resume(const std::string& dir, const TrainingPlan& plan);

// The checkpoint a run of `plan` continues from after a failure (--max-restarts) or with
// --resume auto: of `save_dir` and the DIR.step-<k> copies --keep left beside it, newest first,
// the first that check_resume() accepts (a save cut short leaves the one before it whole; a
// damaged file fails its checksum); "" when there is none. `skipped` gets the error of each
// one passed over.
std::string newest_resumable(const std::string& save_dir, const TrainingPlan& plan,
                             std::vector<std::string>* skipped = nullptr);

// True when `dir` is a whole checkpoint of `plan`'s run saved after its last step: a restart or
// --resume auto has nothing left to run.
bool holds_finished_run(const std::string& dir, const TrainingPlan& plan);

// UserError unless `dir` can become a checkpoint folder: not an existing file, not a folder
// holding something other than a checkpoint, and its parent folder exists or can be created.
void check_save_path(const std::string& dir);

// What one rank holds of a checkpoint: its stages and their optimizers, in the same order.
struct RankCheckpoint {
  std::vector<const Stage*> stages;  // whose layers this rank writes
  LeftOut left_out;  // their tied copies other than the first: stored once, with the first
  std::vector<const StageOptimizer*> optimizers;  // whose state this rank writes
  // An asynchronous schedule's state between two steps (weight versions, microbatches and
  // messages in flight), written as in_flight_file(dir, pipeline_rank) by a save before the
  // run's last step; unset for a synchronous schedule.
  std::function<NamedTensors()> in_flight;
  int pipeline_rank = 0;
  // fp16's loss scale (train/loss_scale.h), the same on every rank: written by world rank 0 as
  // loss_scale_file(dir); unset elsewhere and at other precisions.
  std::function<NamedTensors()> loss_scale;
};

// The file of a checkpoint's loss scale in folder `dir`.
std::string loss_scale_file(const std::string& dir);

// This rank's files of a checkpoint after `steps_done` steps of a run of `run_steps`, in memory,
// in groups (a stage's layers, an optimizer's state, the state in flight, which an asynchronous
// run saves before its last step only): of copies of the tensors with `copy`.
std::vector<std::vector<ArchiveFile>> checkpoint_files(const RankCheckpoint& mine, int steps_done,
                                                       int run_steps, bool copy);

// The file of pipeline rank r's state in flight in checkpoint folder `dir`.
std::string in_flight_file(const std::string& dir, int pipeline_rank);

// Every rank of the run calls it after `steps_done` steps; returns once plan.save_dir holds
// the new checkpoint (and at most plan.keep - 1 older ones are kept beside it). When a rank
// cannot write its part, every rank throws std::runtime_error (that rank's names the file and
// the room left on its file system), and plan.save_dir keeps the previous checkpoint.
void save_checkpoint(const TrainingPlan& plan, const RankCheckpoint& mine, int steps_done,
                     Transport& transport);

// A checkpoint of a program's own modules (PipelineSchedule::save in api/pipeline.h, which
// Python's Schedule.save calls), written as the checkpoint above is (DIR.partial, then one
// swap):
//
//   DIR/stage_<s>.pt   stage s's parameters as the program's side writes them (Python: torch.save
//                      of the module's state_dict, which torch.load reads back)
//   DIR/optim_<s>.pt   pptrain's optimizer's state, and DIR/in_flight_rank<r>.pt an asynchronous
//                      run's state between two steps, as above (stage s is "layer" s)
//   DIR/<other>        files of the program's own (its optimizer's state_dict, one per rank)
//   DIR/manifest.json  written last: format "pptrain-module-checkpoint", version, the fields
//                      below, and each file's size and checksum
struct ModuleCheckpoint {
  int step = 0;  // steps run
  std::string schedule;
  int num_stages = 1;
  int pp = 1;  // ranks per pipeline
  int data_parallel = 1;
  int zero = 0;
  std::string optimizer;           // the kind pptrain ran; "" when the program ran its own
  int steps = 0;                   // the run's length (an asynchronous schedule's), 0 if not known
  std::vector<std::string> files;  // read_module_checkpoint(): the files it holds
};

// Every rank: writes its `groups` of files as the checkpoint `what` at `dir` (keeping `keep` - 1
// older ones as DIR.step-<k>); std::runtime_error on every rank when one cannot write.
void save_module_checkpoint(const std::string& dir, int keep, const ModuleCheckpoint& what,
                            const std::vector<std::vector<ArchiveFile>>& groups,
                            Transport& transport);
// The manifest of the whole module checkpoint at `dir`; UserError starting with `flag` when it is
// not one (no manifest: an interrupted save; a file missing or damaged).
ModuleCheckpoint read_module_checkpoint(const std::string& dir, const std::string& flag);
// Its fields and files as a JSON object (the manifest's names; files a list of names).
std::string to_json_text(const ModuleCheckpoint& what);
// Of `save_dir` and the copies `keep` left beside it, the newest whole module checkpoint; "" when
// there is none.
std::string newest_module_checkpoint(const std::string& save_dir,
                                     std::vector<std::string>* skipped = nullptr);

// The saves of one run. With plan.background_save, save() copies the rank's state to memory
// (the step boundary's only cost) and a thread of its own writes, checksums and swaps it into
// place while training goes on, over a transport of its own (made by the constructor: every
// rank constructs the writer at the same point); the next save, wait() or check() takes up a
// failed write's error. Without it, save() is save_checkpoint().
//
//   CheckpointWriter writer(plan, transport);
//   double stall = writer.save(schedule.checkpoint(), step + 1);   // every rank
//   stall += writer.wait();                                        // at the run's end
class CheckpointWriter {
 public:
  CheckpointWriter(const TrainingPlan& plan, Transport& transport);
  ~CheckpointWriter();  // waits for a save in flight (its error is lost: call wait() first)
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Saves `mine` as the checkpoint after `steps_done` steps, after the previous save is done.
  // Throws the previous background save's error. Returns the seconds it kept the caller.
  double save(const RankCheckpoint& mine, int steps_done);
  // Waits for the save in flight; throws its error. Returns the seconds it waited.
  double wait();
  // Throws the error of a background save that has ended; never waits.
  void check();

 private:
  void join();

  const TrainingPlan& plan_;
  Transport& transport_;
  std::unique_ptr<Transport> own_transport_;  // the background saves'
  std::thread thread_;
  std::atomic<bool> writing_{false};
  std::string failure_;  // the thread's error; read after it is joined
};

}  // namespace pptrain
