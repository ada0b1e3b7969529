"""pptrain.train(): `pptrain train` as a library call from a Python program (the run supervisor
of job/supervisor.h), with its flags as keywords. The workers are forks of this test process."""

import json
import os

import pytest
import torch

import pptrain

SMALL = dict(model="gpt", layers=4, d_model=32, heads=4, seq_len=16, schedule="1f1b", pp=2,
             batch_size=8, microbatches=4, quiet=True)


def losses(metrics):
    with open(metrics) as lines:
        return {json.loads(line)["step"]: json.loads(line)["loss"] for line in lines}


def test_a_failed_run_restarts_from_the_newest_checkpoint_and_ends_as_an_uninterrupted_one(
        tmp_path, capfd):
    pptrain.train(**SMALL, steps=6, save=tmp_path / "whole", metrics=tmp_path / "whole.jsonl")
    crashed = tmp_path / "crashed"
    os.environ.update(PPTRAIN_TEST_CRASH_RANK="1", PPTRAIN_TEST_CRASH_STEP="3",
                      PPTRAIN_TEST_CRASH_ONCE=str(crashed))
    try:
        pptrain.train(**SMALL, steps=6, save=str(tmp_path / "ckpt"), save_every=2,
                      sync_save=True, max_restarts=2, metrics=str(tmp_path / "ckpt.jsonl"))
    finally:
        for name in ("PPTRAIN_TEST_CRASH_RANK", "PPTRAIN_TEST_CRASH_STEP",
                     "PPTRAIN_TEST_CRASH_ONCE"):
            del os.environ[name]
    err = capfd.readouterr().err
    assert crashed.exists()  # rank 1 did die once
    assert "pptrain: restart 1/2 after: worker rank 1 was killed by signal 6" in err, err
    assert f"resuming from step 2 of {tmp_path / 'ckpt'}" in err, err
    # The metrics hold both starts, each line naming its own: the first's steps 1 and 2 (rank 1
    # died in step 3), then the restart's from the checkpoint of step 2 on, in one layout.
    with open(tmp_path / "ckpt.jsonl") as lines:
        starts = [(line["restart"], line["step"]) for line in map(json.loads, lines)]
    assert [s for r, s in starts if r == 0][:2] == [1, 2], starts
    assert [s for r, s in starts if r == 1] == [3, 4, 5, 6], starts
    assert [r for r, _ in starts] == sorted(r for r, _ in starts), starts
    layout = {"pp": 2, "dp": 1, "stages": 2, "stage_layers": "0-2,3-5"}
    assert all(json.loads(line)["layout"] == layout for line in open(tmp_path / "ckpt.jsonl"))
    # Every step of both starts has the uninterrupted run's loss.
    whole = losses(tmp_path / "whole.jsonl")
    with open(tmp_path / "ckpt.jsonl") as lines:
        for line in map(json.loads, lines):
            assert line["loss"] == pytest.approx(whole[line["step"]], rel=1e-6), line
    # And the checkpoint it ends with holds the same parameters as the uninterrupted run's.
    for layer in range(SMALL["layers"] + 2):  # gpt: the embedding, the blocks, the head
        got = torch.jit.load(str(tmp_path / "ckpt" / f"layer_{layer}.pt")).state_dict()
        want = torch.jit.load(str(tmp_path / "whole" / f"layer_{layer}.pt")).state_dict()
        assert got.keys() == want.keys()
        for name, tensor in want.items():
            scale = max(tensor.abs().max().item(), 1e-12)
            assert (got[name] - tensor).abs().max().item() / scale <= 1e-6, (layer, name)


def test_used_up_restarts_raise_training_failed_naming_the_rank(tmp_path):
    os.environ.update(PPTRAIN_TEST_CRASH_RANK="0", PPTRAIN_TEST_CRASH_STEP="1")
    try:
        # Rank 0 aborts; its peer may die of the broken connection at the same moment, and the
        # message names the ranks in the order they were found dead.
        with pytest.raises(pptrain.TrainingFailed, match=r"rank 0 was killed by signal 6"
                           r".*\(after 1 restart\)"):
            pptrain.train(**SMALL, steps=2, save=tmp_path / "ckpt", max_restarts=1)
    finally:
        del os.environ["PPTRAIN_TEST_CRASH_RANK"], os.environ["PPTRAIN_TEST_CRASH_STEP"]


def test_bad_keywords_are_one_line_errors_before_any_worker_starts(tmp_path):
    with pytest.raises(pptrain.PipelineError, match="unknown keyword 'batchsize'"):
        pptrain.train(**SMALL, steps=2, batchsize=8)
    with pytest.raises(pptrain.PipelineError, match="steps must be a whole number, got '2'"):
        pptrain.train(**SMALL, steps="2")
    with pytest.raises(pptrain.PipelineError, match="--max-restarts needs --save DIR"):
        pptrain.train(**SMALL, steps=2, max_restarts=1)
    with pytest.raises(pptrain.PipelineError, match="--steps is required"):
        pptrain.train(**SMALL)
