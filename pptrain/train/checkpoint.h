// A checkpoint: the folder `--save DIR` writes and `--load DIR` reads.
//
//   DIR/layer_<i>.pt    the parameters of model layer i (any split can load any other's)
//   DIR/manifest.json   written last: format and version, the model's settings, the stage layout
//                       and schedule that wrote it, the steps run, and each layer file's size and
//                       checksum (FNV-1a 64)
//
// A save never changes the previous checkpoint until the new one is whole: every rank writes its
// layers into DIR.partial, rank 0 adds the manifest and then swaps DIR.partial and DIR in one
// rename (renameat2 RENAME_EXCHANGE; a plain rename when DIR does not exist yet) and removes
// the old one. A kill at any moment leaves either the old checkpoint or the new one at DIR, and
// no layer file of an earlier, larger model survives a save.
//
//   check_checkpoint(plan.load_dir, plan.model);          // before any worker starts
//   save_checkpoint(plan, local_stages, transport);      // every rank, after the last step
#pragma once

#include <string>
#include <vector>

#include "pptrain/models/model.h"
#include "pptrain/runtime/stage.h"
#include "pptrain/runtime/transport.h"
#include "pptrain/train/plan.h"

namespace pptrain {

// UserError (one line, naming the field or file) unless `dir` is a whole checkpoint of a model
// with `model`'s shapes: a manifest of a known version, the same kind, layers, d_model, heads
// and seq_len (gpt) as the flags, and every layer file present with the manifest's size and
// checksum.
void check_checkpoint(const std::string& dir, const ModelOptions& model);

// UserError unless `dir` can become a checkpoint folder: not an existing file, and its parent
// folder exists or can be created.
void check_save_path(const std::string& dir);

// Every rank of the run calls it with its stages; returns once DIR holds the new checkpoint.
void save_checkpoint(const TrainingPlan& plan, const std::vector<Stage*>& stages,
                     Transport& transport);

}  // namespace pptrain
