// plan.json: what `pptrain plan` chose, read back by `pptrain train --plan FILE`.
//
//   write_text_file("out/plan.json", plan_json(profile, options, search, files), "plan file");
//   PlanFile plan = read_plan_file("out/plan.json");
//   plan.schedule_file;   // "out/schedule.csv": paths are resolved against the plan's folder
//
// The file ("format": "pptrain-plan-1") holds the settings of the search (the precision its
// activation bytes were counted at among them), the winner (schedule,
// chunks, microbatches, batch, recompute, stage layers, predicted step time, bubble and peak
// bytes per rank, with unequal workers its placement when not the identity, and with --dp copies
// on unequal workers their shares of the batch when not equal), the files written
// beside it (partition JSON, schedule CSV, SVG) and the ranked candidates. Only the winner and the
// files and the precision are read back.
#pragma once

#include <string>
#include <vector>

#include "pptrain/partition/partition.h"
#include "pptrain/partition/profile.h"
#include "pptrain/planner/planner.h"

namespace pptrain {

// The names of the files written beside plan.json, relative to its folder.
struct PlanFiles {
  std::string partition = "partition.json";  // `pptrain train --partition FILE` reads it
  std::string schedule = "schedule.csv";     // `pptrain train --schedule-file FILE` reads it
  std::string svg = "timeline.svg";          // the winner's simulated step
};

// The winner, as `pptrain train --plan` needs it.
struct PlanFile {
  std::string path;  // where it was read from, for messages
  std::string schedule;
  int workers = 0;       // P
  int dp = 1;            // D: copies of the pipeline ("dp", absent: 1)
  int chunks = 1;        // V
  int microbatches = 0;  // M
  int batch_size = 0;    // samples per step, over the copies
  // What the plan's memory was counted at ("precision"); absent from older plans: fp32.
  Precision precision = Precision::kFp32;
  bool recompute = false;
  std::vector<LayerRange> stage_layers;  // [P x V]
  // [pipeline rank] = the worker that runs it (Candidate::placement); empty, or absent from the
  // file (older plans): rank r on worker r.
  std::vector<int> placement;
  // [copy] = its samples per step (Candidate::dp_shares); empty, or absent from the file: equal.
  std::vector<int> dp_shares;
  std::string partition_file;  // resolved against the plan's folder
  std::string schedule_file;
  std::string svg_file;
};

// The JSON text of a finished search (its ranked list is not empty).
std::string plan_json(const Profile& profile, const PlannerOptions& options,
                      const PlanSearch& search, const PlanFiles& files = {});

// What `pptrain plan --out FOLDER` writes: the winner's partition, schedule CSV and simulated
// timeline, then plan.json, whose text it returns. Makes the folder; UserError naming it if it
// cannot, or a file that cannot be written.
std::string write_plan_folder(const std::string& folder, const Profile& profile,
                              const PlannerOptions& options, const PlanSearch& search,
                              const PlanFiles& files = {});

// Reads plan.json. UserError naming the file and the field for anything malformed.
PlanFile read_plan_file(const std::string& path);
// The same from the file's text; `path` names it and locates the files beside it.
PlanFile parse_plan_json(const std::string& text, const std::string& path);

// The winner's cut as `pptrain partition --json` writes it (method "plan: <partition>").
Partition winner_partition(const Profile& profile, const Candidate& winner);

}  // namespace pptrain
