"""torch's pipelining tutorial ("Introduction to Distributed Pipeline Parallelism") as its
program goes, with pptrain.pipelining as its import (docs/PYTHON.md, "torch's own examples"):
a transformer whose layers sit in a ModuleDict, split by hand (each rank deletes the layers of
the other stages), one PipelineStage per rank, ScheduleGPipe, a token-wise cross-entropy loss;
here a small model and a few steps of an optimizer, so that it trains on the CPU in seconds.

    torchrun --nproc-per-node 2 04_torch_tutorial_gpipe.py                 # pptrain.pipelining
    torchrun --nproc-per-node 4 04_torch_tutorial_gpipe.py --api torch     # torch's own

--api chooses the import line, the one thing that differs; --out OUT writes OUT.<rank>.json
(the losses of each step on the last stage's rank, and this rank's parameters by name), which
python/tests/test_torch_examples.py compares between the two.
"""
import argparse
import json
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--api", choices=("pptrain", "torch"), default="pptrain")
parser.add_argument("--out", help="writes OUT.<rank>.json: losses and parameters")
args = parser.parse_args()
if args.api == "pptrain":
    from pptrain.pipelining import PipelineStage, ScheduleGPipe
else:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

NUM_MICROBATCHES = 4
STEPS = 3  # each a step of torch.optim.SGD at LR
LR = 0.1


@dataclass
class ModelArgs:
    dim: int = 32
    n_layers: int = 4  # a multiple of the ranks: each stage runs n_layers / ranks of them
    n_heads: int = 4
    vocab_size: int = 64


class Transformer(nn.Module):
    def __init__(self, model_args: ModelArgs):
        super().__init__()
        self.tok_embeddings = nn.Embedding(model_args.vocab_size, model_args.dim)
        # A ModuleDict keeps each layer's name ("layers.3") when the others are deleted, so
        # that a stage's state_dict is the part of the whole model's it holds.
        self.layers = torch.nn.ModuleDict()
        for layer_id in range(model_args.n_layers):
            # No dropout: the two runs are compared number for number.
            self.layers[str(layer_id)] = nn.TransformerDecoderLayer(
                model_args.dim, model_args.n_heads, dim_feedforward=4 * model_args.dim,
                dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(model_args.dim)
        self.output = nn.Linear(model_args.dim, model_args.vocab_size)

    def forward(self, tokens: torch.Tensor):
        # A part set to None is another stage's: this stage passes its input through.
        h = self.tok_embeddings(tokens) if self.tok_embeddings else tokens
        for layer in self.layers.values():
            h = layer(h, h)
        h = self.norm(h) if self.norm else h
        return self.output(h).clone() if self.output else h


def init_distributed():
    global rank, device, pp_group, stage_index, num_stages
    rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    device = torch.device("cpu")
    dist.init_process_group("gloo")
    pp_group = dist.new_group()  # in an N-D parallel run, the ranks of one pipeline
    stage_index = rank
    num_stages = world_size


def manual_model_split(model) -> PipelineStage:
    """Stage `stage_index`'s part of the whole model: its share of the layers, the embedding on
    the first stage, the norm and the output on the last."""
    per_stage = len(model.layers) // num_stages
    mine = range(stage_index * per_stage, (stage_index + 1) * per_stage)
    for i in list(model.layers):
        if int(i) not in mine:
            del model.layers[i]
    if stage_index != 0:
        model.tok_embeddings = None
    if stage_index != num_stages - 1:
        model.norm = None
        model.output = None
    return PipelineStage(model, stage_index, num_stages, device, group=pp_group)


def dummy_data(model_args):
    """A batch of token sequences x [batch, seq] and the tokens to predict y [batch, seq]."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, model_args.vocab_size, (8, 16), generator=g)
    y = torch.randint(0, model_args.vocab_size, (8, 16), generator=g)
    return x, y


def tokenwise_loss_fn(outputs, targets):
    loss_fn = nn.CrossEntropyLoss()
    outputs = outputs.reshape(-1, outputs.size(-1))  # [microbatch * seq, vocab]
    targets = targets.reshape(-1)
    return loss_fn(outputs, targets)


if __name__ == "__main__":
    torch.set_num_threads(1)
    init_distributed()
    model_args = ModelArgs()
    torch.manual_seed(0)  # every rank makes the same whole model before deleting parts of it
    model = Transformer(model_args)
    x, y = dummy_data(model_args)
    stage = manual_model_split(model)
    model.to(device)

    schedule = ScheduleGPipe(stage, n_microbatches=NUM_MICROBATCHES, loss_fn=tokenwise_loss_fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    step_losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        if stage.is_first:
            schedule.step(x)
        elif stage.is_last:
            losses = []
            output = schedule.step(target=y, losses=losses)
            step_losses.append([loss.item() for loss in losses])
            print(f"step {step} losses: {step_losses[-1]}")
        else:
            schedule.step()
        optimizer.step()

    if args.out:
        params = {name: p.detach().tolist() for name, p in model.named_parameters()}
        with open(f"{args.out}.{rank}.json", "w") as f:
            json.dump({"losses": step_losses, "params": params}, f)
    dist.destroy_process_group()
