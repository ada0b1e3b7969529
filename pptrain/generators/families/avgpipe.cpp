// AvgPipe: --dp D pipelines, each 1F1B with a flush (the synchronous rule), that combine no
// gradients; every --avg-interval steps elastic averaging pulls their weights together
// (train/stage_copies.h). Asynchronous across the copies only.
#include "pptrain/generators/families/families.h"
#include "pptrain/generators/generators.h"

namespace pptrain {

std::vector<ScheduleEntry> avgpipe_family() {
  ScheduleEntry entry;
  entry.name = "avgpipe";
  entry.summary =
      "AvgPipe (async across copies): --dp D pipelines, each 1F1B with a flush, that combine "
      "no gradients; every --avg-interval steps elastic averaging pulls their weights together";
  entry.make = [](const ScheduleOptions& o) {
    Schedule schedule = make_1f1b(o.ranks, o.microbatches);
    schedule.name = "avgpipe";
    return schedule;
  };
  entry.averages_copies = true;
  // Training reads them (train/plan_training.cpp: the averaging's interval and rate).
  entry.options = {
      {"--avg-interval",
       "avgpipe: steps between two elastic averagings of the --dp copies (default 4)",
       FamilyOption::Kind::kInt, 1},
      {"--avg-alpha",
       "avgpipe: how far each copy and the centre move towards each other, in (0, 2/D) "
       "(default 0.9/D)",
       FamilyOption::Kind::kNumber},
  };
  return {entry};
}

}  // namespace pptrain
