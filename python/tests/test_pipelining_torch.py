"""torch's own pipelining as the oracle of pptrain.pipelining: the same training program
(pipelining_worker.py) runs twice, once on torch.distributed.pipelining (--api torch) and once on
pptrain.pipelining, both started by torchrun on 2 and 4 ranks over Gloo on the CPU, and the two
runs give equal losses, outputs and parameters (to 1e-5): manual splits, pipeline() at split
points, at the model's pipe_split() and of a transformer whose blocks build their causal masks
from the sequence's length, the schedules of one stage and of several per rank,
scale_grads=False, return_outputs=False, eval(), and a schedule without a loss_fn.

A class of torch's that fails a case (its run writes the error instead) is named in a line of
the test's output with its failure, and pptrain's run is compared with plain torch in one
process instead, as test_pipelining.py does. With torch 2.11:
- ScheduleZBVZeroBubble and ScheduleDualPipeV fail every case on Gloo: at their first step each
  rank sends a probe to the rank of each neighbouring stage, and the V placement puts two
  neighbouring stages on one rank, so a rank sends to itself, for which Gloo has no connection
  ("Pair is not connected").
- the schedules of several stages per rank (PipelineScheduleMulti) train no split whose value
  skips a stage ("Backward of skip connections not supported yet"): "split8" cuts inside the
  residual blocks, so a block's input goes from the stage before the block to the one after
  its cut; pptrain passes it through the stage between.
"""
import os
import sys

import pytest
import torch

pytest.importorskip("torch.distributed.pipelining")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pipelining_worker as worker  # noqa: E402
from processes import case_results, run, torchrun  # noqa: E402
from test_pipelining import expect_case  # noqa: E402

worker.use("pptrain")
TWINS = {2: [c for c in worker.RANKS2 if c not in worker.PPTRAIN_ONLY], 4: worker.RANKS4}


def launch(out, nproc, cases, api, timeout=150):
    """torchrun of the worker on `api`'s pipelining (torch's keeping going past a failed case),
    in a process group of its own killed whole if it outlives `timeout`; returns what the ranks
    wrote for each case (a list by rank), or a string saying why they wrote nothing."""
    command = torchrun(nproc, os.path.join(HERE, "pipelining_worker.py"), out, ",".join(cases),
                       "--api", api)
    if api == "torch":
        command.append("--keep-going")
    code, _, err = run(command, timeout)
    return case_results(out, cases, nproc, code, err, api)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """twins(nproc, case): (torch's ranks, pptrain's ranks) of `case`, from one launch of each
    on all the cases of that many ranks, made at the first test that asks."""
    launched = {}

    def result(nproc, case):
        if nproc not in launched:
            folder = tmp_path_factory.mktemp(f"twins{nproc}")
            launched[nproc] = {api: launch(str(folder / api), nproc, TWINS[nproc], api)
                               for api in ("torch", "pptrain")}
        theirs, ours = launched[nproc]["torch"][case], launched[nproc]["pptrain"][case]
        if isinstance(ours, str):
            pytest.fail(ours, pytrace=False)
        if isinstance(theirs, str):
            pytest.fail(theirs, pytrace=False)
        return theirs, ours
    return result


def expect_equal_runs(theirs, ours):
    """The same rank holds the last stage in both; its losses and outputs are equal, and so
    is every parameter by name, to 1e-5."""
    last = [r for r, rank in enumerate(theirs) if rank["losses"]]
    assert [r for r, rank in enumerate(ours) if rank["losses"]] == last
    assert len(last) == 1, "exactly one rank holds the last stage"
    mine, torchs = ours[last[0]], theirs[last[0]]
    assert len(mine["losses"]) == len(torchs["losses"]) == worker.STEPS
    for got, want in zip(mine["losses"], torchs["losses"]):
        if want == ["evaluated"]:  # no loss_fn: the forwards alone
            assert got == want
        else:
            assert got == pytest.approx(want, rel=1e-5)
    assert [o is None for o in mine["outputs"]] == [o is None for o in torchs["outputs"]]
    for got, want in zip(mine["outputs"], torchs["outputs"]):
        if want is not None:
            assert torch.allclose(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
    for r, (mine, torchs) in enumerate(zip(ours, theirs)):
        assert sorted(mine["params"]) == sorted(torchs["params"]), f"rank {r}'s parameters"
        for name, want in torchs["params"].items():
            assert torch.allclose(torch.tensor(mine["params"][name]), torch.tensor(want),
                                  rtol=1e-5, atol=1e-6), f"rank {r}: {name}"


def expect_as_torchs(capsys, nproc, case, theirs, ours):
    errors = sorted({rank["error"] for rank in theirs if "error" in rank})
    # The first failure, not the timeouts of the ranks left waiting for it.
    errors = [e for e in errors if "Timed out waiting" not in e] or errors
    assert not any("error" in rank for rank in ours), ours
    if not errors:
        expect_equal_runs(theirs, ours)
        return
    with capsys.disabled():
        print(f"\ntorch's {worker.CASES[case][2]} fails on {case} ({nproc} ranks, Gloo, CPU): "
              f"{' / '.join(errors)}; pptrain's run compared with plain torch in one process "
              "instead")
    expect_case(case, ours)


@pytest.mark.parametrize("case", TWINS[2])
def test_on_2_ranks_as_torchs_own_pipelining(twins, capsys, case):
    expect_as_torchs(capsys, 2, case, *twins(2, case))


@pytest.mark.parametrize("case", TWINS[4])
def test_on_4_ranks_as_torchs_own_pipelining(twins, capsys, case):
    expect_as_torchs(capsys, 4, case, *twins(4, case))
