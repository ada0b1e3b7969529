"""Your own transformer on pptrain's zero-bubble V schedule: 8 stages on 4 ranks (docs/PYTHON.md).
    pptrain run --nproc 4 python3 02_transformer_zero_bubble.py
    python3 02_transformer_zero_bubble.py --reference     # the same training in plain torch
Its stages pass a dict across the cuts: the hidden states (float32), the positions (int64) and a
padding mask (bool); only the hidden states get gradients back."""
import sys

import torch
import torch.nn.functional as F

VOCAB, D, HEADS, T, BATCH, MICROBATCHES, STEPS = 64, 32, 4, 16, 16, 8, 4


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens, self.positions = torch.nn.Embedding(VOCAB, D), torch.nn.Embedding(T, D)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1]).expand_as(ids)
        hidden = self.tokens(ids) + self.positions(positions)
        return {"hidden": hidden, "positions": positions, "pad": ids == 0}


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(D, HEADS, 2 * D, dropout=0.0,
                                                      batch_first=True)

    def forward(self, hidden, positions, pad):
        return {"hidden": self.layer(hidden, src_key_padding_mask=pad), "positions": positions,
                "pad": pad}


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.out = torch.nn.Linear(D, VOCAB)

    def forward(self, hidden, positions, pad):
        return self.out(hidden)


class Chain(torch.nn.Module):
    """Layers in order, a dict output passed on as keyword arguments."""

    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, *args, **kwargs):
        out = self.layers[0](*args, **kwargs)
        for layer in self.layers[1:]:
            out = layer(**out) if isinstance(out, dict) else layer(out)
        return out


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def layers():
    torch.manual_seed(0)  # every rank builds the same model
    return [Embed()] + [Block() for _ in range(6)] + [Head()]


def batches():
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        ids = torch.randint(1, VOCAB, (BATCH, T + 1), generator=g)
        ids[:, -3:] = 0  # padding at the end of every sequence
        yield ids[:, :-1], ids[:, 1:]


def reference():
    """The same training in one process: each microbatch through all layers, loss / M."""
    model = Chain(layers())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(batches()):
        optimizer.zero_grad()
        total = 0.0
        for xm, ym in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES)):
            loss = loss_fn(model(xm), ym) / MICROBATCHES
            loss.backward()
            total += float(loss)
        optimizer.step()
        print(f"step {step} loss {total:.8f}")


def pipelined():
    import pptrain
    num_stages, mine = pptrain.placement("zb-v", MICROBATCHES)  # 8 stages on 4 ranks
    model = layers()
    n = len(model) // num_stages  # layers per stage
    stages = [pptrain.PipelineStage(Chain(model[s * n:(s + 1) * n]), s, num_stages) for s in mine]
    schedule = pptrain.schedule("zb-v", stages, MICROBATCHES, loss_fn)
    optimizer = torch.optim.SGD([p for s in stages for p in s.module.parameters()], lr=0.1)
    for step, (x, y) in enumerate(batches()):
        optimizer.zero_grad()
        loss = schedule.step(x, target=y)
        optimizer.step()
        if loss is not None:
            print(f"step {step} loss {float(loss):.8f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    reference() if "--reference" in sys.argv else pipelined()
