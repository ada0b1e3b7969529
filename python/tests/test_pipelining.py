"""pptrain.pipelining: a program written for torch.distributed.pipelining (pipelining_worker.py,
its import line changed) trains on 2 and 4 ranks equal to plain torch in one process, with
torch's schedule classes, a manual split, traced splits (of a transformer whose blocks build
their causal masks from the sequence's length, too) and two stages per rank, and evaluates
(eval(), or a schedule without a loss_fn) as plain torch does; what has no meaning here, or is
wrong, stops with a one-line error. test_pipelining_torch.py runs the same program on torch's
own pipelining as well, and compares the two."""
import json
import os
import sys
import types

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pipelining_worker as worker  # noqa: E402
from processes import run  # noqa: E402
from pptrain import pipelining  # noqa: E402

worker.use("pptrain")
PPTRAIN = os.environ.get("PPTRAIN", "pptrain")


def launch(out, nproc, cases, *flags, timeout=240):
    """`pptrain run --nproc N` of the worker, in a process group of its own killed whole if it
    outlives `timeout`; returns (exit status, stderr)."""
    command = [PPTRAIN, "run", "--nproc", str(nproc), sys.executable,
               os.path.join(HERE, "pipelining_worker.py"), out, ",".join(cases), *flags]
    status, _, err = run(command, timeout)
    return status, err


def reference(cut="manual", scale_grads=True, autocast=False):
    """Plain torch in one process, on the model `cut` splits: each step's loss of every
    microbatch, each step's output, and the parameters by name after the steps; with
    `autocast`, each microbatch's forward and loss under torch.autocast to bf16, as the
    "step-autocast" cases run step()."""
    model = worker.model_of(cut)
    optimizer = torch.optim.SGD(model.parameters(), lr=worker.LR)
    m = worker.MICROBATCHES
    step_losses, outputs = [], []
    for x, y in worker.batches(cut):
        optimizer.zero_grad()
        losses, chunks = [], []
        for xm, ym in zip(x.chunk(m), y.chunk(m)):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                output = model(xm)
                loss = worker.loss_fn(output, ym)
            # torch's scale_grads divides the summed gradients by M after the backwards; in bf16
            # that is not the same rounding as a backward of loss / M, so autocast does so too.
            (loss / m if scale_grads and not autocast else loss).backward()
            losses.append(float(loss.detach()))
            chunks.append(output.detach())
        if scale_grads and autocast:
            for p in model.parameters():
                p.grad.div_(m)
        optimizer.step()
        step_losses.append(losses)
        outputs.append(torch.cat(chunks))
    return step_losses, outputs, {n: p.detach() for n, p in model.named_parameters()}


def expect_equals_plain_torch(case, ranks):
    """The ranks' `losses` lists, merged outputs and parameters (by name) equal plain torch's
    to 1e-5. Under the program's autocast (bf16) only the first step's forwards can: the
    gradients that cross a cut are summed in bf16 in another order than one process sums them,
    so the later steps agree to bf16's precision (test_pipelining_torch.py holds them to 1e-5
    against torch's own pipelining, which sums as pptrain does)."""
    cut, _, _, keywords, call = worker.CASES[case]
    autocast = call == "step-autocast"
    ref_losses, ref_outputs, ref_params = reference(
        cut, scale_grads=keywords.get("scale_grads", True), autocast=autocast)
    last = [r for r in ranks if r["losses"]]
    assert len(last) == 1, "exactly one rank holds the last stage"
    assert [len(step) for step in last[0]["losses"]] == [worker.MICROBATCHES] * worker.STEPS
    for step, (got, want) in enumerate(zip(last[0]["losses"], ref_losses)):
        assert got == pytest.approx(want, rel=1e-5 if step == 0 or not autocast else 1e-2)
    if call == "step-no-outputs":
        assert last[0]["outputs"] == [None] * worker.STEPS
    else:
        for step, (got, want) in enumerate(zip(last[0]["outputs"], ref_outputs)):
            rtol = 1e-5 if step == 0 or not autocast else 1e-2
            assert torch.allclose(torch.tensor(got), want.float(), rtol=rtol, atol=rtol / 10)
    params = {}
    for r in ranks:
        params.update(r["params"])
    assert sorted(params) == sorted(ref_params), "the stages keep the model's parameter names"
    rtol = 1e-2 if autocast else 1e-5
    for name, want in ref_params.items():
        assert torch.allclose(torch.tensor(params[name]), want, rtol=rtol, atol=rtol / 10), name


