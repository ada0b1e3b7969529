"""The failure cases users report of pipeline parallelism, on pptrain.pipelining and on torch's
own torch.distributed.pipelining: one training program (user_cases_worker.py) started by
torchrun over Gloo on the CPU, once on each API, on 4 ranks and on 2. pptrain's run must equal
plain torch in one process (the model trained on each whole batch, the same seed: its losses,
the gradients of each step and the parameters after them, to 1e-5), or stop in one line where
it cannot; torch's outcome is printed beside it, a line per case, and not asserted.

- fewer microbatches than stages: 2 microbatches on 4 stages (Schedule1F1B) and on 8 stages of
  4 ranks (ScheduleInterleaved1F1B);
- a skip connection: a value made on stage 0 and read on stage 2 (pipeline() at split points);
- a loss that averages and one that sums, each with scale_grads=True and False: the gradients
  are the whole batch's of the same loss times pipelined_gradient_factor();
- a rank that dies (SIGKILL) inside a step: the rank left stops within a few seconds, naming
  it, long before the communication timeout (PPTRAIN_COMM_TIMEOUT_S, 20 s here);
- an input whose shape changes between steps: stages made by hand take any shape and train as
  plain torch does; a traced split's first stage refuses a microbatch of another shape than the
  example's, in one line.

With torch 2.11 the printed outcomes are: Schedule1F1B refuses 2 microbatches on 4 stages (its
constructor: "Number of microbatches (2) must be greater than or equal to the number of stages
(4)"), ScheduleInterleaved1F1B trains them as plain torch does; the skip connection and the four
losses match plain torch; a batch of another shape than the first step's stops torch's stage 0
(PipeliningShapeError, stages made by hand too: they take their shapes from the first step),
the other ranks waiting until their group's timeout; the ranks left by a dead one raise Gloo's
"Connection closed by peer" within a second, which names an address, not a rank.
"""
import json
import os
import sys

import pytest
import torch

pytest.importorskip("torch.distributed.pipelining")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pipelining_worker as worker  # noqa: E402
import user_cases_worker as user  # noqa: E402
from processes import run, torchrun  # noqa: E402

worker.use("pptrain")

LAUNCH_TIMEOUT_S = 120  # a launch still running then is killed whole: a hang
TOLERANCE = 1e-5


def launch(out, nproc, api):
    """torchrun of the worker on `api`'s pipelining for the cases of `nproc` ranks: its exit
    status (None: killed after LAUNCH_TIMEOUT_S), its stderr, and what each rank wrote for each
    case ({case: [the rank's result, or None]})."""
    command = torchrun(nproc, os.path.join(HERE, "user_cases_worker.py"), out,
                       ",".join(user.RANKS[nproc]), "--api", api)
    code, _, err = run(command, LAUNCH_TIMEOUT_S, hang_fails=False)
    results = {}
    for case in user.RANKS[nproc]:
        paths = [f"{out}.{case}.{rank}.json" for rank in range(nproc)]
        results[case] = [json.load(open(p)) if os.path.exists(p) else None for p in paths]
    return {"code": code, "stderr": err, "results": results}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """launched(case): (torch's launch, pptrain's) of the cases of `case`'s number of ranks,
    made at the first test that asks."""
    made = {}

    def result(case):
        nproc = user.CASES[case].ranks
        if nproc not in made:
            folder = tmp_path_factory.mktemp(f"ranks{nproc}")
            made[nproc] = {api: launch(str(folder / api), nproc, api)
                           for api in ("torch", "pptrain")}
        return made[nproc]["torch"], made[nproc]["pptrain"]
    return result


def pipelined_gradient_factor(case):
    """A pipelined step's gradients over the whole batch's gradient of the same loss. The step
    sums the microbatches' gradients, and scale_grads=True divides the sum by their number M. A
    loss that averages over its microbatch ("mean"), of M equal microbatches, sums to M times
    the whole batch's mean: scale_grads=True gives the whole batch's gradient, False M times it.
    A loss that sums ("sum") sums to the whole batch's: False gives it, True 1/M of it."""
    m = case.microbatches
    if case.reduction == "mean":
        return 1.0 if case.scale_grads else float(m)
    return 1.0 / m if case.scale_grads else 1.0


