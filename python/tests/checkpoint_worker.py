"""One rank of a Python run that saves checkpoints and continues them (started by `pptrain run`;
test_checkpoint.py checks what it writes).

    checkpoint_worker.py OUT SAVE_DIR [--schedule S] [--steps N] [--run-until K]
                         [--resume] [--load DIR] [--pptrain-optimizer]
                         [--crash-rank R --crash-after K]

Trains parity_worker.mlp() for N steps (SGD with momentum: the program's own, or pptrain's),
saving a checkpoint at SAVE_DIR after every step. --resume continues the newest checkpoint
there first; --load DIR starts from the parameters of DIR; --run-until K stops after step K;
--crash-rank R ends rank R with exit code 3 after step K, on the first attempt of `pptrain run
--max-restarts` only. Writes OUT.<rank>.json: the step it started at, the loss it saw at each
step it ran (None but on the last stage's rank), and its stages' state_dicts.
"""
import argparse
import json
import os
import sys

import torch

import pptrain

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity_worker import batches, mlp  # noqa: E402

MICROBATCHES = 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("save_dir")
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--run-until", type=int, default=-1)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--load")
    parser.add_argument("--pptrain-optimizer", action="store_true")
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-after", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank, _ = pptrain.world()
    num_stages, local = pptrain.placement(args.schedule, MICROBATCHES)
    parts = pptrain.split(mlp(), [s * 8 // num_stages for s in range(1, num_stages)])
    stages = [pptrain.PipelineStage(parts[s], s, num_stages) for s in local]
    sgd = {"kind": "sgd", "lr": 0.1, "momentum": 0.9}
    schedule = pptrain.schedule(args.schedule, stages, n_microbatches=MICROBATCHES,
                                loss_fn=torch.nn.functional.mse_loss,
                                optimizer=sgd if args.pptrain_optimizer else None,
                                steps=args.steps)
    own = None if args.pptrain_optimizer else torch.optim.SGD(
        [p for s in stages for p in s.module.parameters()], lr=0.1, momentum=0.9)
    start = 0
    if args.resume:
        start = schedule.resume(args.save_dir, optimizer=own)
    if args.load:
        schedule.load(args.load)
    data = list(batches(steps=args.steps))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    losses = {}
    for step in range(start, args.steps if args.run_until < 0 else args.run_until):
        if own:
            own.zero_grad()
            loss = schedule.step(data[step][0], target=data[step][1])
            own.step()
        else:
            loss = schedule.step(lambda k: data[k])
        losses[step] = None if loss is None else float(loss)
        schedule.save(args.save_dir, step + 1, optimizer=own, keep=2)
        if rank == args.crash_rank and step + 1 == args.crash_after and first_attempt:
            sys.stderr.write(f"rank {rank} stops on purpose after step {step + 1}\n")
            sys.stderr.flush()
            os._exit(3)
    schedule.finish()
    state = {f"{s.index}/{name}": value.tolist()
             for s in stages for name, value in s.module.state_dict().items()}
    with open(f"{args.out}.{rank}.json.part", "w") as f:
        json.dump({"start": start, "losses": losses, "state": state}, f)
    os.replace(f"{args.out}.{rank}.json.part", f"{args.out}.{rank}.json")


if __name__ == "__main__":
    main()