def expect_evaluates_as_plain_torch(case, ranks):
    """A schedule without a loss_fn, or eval(): the merged output of each step on the last
    stage's rank equals the model's output in plain torch, and no parameter moved; eval() with
    the schedule's loss_fn gives each microbatch's loss as well."""
    cut = worker.CASES[case][0]
    model = worker.model_of(cut)
    last = [r for r in ranks if r["losses"]]
    assert len(last) == 1, "exactly one rank holds the last stage"
    m = worker.MICROBATCHES
    with torch.no_grad():
        for got, losses, (x, y) in zip(last[0]["outputs"], last[0]["losses"], worker.batches(cut)):
            assert torch.allclose(torch.tensor(got), model(x), rtol=1e-5, atol=1e-6)
            if worker.CASES[case][4] == "eval":
                want = [float(worker.loss_fn(model(xm), ym)) for xm, ym in zip(x.chunk(m),
                                                                                y.chunk(m))]
                assert losses == pytest.approx(want, rel=1e-5)
            else:
                assert losses == ["evaluated"]
    assert len(last[0]["outputs"]) == worker.STEPS
    for r in ranks:
        for name, value in r["params"].items():
            assert torch.equal(torch.tensor(value), model.state_dict()[name]), name


def expect_case(case, ranks):
    _, _, _, keywords, call = worker.CASES[case]
    if keywords.get("loss_fn", worker.loss_fn) is None or call == "eval":
        expect_evaluates_as_plain_torch(case, ranks)
    else:
        expect_equals_plain_torch(case, ranks)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """trained(nproc, case): what the ranks wrote for `case`, from one launch of all the cases
    of that many ranks (its ranks import torch once), made at the first test that asks."""
    launched = {}

    def result(nproc, case):
        if nproc not in launched:
            cases = worker.RANKS2 if nproc == 2 else worker.RANKS4
            out = str(tmp_path_factory.mktemp(f"ranks{nproc}") / "run")
            code, stderr = launch(out, nproc, cases)
            launched[nproc] = {}
            for c in cases:
                paths = [f"{out}.{c}.{rank}.json" for rank in range(nproc)]
                if all(os.path.exists(p) for p in paths):
                    launched[nproc][c] = [json.load(open(p)) for p in paths]
                else:
                    launched[nproc][c] = f"the launch exited with {code} before {c}:\n{stderr}"
        ranks = launched[nproc][case]
        if isinstance(ranks, str):
            pytest.fail(ranks, pytrace=False)
        return ranks
    return result


@pytest.mark.parametrize("case", worker.RANKS2)
def test_torch_program_on_2_ranks_equals_plain_torch(trained, case):
    expect_case(case, trained(2, case))


@pytest.mark.parametrize("case", worker.RANKS4)
def test_torch_program_on_4_ranks_equals_plain_torch(trained, case):
    expect_case(case, trained(4, case))


def test_process_group_from_torchrun_environment_and_step_without_input(tmp_path):
    """A program that never calls init_process_group trains as well; then the first stage's
    rank calling step() without the batch stops the run with a one-line error, no rank left."""
    out = str(tmp_path / "run")
    code, stderr = launch(out, 2, ["gpipe-manual"], "--no-init", "--step-without-input")
    expect_equals_plain_torch(
        "gpipe-manual", [json.load(open(f"{out}.gpipe-manual.{r}.json")) for r in range(2)])
    assert code != 0
    assert ("ValueError: Schedule1F1B.step(): this rank holds stage 0, the first; pass the "
            "batch's inputs: step(x)") in stderr


# Bad input, in this one process (a world of one: no RANK in the environment).
def one_line_error(kind, call):
    with pytest.raises(kind) as error:
        call()
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.fixture(scope="module")
def pipe():
    x = torch.randn(2, worker.DIM)
    return pipelining.pipeline(worker.model(), (x,),
                               split_spec={"layers.2": pipelining.SplitPoint.BEGINNING})


def test_stage_index_out_of_range(pipe):
    assert "stage_index 2 is not in 0..1" in one_line_error(
        ValueError, lambda: pipelining.PipelineStage(worker.model(), 2, 2, "cpu"))
    assert "stage_index 5 is not in 0..1" in one_line_error(
        ValueError, lambda: pipe.build_stage(5, torch.device("cpu")))