def plain_torch(case):
    """The case's model trained in one process on each whole batch, with the case's loss and an
    SGD of the worker's rate stepping the gradients a pipelined step leaves (the whole batch's
    times pipelined_gradient_factor()): each step's loss, those gradients by name, and the
    parameters after the steps."""
    model = user.model_of(case)
    optimizer = torch.optim.SGD(model.parameters(), lr=worker.LR)
    losses, grads = [], []
    for x, y in user.batches(case):
        optimizer.zero_grad()
        loss = user.loss(case, model(x), y)
        loss.backward()
        for p in model.parameters():
            p.grad.mul_(pipelined_gradient_factor(case))
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        optimizer.step()
    return losses, grads, {n: p.detach() for n, p in model.named_parameters()}


def close(got, want):
    return torch.allclose(torch.tensor(got), want, rtol=TOLERANCE, atol=TOLERANCE / 10)


def differences(case, ranks):
    """How the ranks' run differs from plain_torch(): [] where it is equal. The last stage's
    rank's microbatch losses, averaged (a loss that averages) or summed (one that sums), are the
    whole batch's loss; every gradient and parameter, by name, equals plain torch's."""
    c = user.CASES[case]
    want_losses, want_grads, want_params = plain_torch(c)
    last = [r for r in ranks if r["losses"]]
    if len(last) != 1:
        return [f"{len(last)} ranks gave losses; expected one, the last stage's"]
    found = []
    for step, (got, want) in enumerate(zip(last[0]["losses"], want_losses)):
        combined = sum(got) / len(got) if c.reduction == "mean" else sum(got)
        if len(got) != c.microbatches or combined != pytest.approx(want, rel=TOLERANCE):
            found.append(f"step {step + 1}'s losses {got}: {c.reduction} {combined}, the whole "
                         f"batch's {want}")
    if len(last[0]["losses"]) != len(want_losses):
        found.append(f"{len(last[0]['losses'])} steps of losses, not {len(want_losses)}")
    for step, want in enumerate(want_grads):
        got = {name: g for r in ranks for name, g in r["grads"][step].items()}
        if sorted(got) != sorted(want):
            found.append(f"step {step + 1}'s gradients name {sorted(got)}, not {sorted(want)}")
        found += [f"step {step + 1}'s gradient of {name}" for name in want
                  if name in got and not close(got[name], want[name])]
    params = {name: p for r in ranks for name, p in r["params"].items()}
    found += [f"{name} after the steps" for name in want_params
              if name not in params or not close(params[name], want_params[name])]
    return found


def first_failure(ranks):
    """The first rank's error that is not a timeout of a rank left waiting (else the first
    timeout), as "rank R: ERROR", or None."""
    errors = [(r, x["error"]) for r, x in enumerate(ranks) if x and "error" in x]
    causes = [e for e in errors if "Timed out waiting" not in e[1]] or errors
    return f"rank {causes[0][0]}: {causes[0][1]}" if causes else None


def outcome(case, launched_api):
    """One line saying how a launch ran `case`: its failure, "matches plain torch", or how it
    differs; for "dies", what each rank left did."""
    ranks = launched_api["results"][case]
    if user.CASES[case].dies:
        left = [f"rank {r} raised after {x['seconds']} s: {x['error']}" if x and "error" in x
                else f"rank {r} wrote nothing" for r, x in enumerate(ranks[:-1])]
        return "; ".join(left)
    failure = first_failure(ranks)
    if failure:
        return failure
    if None in ranks:
        state = "hung (killed)" if launched_api["code"] is None else "ended"
        return f"{state} before ranks {[r for r, x in enumerate(ranks) if x is None]} wrote it"
    found = differences(case, ranks)
    return f"differs from plain torch: {'; '.join(found[:3])}" if found else "matches plain torch"


def show(capsys, case, ours, theirs):
    c = user.CASES[case]
    with capsys.disabled():
        print(f"\n{case} ({c.ranks} ranks, {c.schedule}, {c.microbatches} microbatches): "
              f"pptrain: {ours} | torch {torch.__version__}: {theirs}")


def ours_or_fail(launched_pptrain, case):
    """pptrain's ranks' results of `case`; a launch that hung fails the test with its stderr."""
    if launched_pptrain["code"] is None:
        pytest.fail(f"pptrain's launch hung:\n{launched_pptrain['stderr'][-4000:]}",
                    pytrace=False)
    return launched_pptrain["results"][case]


