"""pptrain's schedule CSVs on a runtime that reads them: pipelining_worker.py's training program
with its schedule made as `_PipelineScheduleRuntime(stages, ...)` and `_load_csv(path, format)`,
of torch.distributed.pipelining (--api torch) or of pptrain.pipelining (--api pptrain), the same
program otherwise. Started on 2 ranks by torchrun.

    csv_exchange_worker.py OUT CASE[,CASE...] --csv-dir DIR --api pptrain|torch

Each case of CASES reads DIR/<case>.csv (written by `pptrain schedule ... --export`, the test's
part), trains a fresh model for pipelining_worker.STEPS steps and writes OUT.<case>.<rank>.json
as pipelining_worker.py does: the losses, the outputs and this rank's parameters. On torch's
runtime a case runs over a process group of its own whose operations time out, and a case that
fails on a rank is written there as {"error": "<its one-line error>"}, the next one following;
on pptrain's a failure stops the launch.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pipelining_worker as worker  # noqa: E402

RANKS = 2
# case -> (the `pptrain schedule` arguments that write its CSV, the format _load_csv is given,
# how pipelining_worker cuts the model, which stages a rank holds, the schedule's keywords on
# torch's runtime, and on pptrain's).
CASES = {
    # compute only: torch's runtime lowers it itself, adding its sends and receives, and after a
    # stage's last backward the REDUCE_GRAD at which it divides the gradients by M.
    "zb-auto": (["--schedule", "zb-auto"], "compute_only", "split2", "one", {}, {}),
    # With pptrain's sends and receives, run as written: without a REDUCE_GRAD (pptrain writes
    # one only with --dp above 1) torch's runtime never divides the gradients by M, so it trains
    # on their sum over the microbatches, as pptrain does with scale_grads=False.
    "zb-auto-comms": (["--schedule", "zb-auto", "--with-comms"], "compute_comms", "split2",
                      "one", {}, {"scale_grads": False}),
    # --dp 2 writes each stage's REDUCE_GRAD (the rows are those of one copy): the mean again.
    "zb-auto-comms-reduce": (["--schedule", "zb-auto", "--dp", "2", "--with-comms"],
                             "compute_comms", "split2", "one", {}, {}),
    # Two stages per rank, stage s on rank s mod 2.
    "interleaved-1f1b": (["--schedule", "interleaved-1f1b"], "compute_only", "split4", "loop", {},
                         {}),
    "interleaved-1f1b-comms": (["--schedule", "interleaved-1f1b", "--dp", "2", "--with-comms"],
                               "compute_comms", "split4", "loop", {}, {}),
    # The V: rank r holds stages r and 3-r (torch's own V schedules fail on Gloo, see the test).
    "zb-v": (["--schedule", "zb-v"], "compute_only", "split4", "v", {}, {}),
}
for _case, (_, _, _cut, _placement, _, _pptrain_keywords) in CASES.items():
    # pipelining_worker's train() and the test's comparison with plain torch read a case there;
    # what they read is pptrain's side of it.
    worker.CASES[_case] = (_cut, _placement, "_PipelineScheduleRuntime", _pptrain_keywords,
                           "step")


def schedule_arguments(case):
    """The `pptrain schedule` arguments that write `case`'s CSV (without --export)."""
    return [*CASES[case][0], "--pp", str(RANKS), "--microbatches", str(worker.MICROBATCHES)]


def make_schedule(api, case, csv_dir, rank, world, group=None):
    _, file_format, cut, placement, torch_keywords, pptrain_keywords = CASES[case]
    x0, _ = next(worker.batches(cut))
    stages = worker.traced_stages(cut, placement, rank, world, x0, group)
    keywords = torch_keywords if api == "torch" else pptrain_keywords
    schedule = worker.schedules._PipelineScheduleRuntime(
        stages, n_microbatches=worker.MICROBATCHES, loss_fn=worker.loss_fn, **keywords)
    schedule._load_csv(os.path.join(csv_dir, f"{case}.csv"), format=file_format)
    return stages, schedule


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("cases")
    parser.add_argument("--csv-dir", required=True)
    parser.add_argument("--api", choices=sorted(worker.API), required=True)
    args = parser.parse_args()
    worker.use(args.api)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for case in args.cases.split(","):
        if args.api == "torch":
            # torch's runtime may fail a case: the next one still runs, in step on every rank.
            result = worker.run_keeping_going(
                case, lambda group: make_schedule("torch", case, args.csv_dir, rank, world, group))
        else:
            result = worker.train(case, *make_schedule("pptrain", case, args.csv_dir, rank,
                                                       world))
        worker.write_result(args.out, case, rank, result)
    if args.api == "pptrain":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
