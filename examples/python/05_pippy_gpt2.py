"""PiPPy's GPT-2 example (examples/huggingface/pippy_gpt2.py, now torch.distributed.pipelining)
with pptrain.pipelining as its import (docs/PYTHON.md, "torch's own examples"): Hugging Face
transformers' GPT2ForSequenceClassification, built from a GPT2Config with random weights
(nothing is downloaded), cut by pipeline() before every rank's first decoder block
(split_spec {"transformer.h.N": SplitPoint.BEGINNING}), one stage per rank, ScheduleGPipe; here
a small GPT-2 trained for a few steps of an optimizer, where PiPPy's runs one forward.

    torchrun --nproc-per-node 4 05_pippy_gpt2.py                 # pptrain.pipelining
    torchrun --nproc-per-node 2 05_pippy_gpt2.py --api torch     # torch's own

--api chooses the import line, the one thing that differs; --out OUT writes OUT.<rank>.json
(the losses of each step on the last stage's rank, and this rank's parameters by name), which
python/tests/test_torch_examples.py compares with plain torch: torch 2.11's pipelining stops at
the first step, its stages' received mask and input ids (bool, int64) being unable to require
gradients (docs/PYTHON.md). Needs `pip install transformers`.
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import GPT2Config, GPT2ForSequenceClassification

parser = argparse.ArgumentParser()
parser.add_argument("--api", choices=("pptrain", "torch"), default="pptrain")
parser.add_argument("--out", help="writes OUT.<rank>.json: losses and parameters")
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--chunks", type=int, default=4)
parser.add_argument("--seq_length", type=int, default=16)
parser.add_argument("--n_embd", type=int, default=64)
parser.add_argument("--n_layer", type=int, default=4)
parser.add_argument("--n_head", type=int, default=4)
parser.add_argument("--vocab_size", type=int, default=128)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()
if args.api == "pptrain":
    from pptrain.pipelining import ScheduleGPipe, SplitPoint, pipeline
else:
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline


def get_number_of_params(model):
    return sum(p.numel() for p in model.parameters())


def generate_inputs(batch_size, config, generator):
    """A batch of token ids [batch, seq] (none of them the padding token, 0), and a label of
    each sequence [batch]."""
    input_ids = torch.randint(1, config.vocab_size, (batch_size, args.seq_length),
                              generator=generator)
    labels = torch.randint(0, config.num_labels, (batch_size,), generator=generator)
    return {"input_ids": input_ids}, labels


def make_config(args):
    """A small GPT-2. pad_token_id: the classifier reads each sequence's last token that is not
    padding. No cache (a training run; torch.export traces no DynamicCache) and no dropout (the
    two runs are compared number for number)."""
    return GPT2Config(n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
                      vocab_size=args.vocab_size, n_positions=args.seq_length, num_labels=2,
                      pad_token_id=0, bos_token_id=1, eos_token_id=1, use_cache=False,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


# The last stage returns the tensors of the model's output (a ModelOutput), as pipeline()
# flattens it: here the logits alone, [microbatch, num_labels].
def loss_fn(logits, labels):
    return F.cross_entropy(logits, labels)


def run(args):
    config = make_config(args)
    print(f"[Rank {args.rank}] Using device: {args.device}")

    torch.manual_seed(0)  # every rank makes the same random weights
    gpt2 = GPT2ForSequenceClassification(config)
    gpt2.to(args.device)
    gpt2.train()
    if args.rank == 0:
        print(f"GPT-2 total number of params = {get_number_of_params(gpt2)}")

    # Example microbatch inputs
    mb_inputs, _ = generate_inputs(args.batch_size // args.chunks, config,
                                   torch.Generator().manual_seed(0))

    # Pipeline split spec: a stage per rank, each starting at a decoder block
    decoders_per_rank = (gpt2.config.n_layer + args.world_size - 1) // args.world_size
    print(f"decoders_per_rank = {decoders_per_rank}")
    split_spec = {
        f"transformer.h.{i * decoders_per_rank}": SplitPoint.BEGINNING
        for i in range(1, args.world_size)
    }

    # Create pipeline representation
    pipe = pipeline(gpt2, mb_args=(), mb_kwargs=mb_inputs, split_spec=split_spec)
    assert pipe.num_stages == args.world_size, \
        f"nstages = {pipe.num_stages} nranks = {args.world_size}"
    smod = pipe.get_stage_module(args.rank)
    print(f"Pipeline stage {args.rank} {get_number_of_params(smod)} params")

    # Create schedule runtime
    stage = pipe.build_stage(args.rank, device=args.device)

    # Attach to a schedule
    schedule = ScheduleGPipe(stage, args.chunks, loss_fn=loss_fn)
    optimizer = torch.optim.SGD(smod.parameters(), lr=args.lr)

    g = torch.Generator().manual_seed(1)  # the batches of the steps
    step_losses = []
    for step in range(args.steps):
        # Full batch inputs as in single-worker case
        inputs, labels = generate_inputs(args.batch_size, config, g)
        optimizer.zero_grad()
        if args.rank == 0:
            schedule.step(**inputs)
        elif args.rank == args.world_size - 1:
            losses = []
            schedule.step(target=labels, losses=losses)
            step_losses.append([loss.item() for loss in losses])
            print(f"step {step} losses: {step_losses[-1]}")
        else:
            schedule.step()
        optimizer.step()

    if args.out:
        params = {name: p.detach().tolist() for name, p in smod.named_parameters()}
        with open(f"{args.out}.{args.rank}.json", "w") as f:
            json.dump({"losses": step_losses, "params": params}, f)
    dist.destroy_process_group()
    print(f"Rank {args.rank} completes")


if __name__ == "__main__":
    torch.set_num_threads(1)
    args.world_size = int(os.environ["WORLD_SIZE"])
    args.rank = int(os.environ["RANK"])
    args.device = torch.device("cpu")
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world_size)
    run(args)
