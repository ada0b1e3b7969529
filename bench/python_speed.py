"""The helper of bench/python_speed.sh: pptrain's gpt written as a Python torch.nn module, trained
through pptrain.runtime or through torch 1.13's Pipe, and the summary of all the runs.

    pptrain run --nproc 2 python3 python_speed.py pptrain zb-v OUT.jsonl [model flags]
    python3 python_speed.py pipe THREADS OUT.jsonl [model flags]
    python3 python_speed.py overhead [model flags]
    python3 python_speed.py summary WORK_DIR WARMUP

The model flags are those of `pptrain train` (--layers 8 --d-model 256 --heads 4 --seq-len 128
--batch-size 8 --microbatches 8; --model gpt is accepted and ignored), so the script hands both
sides one string. Each training run writes one JSON line per step: step, wall_s (the step as the
program sees it) and, for pptrain, step_time_s (the figure `pptrain train --metrics` reports:
the slowest rank's time from the step's common start to its optimizer step done).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

VOCAB = 256  # pptrain's gpt: byte-level characters
# The configurations of bench/python_speed.sh, in the order the table lists them.
CONFIGS = ["cli-1f1b", "py-1f1b", "cli-zb-v", "cli-zb-v-autograd", "py-zb-v", "py-zb-v-deferred",
           "cli-gpipe", "py-gpipe", "cli-1f1b-glibc", "py-1f1b-glibc", "pipe-1thread",
           "pipe-2threads"]
LR, MOMENTUM, CLIP = 0.05, 0.9, 1.0  # `pptrain train`'s defaults: sgd with momentum, clip 1


def model_flags(argv):
    parser = argparse.ArgumentParser(prog="python_speed.py")
    parser.add_argument("--model", default="gpt", choices=["gpt"])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    return parser.parse_args(argv)


def gpt_layers(o, linear=None):
    """pptrain's gpt (pptrain/models/model.cpp) layer for layer: [embedding, block 0 .. block N-1,
    head]. Its PipeLinear is torch.nn.Linear's computation and initialisation; `linear` (default
    torch.nn.Linear) may be pptrain.Linear, the same layer whose weight products can wait for W."""
    import torch
    linear = linear or torch.nn.Linear
    import torch.nn.functional as F

    class Embedding(torch.nn.Module):
        """Token plus learned position embedding. int64 [mb, T] -> [mb, T, D]."""

        def __init__(self):
            super().__init__()
            self.token = torch.nn.Parameter(torch.randn(VOCAB, o.d_model) * 0.02)
            self.position = torch.nn.Parameter(torch.randn(o.seq_len, o.d_model) * 0.02)

        def forward(self, tokens):
            return F.embedding(tokens, self.token) + self.position[: tokens.shape[1]]

    class Attention(torch.nn.Module):
        """x + proj(causal multi-head self-attention(LN(x))). [mb, T, D] -> [mb, T, D]."""

        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(o.d_model)
            self.qkv = linear(o.d_model, 3 * o.d_model)
            self.proj = linear(o.d_model, o.d_model)

        def forward(self, x):
            batch, tokens, d_model = x.shape
            head_dim = d_model // o.heads
            # [mb, T, 3D] -> three [mb, H, T, head_dim]
            parts = self.qkv(self.norm(x)).view(batch, tokens, 3, o.heads, head_dim)
            q, k, v = parts.permute(2, 0, 3, 1, 4)
            scores = q.matmul(k.transpose(-2, -1)) / math.sqrt(head_dim)
            future = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)  # [T, T], true = masked
            scores = scores.masked_fill(future, -math.inf)
            mixed = torch.softmax(scores, -1).matmul(v)  # [mb, H, T, head_dim]
            return x + self.proj(mixed.transpose(1, 2).reshape(batch, tokens, d_model))

    class FeedForward(torch.nn.Module):
        """x + W2 gelu(W1 LN(x)), hidden 4D."""

        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(o.d_model)
            self.fc1 = linear(o.d_model, 4 * o.d_model)
            self.fc2 = linear(4 * o.d_model, o.d_model)

        def forward(self, x):
            return x + self.fc2(F.gelu(self.fc1(self.norm(x))))

    class Block(torch.nn.Module):
        """Pre-norm transformer block. [mb, T, D] -> [mb, T, D]."""

        def __init__(self):
            super().__init__()
            self.attention, self.feed_forward = Attention(), FeedForward()

        def forward(self, x):
            return self.feed_forward(self.attention(x))

    class Head(torch.nn.Module):
        """Final LayerNorm and LM head. [mb, T, D] -> logits [mb, T, vocab]."""

        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(o.d_model)
            self.lm_head = linear(o.d_model, VOCAB)

        def forward(self, x):
            return self.lm_head(self.norm(x))

    torch.manual_seed(0)  # every rank builds the same model
    return [Embedding()] + [Block() for _ in range(o.layers)] + [Head()]


def split_points(o, stages):
    """Where pptrain's uniform_split cuts the gpt into `stages`: equal shares of the blocks, the
    remainder to the middle stages first, the embedding with the first stage and the head with
    the last. The points index the layer list (the embedding is layer 0)."""
    counts = [o.layers // stages] * stages
    order = list(range(1, stages - 1)) + [0] + ([stages - 1] if stages > 1 else [])
    for i in range(o.layers % stages):
        counts[order[i]] += 1
    points, block = [], 0
    for count in counts[:-1]:
        block += count
        points.append(1 + block)
    return points


def loss_fn(logits, targets):
    import torch.nn.functional as F
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def batches(o):
    """The steps' (tokens, targets), int64 [batch, T] each, made before the clock starts."""
    import torch
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(o.steps):
        ids = torch.randint(0, VOCAB, (o.batch_size, o.seq_len + 1), generator=g)
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