def test_split_spec_naming_no_module():
    message = one_line_error(ValueError, lambda: pipelining.pipeline(
        worker.model(), (torch.randn(2, worker.DIM),),
        split_spec={"layers.9": pipelining.SplitPoint.BEGINNING}))
    assert "'layers.9'" in message and "no submodule" in message


def test_schedule_given_a_list_or_one_stage_against_its_kind():
    stage = pipelining.PipelineStage(worker.model(), 0, 1, "cpu")
    assert "ScheduleGPipe takes one stage" in one_line_error(
        TypeError, lambda: pipelining.ScheduleGPipe([stage], 2, loss_fn=worker.loss_fn))
    assert "ScheduleInterleaved1F1B takes a list" in one_line_error(
        TypeError, lambda: pipelining.ScheduleInterleaved1F1B(stage, 2, loss_fn=worker.loss_fn))


def test_step_without_input_on_the_first_stage():
    stage = pipelining.PipelineStage(worker.model(), 0, 1, "cpu")
    schedule = pipelining.ScheduleGPipe(stage, 2, loss_fn=worker.loss_fn)
    assert "pass the batch's inputs" in one_line_error(
        ValueError, lambda: schedule.step(target=torch.randn(4, worker.DIM)))
    assert "pass the batch's target" in one_line_error(
        ValueError, lambda: schedule.step(torch.randn(4, worker.DIM)))


def test_what_has_no_meaning_here():
    model = worker.model()
    assert "device cuda:0" in one_line_error(
        ValueError, lambda: pipelining.PipelineStage(model, 0, 1, torch.device("cuda:0")))
    assert "dw_builder" in one_line_error(
        NotImplementedError,
        lambda: pipelining.PipelineStage(model, 0, 1, "cpu", dw_builder=lambda: None))
    assert "unknown schedule name 'nope'" in one_line_error(
        ValueError, lambda: pipelining.get_schedule_class("nope"))


def test_backward_requires_autograd_and_step_without_gradients():
    """backward_requires_autograd=False (torch's, for a dw_builder's backward) has no meaning
    here; step() under torch.no_grad() stops, as torch's does, and eval() runs there."""
    stage = pipelining.PipelineStage(worker.model(), 0, 1, "cpu")
    assert "backward_requires_autograd=False is not supported" in one_line_error(
        NotImplementedError, lambda: pipelining.ScheduleInterleaved1F1B(
            [stage], 2, loss_fn=worker.loss_fn, backward_requires_autograd=False))
    schedule = pipelining.ScheduleGPipe(stage, 2, loss_fn=worker.loss_fn)
    x, y = torch.randn(4, worker.DIM), torch.randn(4, worker.DIM)
    with torch.no_grad():
        assert "call eval() for the forwards alone" in one_line_error(
            RuntimeError, lambda: schedule.step(x, target=y))
        assert torch.allclose(schedule.eval(x), worker.model()(x), rtol=1e-5, atol=1e-6)


def test_eval_and_return_outputs_in_one_process():
    """eval() gives the outputs and each microbatch's loss and leaves the gradients alone;
    step(return_outputs=False) trains and returns None; eval() asked for losses without the
    target stops with one line."""
    stage = pipelining.PipelineStage(worker.model(), 0, 1, "cpu")
    schedule = pipelining.Schedule1F1B(stage, 2, loss_fn=worker.loss_fn)
    x, y = torch.randn(4, worker.DIM), torch.randn(4, worker.DIM)
    model = worker.model()
    grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone()
             for p in stage.submod.parameters()]
    losses = []
    assert torch.allclose(schedule.eval(x, target=y, losses=losses), model(x), rtol=1e-5,
                          atol=1e-6)
    want = [float(worker.loss_fn(model(xm), ym).detach()) for xm, ym in zip(x.chunk(2),
                                                                            y.chunk(2))]
    assert [float(loss) for loss in losses] == pytest.approx(want, rel=1e-5)
    assert all(p.grad is None or torch.equal(p.grad, g)
               for p, g in zip(stage.submod.parameters(), grads))
    assert schedule.step(x, target=y, losses=losses, return_outputs=False) is None
    assert len(losses) == 2
    assert not all(torch.equal(p.grad, g) for p, g in zip(stage.submod.parameters(), grads))
    assert "needs the schedule's loss_fn (given) and the target (none)" in one_line_error(
        ValueError, lambda: schedule.eval(x, losses=[]))


