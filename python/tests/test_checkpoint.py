"""Checkpoints of a Python model: a run saved and continued (by resume(), or after a rank failed
under `pptrain run --max-restarts`) ends where an uninterrupted one does, bit for bit; the stage
files are state_dicts torch.load reads; load() takes the parameters at another pipeline depth;
a checkpoint of another layout or a damaged one stops with one line."""
import json
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from processes import run  # noqa: E402

PPTRAIN = os.environ.get("PPTRAIN", "pptrain")


def launch(out, save_dir, *flags, nproc=2, launcher_flags=()):
    """`pptrain run` of checkpoint_worker.py; returns (exit status, stderr, what each rank
    wrote, or None when it wrote nothing)."""
    code, _, stderr = run([PPTRAIN, "run", "--nproc", str(nproc), *launcher_flags, sys.executable,
                           os.path.join(HERE, "checkpoint_worker.py"), str(out), str(save_dir),
                           *flags])
    ranks = [json.load(open(f"{out}.{r}.json")) if os.path.exists(f"{out}.{r}.json") else None
             for r in range(nproc)]
    return code, stderr, ranks


def expect_same_end(whole, continued):
    """The continued run's ranks end with the uninterrupted run's parameters, bit for bit, and
    saw the same losses at the steps they ran."""
    for w, c in zip(whole, continued):
        assert c["state"] == w["state"]
        for step, loss in c["losses"].items():
            assert loss == w["losses"][step]


@pytest.mark.parametrize("flags", [(), ("--pptrain-optimizer",),
                                   ("--pptrain-optimizer", "--schedule", "pipedream")],
                         ids=["own-sgd", "pptrain-sgd", "pipedream"])
def test_save_and_resume_equals_one_run(tmp_path, flags):
    code, stderr, whole = launch(tmp_path / "whole", tmp_path / "whole_ckpt", *flags)
    assert code == 0, stderr
    code, stderr, _ = launch(tmp_path / "half", tmp_path / "ckpt", "--run-until", "2", *flags)
    assert code == 0, stderr
    code, stderr, rest = launch(tmp_path / "rest", tmp_path / "ckpt", "--resume", *flags)
    assert code == 0, stderr
    assert [r["start"] for r in rest] == [2, 2]
    expect_same_end(whole, rest)


def test_restart_after_a_failed_rank_continues_the_newest_checkpoint(tmp_path):
    code, stderr, whole = launch(tmp_path / "whole", tmp_path / "whole_ckpt")
    assert code == 0, stderr
    code, stderr, restarted = launch(tmp_path / "run", tmp_path / "ckpt", "--resume",
                                     "--crash-rank", "1", "--crash-after", "3",
                                     launcher_flags=("--max-restarts", "1"))
    assert code == 0, stderr
    assert "rank 1 stops on purpose after step 3" in stderr
    assert [r["start"] for r in restarted] == [3, 3]
    expect_same_end(whole, restarted)


def test_stage_files_are_state_dicts_that_load_at_another_depth(tmp_path):
    code, stderr, two = launch(tmp_path / "two", tmp_path / "ckpt")
    assert code == 0, stderr
    stage1 = torch.load(tmp_path / "ckpt" / "stage_1.pt")
    assert sorted(stage1) == sorted(k.split("/", 1)[1] for k in two[1]["state"])
    # zb-v on 2 ranks cuts the model into 4 stages: each takes its names from the 2 files.
    code, stderr, four = launch(tmp_path / "four", tmp_path / "ckpt_v", "--schedule", "zb-v",
                                "--load", str(tmp_path / "ckpt"), "--run-until", "0")
    assert code == 0, stderr
    saved = {k.split("/", 1)[1]: v for r in two for k, v in r["state"].items()}
    loaded = {k.split("/", 1)[1]: v for r in four for k, v in r["state"].items()}
    assert loaded == saved


def test_a_checkpoint_of_another_layout_or_a_damaged_one_stops_with_one_line(tmp_path):
    code, stderr, _ = launch(tmp_path / "a", tmp_path / "ckpt", "--run-until", "1")
    assert code == 0, stderr
    code, stderr, ranks = launch(tmp_path / "b", tmp_path / "ckpt", "--resume", "--schedule",
                                 "gpipe")
    assert code != 0 and ranks == [None, None]
    assert "the checkpoint's schedule is 1f1b, this run's gpipe" in stderr
    with open(tmp_path / "ckpt" / "stage_0.pt", "r+b") as f:
        f.seek(40)
        f.write(b"\0\0\0\0")
    code, stderr, ranks = launch(tmp_path / "c", tmp_path / "ckpt_c", "--load",
                                 str(tmp_path / "ckpt"), "--run-until", "0")
    assert code != 0 and ranks == [None, None]
    assert "stage_0.pt' is damaged (its size or checksum differs from the manifest)" in stderr