def write(out, line):
    out.write(json.dumps(line) + "\n")
    out.flush()


def run_pptrain(name, path, o):
    """Rank r of `pptrain run --nproc P`: this rank's stages of the schedule, pptrain's sgd (the
    same optimizer, rate, momentum and clipping as `pptrain train`)."""
    import torch
    import pptrain
    torch.set_num_threads(1)
    # "zb-v-deferred": zb-v with pptrain.Linear layers and weight_split="deferred".
    deferred = name.endswith("-deferred")
    name = name[: -len("-deferred")] if deferred else name
    num_stages, mine = pptrain.placement(name, o.microbatches)
    model = torch.nn.Sequential(*gpt_layers(o, pptrain.Linear if deferred else None))
    parts = pptrain.split(model, split_points(o, num_stages))
    stages = [pptrain.PipelineStage(parts[s], s, num_stages) for s in mine]
    optimizer = {"kind": "sgd", "lr": LR, "momentum": MOMENTUM, "clip": CLIP}
    schedule = pptrain.schedule(name, stages, o.microbatches, loss_fn, optimizer=optimizer,
                                weight_split="deferred" if deferred else "autograd")
    data = batches(o)
    out = open(path, "w") if pptrain.world()[0] == 0 else None
    for step, (x, y) in enumerate(data):
        start = time.perf_counter()
        schedule.step(x, target=y)
        wall_s = time.perf_counter() - start
        report = schedule.report()
        if out:
            write(out, {"step": step + 1, "wall_s": wall_s, "step_time_s": report["step_time_s"],
                        "compute_s": report["compute_s"], "loss": report["loss"]})
    schedule.finish()
    if out:
        out.close()


