"""One rank of a Python run using what `pptrain train` offers its own models: data parallelism
(with ZeRO-1), tied parameters, skip connections and a later stage reading the batch. Started
by `pptrain run`; test_parity.py compares what it writes with plain torch in one process.

    parity_worker.py CASE[,CASE...] OUT

For each case the same processes train a fresh model for 3 steps and write
OUT.<case>.<rank>.json: the loss this rank saw at each step (None but on a last stage's rank)
and its stages' state_dicts (named as in the whole model).
"""
import argparse
import json
import os

import torch

import pptrain

STEPS = 3
WIDTH = 8


def mlp():
    """Eight blocks of Linear and Tanh."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
                                 for _ in range(8)])


def tied_mlp():
    """mlp() whose last block's weight is its first block's (one shared tensor): plain torch's
    form of the model the pipeline ties across stages."""
    model = mlp()
    model[7][0].weight = model[0][0].weight
    return model


class Head(torch.nn.Module):
    """Stage 0 of SkipNet: the hidden state, also sent past stages 1 and 2's input."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x, scale):
        h = torch.tanh(self.linear(x))
        return {"h": h, "skip": h}


class Middle(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, h):
        return {"h": torch.tanh(self.linear(h))}


class Join(torch.nn.Module):
    """Stage 2: takes stage 1's h, stage 0's skip and the batch's scale."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, h, skip, scale):
        return {"h": torch.tanh(self.linear(h)) * scale + skip}


class Tail(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, h):
        return self.linear(h)


class SkipNet(torch.nn.Module):
    """Four stages; stage 0's output reaches stage 2 past stage 1, and stage 2 reads the batch's
    `scale`, which stage 0 ignores."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stages = torch.nn.ModuleList([Head(), Middle(), Join(), Tail()])

    def forward(self, x, scale):
        first = self.stages[0](x, scale)
        h = self.stages[1](first["h"])["h"]
        h = self.stages[2](h, first["skip"], scale)["h"]
        return self.stages[3](h)


def batches(skip_net=False, steps=STEPS):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, WIDTH, generator=g), torch.randn(8, WIDTH, generator=g)
        if skip_net:
            x = {"x": x, "scale": torch.rand(8, 1, generator=g) + 0.5}
        yield x, y


# Each case: its schedule, data-parallel copies, microbatches per copy, and pptrain's optimizer.
CASES = {
    "dp": dict(schedule="1f1b", data_parallel=2, microbatches=4),
    "dp-zero": dict(schedule="1f1b", data_parallel=2, microbatches=4,
                    optimizer={"kind": "sgd", "lr": 0.1, "momentum": 0.9}, zero=1),
    # Unequal shares: copy 0 trains on 6 rows of 8 in microbatches of 3, copy 1 on 2 in 1s.
    "dp-shares": dict(schedule="1f1b", data_parallel=2, microbatches=2,
                      data_parallel_shares=[6, 2]),
    "tie": dict(schedule="1f1b", microbatches=8),
    "skip": dict(schedule="1f1b", microbatches=8),
}


def share(batch, copy, copies, shares=()):
    """Copy `copy`'s share of a batch (a tensor or a dict of them) along dimension 0: its rows
    of `shares`, or 1/copies."""
    if isinstance(batch, dict):
        return {k: share(v, copy, copies, shares) for k, v in batch.items()}
    return batch.split(list(shares))[copy] if shares else batch.chunk(copies)[copy]


def train(case, rank, size):
    spec = CASES[case]
    copies = spec.get("data_parallel", 1)
    num_stages, local = pptrain.placement(spec["schedule"], spec["microbatches"],
                                          data_parallel=copies)
    options = {}
    if case == "skip":
        parts = list(SkipNet().stages)
        options["skips"] = [("skip", 0, 2)]
    else:
        points = [s * 8 // num_stages for s in range(1, num_stages)]
        parts = pptrain.split(mlp(), points)
    stages = [pptrain.PipelineStage(parts[s], s, num_stages,
                                    batch_inputs=["scale"] if case == "skip" and s == 2 else ())
              for s in local]
    if case == "tie":
        options["tied"] = {"w": [0, num_stages - 1]}
        for stage in stages:
            if stage.index == 0:
                stage.tie("w", stage.module[0][0].weight)
            if stage.index == num_stages - 1:
                stage.tie("w", stage.module[-1][0].weight)
    if "zero" in spec:
        options["zero"] = spec["zero"]
    shares = spec.get("data_parallel_shares", ())
    if shares:
        options["data_parallel_shares"] = shares
    optimizer = spec.get("optimizer")
    schedule = pptrain.schedule(spec["schedule"], stages, n_microbatches=spec["microbatches"],
                                loss_fn=torch.nn.functional.mse_loss, data_parallel=copies,
                                optimizer=optimizer, **options)
    own = None if optimizer else torch.optim.SGD(
        [p for s in stages for p in s.module.parameters()], lr=0.1)
    copy = rank // (size // copies)
    losses = []
    for x, y in batches(skip_net=case == "skip"):
        if own:
            own.zero_grad()
        loss = schedule.step(share(x, copy, copies, shares),
                             target=share(y, copy, copies, shares))
        if own:
            own.step()
        losses.append(None if loss is None else float(loss))
    schedule.finish()
    state = {f"{s.index}/{name}": value.tolist()
             for s in stages for name, value in s.module.state_dict().items()}
    return {"losses": losses, "state": state, "copy": copy}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", help="cases separated by commas: " + ", ".join(CASES))
    parser.add_argument("out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank, size = pptrain.world()
    for case in args.cases.split(","):
        result = train(case, rank, size)
        path = f"{args.out}.{case}.{rank}.json"
        with open(path + ".part", "w") as f:
            json.dump(result, f)
        os.replace(path + ".part", path)


if __name__ == "__main__":
    main()