def test_a_traced_stage_leaves_its_linear_weight_products_to_w():
    """In this process: zb-h1 (each backward split into I and W) on the one stage pipeline()
    makes. The graph's linear products are pptrain's, their weight gradients left to W, which
    adds them to .grad itself: a hook on a weight never sees one, where autograd's split
    (weight_split="autograd") passes it each; the gradients are plain torch's either way."""
    x, y = torch.randn(worker.BATCH, worker.DIM), torch.randn(worker.BATCH, worker.DIM)
    m = worker.MICROBATCHES
    plain = worker.model()
    for xm, ym in zip(x.chunk(m), y.chunk(m)):
        (worker.loss_fn(plain(xm), ym) / m).backward()
    seen = {}
    for split in ("deferred", "autograd"):
        model = worker.model()
        stage = pipelining.pipeline(model, (x.chunk(m)[0],)).build_stage(0, "cpu")
        weight = next(p for p in model.parameters() if p.dim() == 2)
        seen[split] = []
        weight.register_hook(lambda grad, split=split: seen[split].append(grad is not None))
        schedule = pipelining.get_schedule_class("zb-h1")(stage, m, loss_fn=worker.loss_fn,
                                                          weight_split=split)
        schedule.step(x, target=y)
        for (name, got), want in zip(model.named_parameters(), plain.parameters()):
            assert torch.allclose(got.grad, want.grad, rtol=1e-5, atol=1e-7), f"{split}: {name}"
    assert not any(seen["deferred"])
    assert seen["autograd"] == [True] * m


def test_schedule_names():
    assert pipelining.get_schedule_class("zbvzerobubble") is pipelining.ScheduleZBVZeroBubble
    assert pipelining.get_schedule_class("1F1B") is pipelining.Schedule1F1B
    assert pipelining.get_schedule_class("zb-h1")._pptrain_name == "zb-h1"


def test_pipe_runs_the_whole_model_and_keeps_parameter_names(pipe):
    x = torch.randn(4, worker.DIM)
    assert torch.allclose(pipe(x), worker.model()(x))
    names = [n for s in range(pipe.num_stages)
             for n, _ in pipe.get_stage_module(s).named_parameters()]
    assert names == [n for n, _ in worker.model().named_parameters()]


class Scaled(torch.nn.Module):
    """A forward with a keyword argument that the second stage reads."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(worker.DIM, worker.DIM)
        self.b = torch.nn.Linear(worker.DIM, worker.DIM)

    def forward(self, x, scale=None):
        return self.b(torch.tanh(self.a(x))) * scale


def test_keywords_of_step_reach_the_stage_that_reads_them():
    """step(x, scale=s): the keyword goes to the first stage's forward, and through it to the
    second stage, which reads it; both stages on this one process."""
    model = Scaled()
    x, y = torch.randn(8, worker.DIM), torch.randn(8, worker.DIM)
    scale = torch.linspace(1, 2, 8).unsqueeze(1)
    pipe = pipelining.pipeline(model, (x[:2],), {"scale": scale[:2]},
                               split_spec={"b": pipelining.SplitPoint.BEGINNING})
    stages = [pipe.build_stage(s, "cpu") for s in range(2)]
    schedule = pipelining.ScheduleInterleaved1F1B(stages, 4, loss_fn=worker.loss_fn)
    losses = []
    output = schedule.step(x, scale=scale, target=y, losses=losses)
    assert torch.allclose(output, model(x, scale=scale), rtol=1e-5, atol=1e-6)
    want = [float(worker.loss_fn(model(xm, scale=sm), ym).detach())
            for xm, sm, ym in zip(x.chunk(4), scale.chunk(4), y.chunk(4))]
    assert [float(loss) for loss in losses] == pytest.approx(want, rel=1e-5)


class Reused(torch.nn.Module):
    """`a` runs before the cut at `b` and again after it; `unused` never runs."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(worker.DIM, worker.DIM)
        self.b = torch.nn.Linear(worker.DIM, worker.DIM)
        self.unused = torch.nn.Linear(worker.DIM, worker.DIM)

    def forward(self, x):
        return self.a(self.b(self.a(x)))