def run_pipe(threads, path, o):
    """torch.distributed.pipeline.sync.Pipe (GPipe) over the same two stages as pptrain's --pp 2,
    both on "cpu" in this one process, with the same sgd. Pipe runs each device's partitions on
    one worker thread of that device, and every CPU partition is on the device "cpu": the two
    stages take turns on one thread; `threads` is torch's intra-op threads. If Pipe cannot run
    here, the file gets one line {"error": why} instead of the steps."""
    try:
        train_pipe(threads, path, o)
    except Exception as error:  # the benchmark says why instead of the figures
        with open(path, "w") as out:
            write(out, {"error": f"{type(error).__name__}: {error}".splitlines()[0]})


def train_pipe(threads, path, o):
    import socket

    import torch
    import torch.distributed.rpc as rpc
    from torch.distributed.pipeline.sync import Pipe
    torch.set_num_threads(threads)
    # Pipe needs the RPC framework, even for one process: a world of one on a free local port.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rpc.init_rpc("pipe", rank=0, world_size=1)
    layers = gpt_layers(o)
    bounds = [0] + split_points(o, 2) + [len(layers)]
    model = torch.nn.Sequential(*[torch.nn.Sequential(*layers[a:b])
                                  for a, b in zip(bounds, bounds[1:])])
    # checkpoint="never": Pipe's default ("except_last") would recompute every forward but the
    # last microbatch's in the backward, work pptrain does not do.
    pipe = Pipe(model, chunks=o.microbatches, checkpoint="never")
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    with open(path, "w") as out:
        for step, (x, y) in enumerate(batches(o)):
            start = time.perf_counter()
            optimizer.zero_grad()
            # The mean over the batch: what pptrain's per-microbatch means / M add up to.
            loss = loss_fn(pipe(x).local_value(), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            write(out, {"step": step + 1, "wall_s": time.perf_counter() - start,
                        "loss": float(loss)})
    rpc.shutdown()


def overhead(o):
    """What the Python interpreter can cost per microbatch: rank 1's stage of --pp 2 (the last
    half of the blocks and the head) forward and backward at the model's sizes, against the same
    forward on tiny tensors (d_model 8, seq 2), where the arithmetic is negligible and what is left
    is the calls: Python's, and the dispatcher's and autograd's, which C++ pays too (so an upper
    bound). CPU time of this process, median of 30 after 5."""
    import copy

    import torch
    torch.set_num_threads(1)

    def cpu_ms(run):
        times = []
        for _ in range(35):
            start = time.process_time()
            run()
            times.append(time.process_time() - start)
        return statistics.median(times[5:]) * 1e3

    def stage_of(flags):
        layers = gpt_layers(flags)
        return torch.nn.Sequential(*layers[split_points(flags, 2)[0]:])

    full = stage_of(o)
    x = torch.randn(1, o.seq_len, o.d_model, requires_grad=True)  # one microbatch
    y = torch.randint(0, VOCAB, (1, o.seq_len))
    compute = cpu_ms(lambda: loss_fn(full(x), y).backward())
    tiny_flags = copy.copy(o)
    tiny_flags.d_model, tiny_flags.seq_len = 8, 2
    tiny = stage_of(tiny_flags)
    x_tiny = torch.randn(1, 2, 8, requires_grad=True)
    calls = cpu_ms(lambda: tiny(x_tiny))
    print(f"calls of one forward of a --pp 2 stage: {calls:.2f} ms per microbatch, "
          f"{100 * calls / compute:.1f}% of its forward and backward ({compute:.1f} ms)")


def summary(work, warmup):
    """The table of bench/python_speed.sh from every WORK/NAME.ROUND.jsonl: per configuration
    the median over the steps after `warmup` of every round, then the ratios."""
    o = model_flags(open(os.path.join(work, "model")).read().split())
    tokens = o.batch_size * o.seq_len  # per step
    times = {}  # name -> field -> [seconds of every timed step of every round]
    errors = {}  # name -> why it could not run
    for file in sorted(f for f in os.listdir(work) if f.endswith(".jsonl")):
        name = file.split(".")[0]
        lines = [json.loads(l) for l in open(os.path.join(work, file)) if l.strip()]
        if lines and "error" in lines[0]:
            errors[name] = lines[0]["error"]
            continue
        for line in lines[warmup:]:
            # compute_s: the CPU time of the ranks' F, B, I and W (the threads' own clocks, so
            # another process taking the core does not count), summed over the ranks.
            line["compute_s"] = sum(line.get("compute_s", [])) or None
            for field in ("step_time_s", "wall_s", "compute_s"):
                if line.get(field):
                    times.setdefault(name, {}).setdefault(field, []).append(line[field])

    def rate(name, field):  # tokens/s at the median step time; None if the run has no figure
        values = times.get(name, {}).get(field)
        return tokens / statistics.median(values) if values else None

    def cell(value):
        return f"{value:>10.0f}" if value else f"{'-':>10}"

    print(f"{'config':<22} {'tokens/s':>10} {'wall tok/s':>10} {'compute s':>10} {'steps':>6}")
    for name in sorted(times, key=lambda n: CONFIGS.index(n) if n in CONFIGS else len(CONFIGS)):
        steps = len(next(iter(times[name].values())))
        compute = times[name].get("compute_s")
        compute = f"{statistics.median(compute):>10.3f}" if compute else f"{'-':>10}"
        print(f"{name:<22} {cell(rate(name, 'step_time_s'))} {cell(rate(name, 'wall_s'))}"
              f" {compute} {steps:>6}")
    print()

    def ratio(label, a, b, field="step_time_s"):
        x, y = rate(a, field), rate(b, field)
        if not (x and y):
            return
        ca, cb = times[a].get("compute_s"), times[b].get("compute_s")
        compute = (f" {statistics.median(ca) / statistics.median(cb):12.3f}" if ca and cb
                   else "")
        print(f"{label:<42} {x / y:8.3f}{compute}")

    print(f"{'Python / CLI (as pptrain reports them)':<42} {'tokens/s':>8} {'compute s':>12}")
    ratio("  1f1b: py-1f1b / cli-1f1b", "py-1f1b", "cli-1f1b")
    ratio("  zb-v: py-zb-v / cli-zb-v", "py-zb-v", "cli-zb-v")
    ratio("  zb-v: py-zb-v / cli-zb-v-autograd", "py-zb-v", "cli-zb-v-autograd")
    ratio("  zb-v: py-zb-v-deferred / cli-zb-v", "py-zb-v-deferred", "cli-zb-v")
    ratio("  gpipe: py-gpipe / cli-gpipe", "py-gpipe", "cli-gpipe")
    label = "pptrain's malloc settings / glibc's own"
    print(f"{label:<42} {'tokens/s':>8} {'compute s':>12}")
    ratio("  cli: cli-1f1b / cli-1f1b-glibc", "cli-1f1b", "cli-1f1b-glibc")
    ratio("  py: py-1f1b / py-1f1b-glibc", "py-1f1b", "py-1f1b-glibc")
    ratio("  glibc's own: py-1f1b-glibc / cli-1f1b-glibc", "py-1f1b-glibc", "cli-1f1b-glibc")
    for name, why in errors.items():
        print(f"{name}: torch Pipe cannot run on CPU here: {why}")
    print(f"{'pptrain from Python / torch Pipe (wall clock)':<42} {'tokens/s':>8}")
    for pipe in ("pipe-1thread", "pipe-2threads"):
        ratio(f"  py-gpipe / {pipe}", "py-gpipe", pipe, "wall_s")
        ratio(f"  py-1f1b / {pipe}", "py-1f1b", pipe, "wall_s")


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "pptrain":
        run_pptrain(sys.argv[2], sys.argv[3], model_flags(sys.argv[4:]))
    elif mode == "pipe":
        run_pipe(int(sys.argv[2]), sys.argv[3], model_flags(sys.argv[4:]))
    elif mode == "overhead":
        overhead(model_flags(sys.argv[2:]))
    elif mode == "summary":
        summary(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
