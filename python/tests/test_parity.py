"""What `pptrain train` offers its own models, from Python on a user's modules: data parallelism
(and ZeRO-1), tied parameters, skip connections and a stage reading the batch train as plain
torch does in one process (parity_worker.py runs the ranks)."""
import json
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import parity_worker  # noqa: E402
from processes import run  # noqa: E402

PPTRAIN = os.environ.get("PPTRAIN", "pptrain")
CASES = list(parity_worker.CASES)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """Every case trained by one launch of 4 ranks: {case: [what each rank wrote]}."""
    out = str(tmp_path_factory.mktemp("parity") / "run")
    code, _, stderr = run([PPTRAIN, "run", "--nproc", "4", sys.executable,
                           os.path.join(HERE, "parity_worker.py"), ",".join(CASES), out])
    assert code == 0, stderr
    return {case: [json.load(open(f"{out}.{case}.{r}.json")) for r in range(4)]
            for case in CASES}


def plain_torch(case):
    """The case trained by plain torch in one process: each step's loss (the mean over the
    whole batch's microbatches) and the model's state_dict."""
    torch.set_num_threads(1)
    spec = parity_worker.CASES[case]
    skip_net = case == "skip"
    model = (parity_worker.SkipNet() if skip_net
             else parity_worker.tied_mlp() if case == "tie" else parity_worker.mlp())
    momentum = spec.get("optimizer", {}).get("momentum", 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    m = spec["microbatches"] * spec.get("data_parallel", 1)
    losses = []
    for x, y in parity_worker.batches(skip_net=skip_net):
        optimizer.zero_grad()
        total = 0.0
        for k in range(m):
            out = (model(x["x"].chunk(m)[k], x["scale"].chunk(m)[k]) if skip_net
                   else model(x.chunk(m)[k]))
            loss = torch.nn.functional.mse_loss(out, y.chunk(m)[k]) / m
            loss.backward()
            total += float(loss)
        optimizer.step()
        losses.append(total)
    return losses, model.state_dict()


def whole_model_name(case, key):
    """The whole model's name of a rank's "<stage>/<name>" entry."""
    stage, name = key.split("/", 1)
    return f"stages.{stage}.{name}" if case == "skip" else name


@pytest.mark.parametrize("case", CASES)
def test_equals_plain_torch(four_ranks, case):
    ranks = four_ranks[case]
    ref_losses, ref_state = plain_torch(case)
    spec = parity_worker.CASES[case]
    copies = spec.get("data_parallel", 1)
    shares = spec.get("data_parallel_shares", [1] * copies)
    # Each copy's last stage returns its share's mean; the batch's mean weighs them by shares.
    losses = [sum(r["losses"][k] * shares[r["copy"]] for r in ranks
                  if r["losses"][k] is not None) / sum(shares)
              for k in range(parity_worker.STEPS)]
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    seen = set()
    for r in ranks:
        for key, value in r["state"].items():
            name = whole_model_name(case, key)
            seen.add(name)
            assert torch.allclose(torch.tensor(value), ref_state[name], rtol=1e-5, atol=1e-6), (
                f"rank {ranks.index(r)}: {name}")
    assert seen == set(ref_state)


def test_tied_copies_stay_bit_identical(four_ranks):
    ranks = four_ranks["tie"]
    first = next(r["state"]["0/0.0.weight"] for r in ranks if "0/0.0.weight" in r["state"])
    last = next(r["state"]["3/7.0.weight"] for r in ranks if "3/7.0.weight" in r["state"])
    assert first == last


def test_data_parallel_copies_hold_the_same_weights(four_ranks):
    for case in ("dp", "dp-zero", "dp-shares"):
        by_copy = {}
        for r in four_ranks[case]:
            by_copy.setdefault(r["copy"], {}).update(r["state"])
        assert by_copy[0] == by_copy[1]


def one_process_stages():
    """The four stages of a 1f1b over mlp() in this process (a world of one holds them all)."""
    import pptrain
    parts = pptrain.split(parity_worker.mlp(), [2, 4, 6])
    return [pptrain.PipelineStage(parts[s], s, 4) for s in range(4)]


@pytest.mark.parametrize("options, message", [
    (dict(skips=[("h", 0)]), "skips: each must be (name, from_stage, to_stage), got ('h', 0)"),
    (dict(tied={"w": 3}), "tied: 'w' must map to a list of stages, got 3"),
    (dict(data_parallel=2), "data_parallel"),
    (dict(zero=1), "zero 1"),
])
def test_bad_options_stop_with_one_line(options, message):
    import pptrain
    with pytest.raises(pptrain.PipelineError) as error:
        pptrain.schedule("1f1b", one_process_stages(), 4,
                         torch.nn.functional.mse_loss, **options)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_split_names_the_parts_as_the_whole_model():
    import pptrain
    model = parity_worker.mlp()
    parts = pptrain.split(model, [3])
    merged = {**parts[0].state_dict(), **parts[1].state_dict()}
    assert merged.keys() == model.state_dict().keys()
    assert parts[1][0] is model[3]


def test_bf16_stages_compute_as_plain_torch_under_autocast():
    """precision="bf16" on a user's modules: each stage under autocast, its output rounded to
    bf16 where it crosses to the next stage, the loss in float32; the gradients those of plain
    torch doing the same in one process, and float32 (master) parameters throughout."""
    import pptrain
    torch.set_num_threads(1)
    stages = one_process_stages()
    seen = []
    stages[1].module.register_forward_pre_hook(lambda _, args: seen.append(args[0].dtype))
    # one_process: a world of one runs the four stages in turn.
    schedule = pptrain.schedule("1f1b", stages, 4, torch.nn.functional.mse_loss,
                                one_process=True, precision="bf16")
    x, y = next(parity_worker.batches())
    loss = float(schedule.step(x, target=y))
    assert set(seen) == {torch.bfloat16}

    model = parity_worker.mlp()
    parts = pptrain.split(model, [2, 4, 6])
    total = 0.0
    for k in range(4):
        h = x.chunk(4)[k]
        for part in parts:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = part(h)
            h = h.to(torch.bfloat16) if h.dtype == torch.float32 else h
        step_loss = torch.nn.functional.mse_loss(h.float(), y.chunk(4)[k]) / 4
        step_loss.backward()
        total += step_loss.item()
    assert abs(loss - total) <= 1e-5 * abs(total)
    # (pptrain.split keeps the whole model's names in each part.)
    mine = {name: p for stage in stages for name, p in stage.module.named_parameters()}
    assert mine.keys() == dict(model.named_parameters()).keys()
    for name, p in model.named_parameters():
        got = mine[name]
        assert got.dtype == torch.float32 and got.grad.dtype == torch.float32
        torch.testing.assert_close(got.grad, p.grad, rtol=1e-5, atol=1e-7)


class _Scaled(torch.nn.Module):
    """A stage that returns its hidden state and a float32 scale for the next stage."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(parity_worker.WIDTH, parity_worker.WIDTH)

    def forward(self, x, scale=None):
        h = self.linear(x if scale is None else x * scale)
        return {"x": h, "scale": torch.full((x.shape[0], 1), 0.5)}


def test_a_marked_output_keeps_its_dtype_under_bf16():
    import pptrain
    seen = {}
    stages = [pptrain.PipelineStage(_Scaled(), 0, 2, keep_dtype=["scale"]),
              pptrain.PipelineStage(_Scaled(), 1, 2)]
    stages[1].module.register_forward_pre_hook(
        lambda _, args, kwargs: seen.update({k: v.dtype for k, v in kwargs.items()}),
        with_kwargs=True)
    schedule = pptrain.schedule("1f1b", stages, 4, lambda out, y: torch.nn.functional.mse_loss(
        out["x"], y), one_process=True, precision="bf16")
    x, y = next(parity_worker.batches())
    schedule.step(x, target=y)
    assert seen == {"x": torch.bfloat16, "scale": torch.float32}


def test_fp16_without_pptrain_optimizer_is_one_line():
    import pptrain
    with pytest.raises(pptrain.PipelineError) as error:
        pptrain.schedule("1f1b", one_process_stages(), 4, torch.nn.functional.mse_loss,
                         one_process=True, precision="fp16")
    assert "precision fp16 skips the steps whose gradients overflow" in str(error.value)
    assert "\n" not in str(error.value)


def test_weights_cast_once_per_step_give_the_same_gradients():
    """weight_casts="step" on a user's modules (torch.nn.Linear, deferred or autograd split):
    the step's microbatches share one bf16 copy of each weight, and compute what casting at
    every use computes, bit for bit."""
    import pptrain
    torch.set_num_threads(1)
    x, y = next(parity_worker.batches())
    for split in ("deferred", "autograd"):
        grads = []
        for casts in ("microbatch", "step"):
            torch.manual_seed(0)
            stages = one_process_stages()
            schedule = pptrain.schedule("zb-h1", stages, 4, torch.nn.functional.mse_loss,
                                        one_process=True, precision="bf16", weight_split=split,
                                        weight_casts=casts)
            schedule.step(x, target=y)
            grads.append({n: p.grad.clone() for s in stages
                          for n, p in s.module.named_parameters()})
        for name, grad in grads[0].items():
            assert torch.equal(grad, grads[1][name]), (split, name)
    with pytest.raises(pptrain.PipelineError) as error:
        pptrain.schedule("1f1b", one_process_stages(), 4, torch.nn.functional.mse_loss,
                         one_process=True, weight_casts="step")
    assert "weights cast once per step need precision bf16 or fp16" in str(error.value)
