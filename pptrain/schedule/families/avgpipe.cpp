// AvgPipe: --dp D pipelines, each 1F1B with a flush (the synchronous rule), that combine no
// gradients; every --avg-interval steps elastic averaging pulls their weights together
// (train/stage_copies.h). Asynchronous across the copies only.
#include "pptrain/schedule/families/families.h"
#include "pptrain/schedule/generators.h"

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
  return {entry};
}

}  // namespace pptrain