@pytest.mark.parametrize("case", ["fewer-1f1b", "fewer-interleaved", "skip-1f1b", "mean-scaled",
                                  "mean-unscaled", "sum-scaled", "sum-unscaled", "shape-manual"])
def test_trains_as_plain_torch(launched, capsys, case):
    theirs, ours = launched(case)
    ranks = ours_or_fail(ours, case)
    show(capsys, case, outcome(case, ours), outcome(case, theirs))
    assert first_failure(ranks) is None and None not in ranks, ours["stderr"][-4000:]
    assert differences(case, ranks) == []


def test_traced_stage_refuses_a_sequence_of_another_length(launched, capsys):
    """The causal blocks read the sequence's length, which the traced graph holds as the
    example's: the second step's longer sequence stops stage 0's rank with one line before the
    step starts (the ranks after it then stop when that rank's program has ended)."""
    theirs, ours = launched("shape-traced")
    ranks = ours_or_fail(ours, "shape-traced")
    show(capsys, "shape-traced", outcome("shape-traced", ours), outcome("shape-traced", theirs))
    assert ranks[0] is not None and "error" in ranks[0], ours["stderr"][-4000:]
    assert ranks[0]["error"] == (
        "ValueError: Schedule1F1B.step(): microbatch 0 of this batch has the shape [2, 7, 8], "
        "and stage 0 was traced by pipeline() on [2, 5, 8]: a traced graph holds the example's "
        "sizes, so every microbatch must have its shape (split the batch so, or trace a new "
        "Pipe on this shape; stages made by hand, PipelineStage(module, ...), take any shape)")


def test_rank_that_dies_mid_step_is_named_by_the_rank_left(launched, capsys):
    """Rank 1, the last stage's, is killed inside its second step's second loss: rank 0, which
    waits for its gradients, stops with one line naming rank 1 within a few seconds (its
    communication timeout is 20 s), and the launch ends."""
    theirs, ours = launched("dies")
    ranks = ours_or_fail(ours, "dies")
    show(capsys, "dies", outcome("dies", ours), outcome("dies", theirs))
    assert ranks[1] is None, "rank 1 was killed before it wrote"
    assert ranks[0] is not None and "error" in ranks[0], ours["stderr"][-4000:]
    assert "rank 1" in ranks[0]["error"] and "the connection broke" in ranks[0]["error"]
    assert ranks[0]["seconds"] < 5


def test_traced_stage_refuses_another_batch_size_in_one_process():
    """The check needs no other rank: a pipe traced on microbatches of 2 rows, all its stages in
    this process, trains batches of 8 in 4 microbatches and refuses one of 12, in one line."""
    x = torch.randn(12, worker.DIM)
    pipe = worker.pipelining.pipeline(worker.model(), (x[:2],), split_spec={
        "layers.2": worker.pipelining.SplitPoint.BEGINNING})
    stages = [pipe.build_stage(s, "cpu") for s in range(2)]
    schedule = worker.schedules.ScheduleInterleaved1F1B(stages, 4, loss_fn=worker.loss_fn)
    schedule.step(x[:8], target=x[:8])
    with pytest.raises(ValueError) as error:
        schedule.step(x, target=x)
    assert "microbatch 0 of this batch has the shape [3, 8]" in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("ranks,chunks,microbatches", [(4, 2, 2), (4, 2, 1), (4, 3, 3), (2, 2, 1)])
def test_interleaved_order_of_fewer_microbatches_than_ranks(ranks, chunks, microbatches):
    """ScheduleInterleaved1F1B's order for M < P (pptrain's interleaved-1f1b, one group of M):
    each rank runs each of its stages' forward and backward of every microbatch once, and the
    simulator runs the order to its end."""
    from pptrain import plan
    from pptrain.pipelining import schedules
    order = schedules._interleaved_order(ranks, chunks, microbatches)
    for rank, actions in enumerate(order):
        stages = range(rank, ranks * chunks, ranks)
        assert sorted(actions) == sorted(f"{s}{kind}{m}" for s in stages for kind in "FB"
                                         for m in range(microbatches))
    csv = "\n".join(",".join(actions) for actions in order) + "\n"
    assert plan.from_csv(csv).simulate("F=1,I=1,W=1,comm=0")["bubble_ratio"] < 1