def test_a_parameter_of_two_stages_and_a_split_point_never_reached():
    x = torch.randn(2, worker.DIM)
    assert "parameter a.weight is used by stages 0 and 1" in one_line_error(
        NotImplementedError, lambda: pipelining.pipeline(
            Reused(), (x,), split_spec={"b": pipelining.SplitPoint.BEGINNING}))
    assert "'unused', which Reused's forward never calls" in one_line_error(
        ValueError, lambda: pipelining.pipeline(
            Reused(), (x,), split_spec={"unused": pipelining.SplitPoint.END}))


class Normalized(torch.nn.Module):
    """A Linear, a BatchNorm1d (buffers updated in place), a tensor made in the forward (a
    constant of the trace) and a buffer out of the state_dict."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(worker.DIM, worker.DIM)
        self.bn = torch.nn.BatchNorm1d(worker.DIM)
        self.register_buffer("scale", torch.tensor(2.0), persistent=False)

    def forward(self, x):
        return self.bn(self.linear(x)) * torch.tensor(3.0) * self.scale


class Nested(torch.nn.Module):
    """A forward that takes a dict and returns one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = Normalized()
        self.b = Normalized()

    def forward(self, batch):
        h = self.a(batch["x"]) + batch["y"]
        return {"out": self.b(h), "mean": h.mean()}


def test_nested_inputs_and_outputs_buffers_and_constants():
    """The first stage takes the forward's dict, the last returns its dict; the BatchNorms'
    running statistics are the model's, updated as plain torch updates them; the stages'
    state_dicts are the model's, split."""
    model, plain = Nested(), Nested()
    batch = {"x": torch.randn(4, worker.DIM), "y": torch.randn(4, worker.DIM)}
    pipe = pipelining.pipeline(model, (batch,), split_spec={"a": pipelining.SplitPoint.END})
    got, want = pipe(batch), plain(batch)
    assert sorted(got) == ["mean", "out"]
    assert all(torch.allclose(got[k], want[k], rtol=1e-5, atol=1e-6) for k in want)
    assert torch.allclose(model.b.bn.running_mean, plain.b.bn.running_mean)
    assert int(model.a.bn.num_batches_tracked) == 1
    names = [n for s in range(pipe.num_stages) for n in pipe.get_stage_module(s).state_dict()]
    assert sorted(names) == sorted(model.state_dict())


def test_a_schedule_class_of_ones_own():
    """torch lets a program subclass its bases with an order of its own; pptrain runs only its
    registry's orders and CSV files, and says so."""
    class Mine(pipelining.PipelineScheduleSingle):
        pass

    stage = pipelining.PipelineStage(worker.model(), 0, 1, "cpu")
    assert "not a PipelineScheduleSingle of its own" in one_line_error(
        NotImplementedError, lambda: Mine(stage, 2, loss_fn=worker.loss_fn))
    multi = pipelining.PipelineScheduleMulti([stage], 2, loss_fn=worker.loss_fn)
    assert "call _load_csv(path) first" in one_line_error(
        RuntimeError, lambda: multi.step(torch.randn(4, worker.DIM),
                                         target=torch.randn(4, worker.DIM)))


@pytest.mark.parametrize("ranks,microbatches,bubbles", [(2, 4, (0.077, 0.111)),
                                                        (4, 8, (0.111, 0.158))])
def test_interleaved_zero_bubble_order_has_less_bubble_than_interleaved_1f1b(
        ranks, microbatches, bubbles):
    """ScheduleInterleavedZeroBubble's order (written here) splits each backward into I and W
    and holds the W's back to fill the waits: the simulator, at F = I = W, finds the bubble its
    docstring states, below interleaved-1f1b's."""
    from pptrain import plan
    schedule = pipelining.ScheduleInterleavedZeroBubble.__new__(
        pipelining.ScheduleInterleavedZeroBubble)
    schedule._stage = types.SimpleNamespace(group_size=ranks, num_stages=2 * ranks)
    schedule._n_microbatches = microbatches
    order = schedule._order_csv()
    assert "I" in order and "W" in order and "B" not in order
    cost = "F=1,I=1,W=1,comm=0"
    ours = plan.from_csv(order).simulate(cost)["bubble_ratio"]
    interleaved = plan.schedule("interleaved-1f1b", pp=ranks, microbatches=microbatches,
                                chunks=2).simulate(cost)["bubble_ratio"]
    assert (round(ours, 3), round(interleaved, 3)) == bubbles
