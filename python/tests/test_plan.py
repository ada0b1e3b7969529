"""pptrain.plan: the registry's schedules from Python, equal to `pptrain schedule` (figures,
CSV, errors), without torch."""
import inspect
import json
import os
import subprocess
import sys

import pytest

from pptrain import plan

PPTRAIN = os.environ.get("PPTRAIN", "pptrain")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COST = "F=1,I=2,W=1,comm=0.25"


def cli_json(*flags):
    out = subprocess.run([PPTRAIN, "schedule", *flags, "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("name", plan.schedule_names())
def test_every_schedule_equals_the_cli_and_round_trips_through_csv(name, tmp_path):
    s = plan.schedule(name, pp=2, microbatches=4, cost=COST)
    assert s.name == name and s.num_ranks == 2 and s.num_microbatches % 4 == 0
    assert s.simulate() == cli_json("--schedule", name, "--pp", "2", "--microbatches", "4",
                                    "--cost", COST)
    for with_comms in (False, True):
        again = plan.from_csv(s.to_csv(with_comms), name=name, cost=COST)
        assert again.actions(with_comms) == s.actions(with_comms)
        if s.synchronous:  # a file carries no weight rule: it is simulated as synchronous
            assert again.simulate()["makespan"] == s.simulate()["makespan"]
    assert s.svg().startswith("<?xml") and "</svg>" in s.svg()
    assert s.grid().startswith("rank 0 |")


def test_skips_and_solver_options_reach_the_schedule():
    s = plan.schedule("1f1b", pp=4, microbatches=2, skips=[(0, 3)], cost="F=1,comm=0.5,skip=2")
    assert s.skips == [(0, 3)]
    assert "0SEND_F0>3" in s.actions(with_comms=True)[0]
    assert s.simulate()["skips"] == [[0, 3]]
    assert "0SEND_F0>3" in s.to_csv(with_comms=True)
    auto = plan.schedule("zb-auto", pp=4, microbatches=8, memory_limit=4, cost=COST)
    assert auto.simulate() == cli_json("--schedule", "zb-auto", "--pp", "4", "--microbatches",
                                       "8", "--memory-limit", "4", "--cost", COST)


# Vertical sync keeps other weight versions, which the summary shows; ampnet's interval does not
# change the order or the versions, only when a stage steps in training.
@pytest.mark.parametrize("name,keywords,flags,shows", [
    ("pipedream", dict(vertical_sync=True), ["--vertical-sync"], True),
    ("ampnet", dict(update_interval=3), ["--update-interval", "3"], False),
])
def test_family_options_are_keywords_as_the_cli_flags(name, keywords, flags, shows):
    s = plan.schedule(name, pp=4, microbatches=8, **keywords)
    assert s.simulate() == cli_json("--schedule", name, "--pp", "4", "--microbatches", "8",
                                    *flags)
    assert (s.simulate() != plan.schedule(name, pp=4, microbatches=8).simulate()) == shows
    with pytest.raises(ValueError, match=f"{flags[0]} applies to --schedule {name} only, "
                                         "not '1f1b'"):
        plan.schedule("1f1b", pp=4, microbatches=8, **keywords)
    with pytest.raises(ValueError, match="unknown keyword 'no_such_option'"):
        plan.schedule(name, pp=4, microbatches=8, no_such_option=1)


def test_a_cost_as_a_dict_gives_the_figures_of_its_text():
    text = "F=1,I=2,W=1,comm=0.25,skip=0.5,weights=4"
    as_dict = {"F": 1, "I": 2.0, "W": 1, "comm": 0.25, "skip": 0.5, "weights": 4}
    s = plan.schedule("zb-v", pp=2, microbatches=4, cost=text)
    assert s.simulate(as_dict) == s.simulate() == cli_json(
        "--schedule", "zb-v", "--pp", "2", "--microbatches", "4", "--cost", text)
    assert s.simulate({"F": 2}) != s.simulate()
    assert s.trace(as_dict) == s.trace() and s.svg(as_dict) == s.svg()
    assert plan.from_csv(s.to_csv(), cost=as_dict).simulate() == plan.from_csv(
        s.to_csv(), cost=text).simulate()
    # zb-auto places its actions for the cost model: a dict's must be the text's.
    auto = [plan.schedule("zb-auto", pp=4, microbatches=8, memory_limit=4, cost=cost)
            for cost in (COST, dict(F=1, I=2, W=1, comm=0.25))]
    assert auto[0].actions() == auto[1].actions()
    assert auto[0].simulate() == auto[1].simulate()


@pytest.mark.parametrize("cost, message", [
    ({"F": 1, "X": 2}, "cost model: unknown key 'X'"),
    ({"F,I": 1}, "cost model: unknown key 'F,I'"),
    ({1: 1}, "cost model: unknown key 1"),
    ({"comm": "0.1"}, "cost model: value of comm must be a number, got '0.1'"),
    ({"W": None}, "cost model: value of W must be a number, got None"),
    ({"F": True}, "cost model: value of F must be a number, got True"),
    ({"I": -1}, "cost model: value of I must be a finite number >= 0, got '-1'"),
    ({"F": float("inf")}, "cost model: value of F must be a finite number >= 0, got 'inf'"),
    ([("F", 1)], "cost model: expected text such as 'F=1,comm=0.1' or a dict"),
])
def test_a_bad_cost_names_its_key_in_one_line(cost, message):
    s = plan.schedule("1f1b", pp=2, microbatches=2)
    for call in (lambda: s.simulate(cost), lambda: s.svg(cost),
                 lambda: plan.schedule("1f1b", pp=2, microbatches=2, cost=cost),
                 lambda: plan.from_csv(s.to_csv(), cost=cost).simulate()):
        with pytest.raises(plan.PlanError) as error:
            call()
        assert message in str(error.value) and "\n" not in str(error.value)


def test_results_read_as_attributes_and_equal_plain_dicts():
    s = plan.schedule("1f1b", pp=2, microbatches=4, cost=COST)
    result = s.simulate()
    plain = cli_json("--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--cost", COST)
    assert type(plain) is dict and result == plain and plain == result
    assert isinstance(result, dict) and isinstance(result, plan.Result)
    assert result.makespan == plain["makespan"] and result.bubble_ratio == plain["bubble_ratio"]
    assert result.ranks[1].busy == plain["ranks"][1]["busy"]
    assert json.loads(json.dumps(result)) == plain
    with pytest.raises(AttributeError, match="Result has no key 'nope'"):
        result.nope
    assert callable(result.items)  # a dict method's name stays the method


def test_the_package_is_typed():
    folder = os.path.dirname(plan.__file__)
    assert os.path.isfile(os.path.join(folder, "py.typed"))
    assert os.path.isfile(os.path.join(folder, "_plan.pyi"))
    # Every public function, method and property of pptrain.plan has its types (python_types
    # checks them with mypy where it is installed).
    checked = []
    for owner in (plan, plan.Schedule, plan.Result, plan.Plan):
        for name, value in vars(owner).items():
            function = value.fget if isinstance(value, property) else value
            if (name.startswith("_") and name not in ("__init__", "__getattr__") or
                    not inspect.isfunction(function) or function.__module__ != plan.__name__):
                continue
            signature = inspect.signature(function)
            untyped = [p.name for p in signature.parameters.values()
                       if p.name != "self" and p.annotation is inspect.Parameter.empty]
            assert not untyped, f"{owner.__name__}.{name}: no type for {untyped}"
            assert signature.return_annotation is not inspect.Signature.empty, name
            checked.append(name)
    assert {"schedule", "simulate", "plan", "compare", "num_ranks"} <= set(checked)


def test_errors_are_value_errors_with_the_cli_message():
    with pytest.raises(ValueError, match="unknown schedule 'nope'.*1f1b"):
        plan.schedule("nope", pp=2, microbatches=2)
    with pytest.raises(ValueError, match="--dp must be >= 1"):
        plan.schedule("1f1b", pp=2, microbatches=2, dp=0)
    # A backward before its forward: rank, position and action, then the grid.
    with pytest.raises(plan.PlanError) as error:
        plan.from_csv("0F0,0F1,0B0,0B1\n1B0,1F0,1F1,1B1\n")
    assert str(error.value).startswith("rank 1, position 0 (1B0): backward of stage 1 microbatch 0")
    assert "[1B0]" in str(error.value)
    assert isinstance(error.value, plan.ScheduleError)
    assert (error.value.rank, error.value.position) == (1, 0)
    assert error.value.reason.startswith("backward of stage 1 microbatch 0")
    # A CSV whose rank lost a backward.
    with pytest.raises(plan.ScheduleError) as error:
        plan.from_csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1\n")
    assert error.value.rank >= 0 and "1B1" in str(error.value).splitlines()[0]


def test_trace_equals_the_cli_trace(tmp_path):
    out = tmp_path / "zbv.json"
    cli = subprocess.run([PPTRAIN, "schedule", "--schedule", "zb-v", "--pp", "2",
                          "--microbatches", "4", "--cost", COST, "--trace", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    s = plan.schedule("zb-v", pp=2, microbatches=4, cost=COST)
    assert json.loads(s.trace()) == json.loads(out.read_text())


def test_importing_the_planner_loads_no_torch():
    code = "import sys, pptrain.plan; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_example_03_plans_and_writes_a_csv_that_reads_back(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    example = os.path.join(root, "examples", "python", "03_plan_for_torch.py")
    out = tmp_path / "best.csv"
    run = subprocess.run([sys.executable, example, str(out)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert "wrote zb-auto" in run.stdout, run.stdout
    again = plan.from_csv(out.read_text())
    assert again.num_ranks == 4 and again.num_microbatches == 8


def test_the_joint_planner_equals_pptrain_plan(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    profile = os.path.join(root, "data", "pipedream", "vgg16", "graph.txt")
    got = plan.plan(profile, workers=4, batch=16, memory_limit=20e9, top=3,
                    out=tmp_path / "py")
    cli = subprocess.run([PPTRAIN, "plan", "--profile", profile, "--workers", "4", "--batch", "16",
                          "--memory-limit", "20e9", "--top", "3", "--out", str(tmp_path / "cli"),
                          "--json"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert got == json.loads(cli.stdout)
    assert len(got["ranked"]) == 3 and got["winner"] == got["ranked"][0]
    assert got.winner.step_ms == got["winner"]["step_ms"] and got.ranked[2] == got["ranked"][2]
    assert sorted(os.listdir(tmp_path / "py")) == sorted(os.listdir(tmp_path / "cli"))
    # Each ranked candidate's schedule: the plan folder's CSV, simulated under its own costs.
    best = got.schedule()
    assert best.to_csv() == (tmp_path / "py" / "schedule.csv").read_text()
    assert best.simulate()["makespan"] == pytest.approx(got["winner"]["step_ms"], rel=1e-9)
    third = got.schedule(2)
    assert third.simulate()["makespan"] == pytest.approx(got["ranked"][2]["step_ms"], rel=1e-9)
    with pytest.raises(ValueError, match="candidate index must be 0 .. 2, got 3"):
        got.schedule(3)
    with pytest.raises(ValueError, match="workers must be 1 .. 1024, got 0"):
        plan.plan(profile, workers=0)
    with pytest.raises(ValueError, match="asynchronous"):
        plan.plan(profile, workers=2, schedules=["pipedream"])


def test_partitions_equal_pptrain_partition():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    profile = os.path.join(root, "data", "pipedream", "vgg16", "graph.txt")
    for flags, kwargs in ((["--method", "time", "--pp", "4"], dict(method="time", pp=4)),
                          (["--method", "pipedream", "--workers", "4"],
                           dict(method="pipedream", workers=4)),
                          (["--method", "pipedream", "--levels", "2:1e9,2:1e8"],
                           dict(method="pipedream", levels=[(2, 1e9), (2, 1e8)]))):
        cli = subprocess.run([PPTRAIN, "partition", "--profile", profile, *flags, "--json"],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        got = plan.partition(profile, **kwargs)
        assert got == json.loads(cli.stdout)
        assert got.stages[-1].last_layer == got["stages"][-1]["last_layer"]
    with pytest.raises(ValueError, match="--pp"):
        plan.partition(profile, "time")


# A stand-in for `pptrain train` that writes metrics lines in no time: gpipe fails, wpipe is
# refused as an unknown schedule.
STAND_IN = os.path.join(ROOT, "tests", "stand_in_trainer.sh")


def without_timing(compare_json):
    """compare.json without what differs from run to run or between callers: the wall times
    and the command line."""
    out = dict(compare_json, command=None)
    out["reference"] = dict(out["reference"], wall_s=None)
    out["approaches"] = [dict(a, wall_s=None) for a in out["approaches"]]
    return out


def test_compare_equals_pptrain_compare(tmp_path):
    only = "1f1b,PipeDream,gpipe,wpipe"
    lines = []
    got = plan.compare(out=tmp_path / "py", only=only.split(","), pptrain=STAND_IN, steps=4,
                       progress=lines.append)
    assert got == json.loads((tmp_path / "py" / "compare.json").read_text())
    assert [a["status"] for a in got["approaches"]] == [
        "failed: pptrain: error: gpipe broke", "sync", "async", "not built"]
    assert got["command"][:4] == ["pptrain", "compare", "--out", str(tmp_path / "py")]
    assert len(lines) == 5 and lines[4] == f"compare: [5/5] WPipe (wpipe): not built in {STAND_IN}"
    cli = subprocess.run([PPTRAIN, "compare", "--out", str(tmp_path / "cli"), "--only", only,
                          "--pptrain", STAND_IN, "--steps", "4"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    cli_json = json.loads((tmp_path / "cli" / "compare.json").read_text())
    assert without_timing(got) == without_timing(cli_json)
    svg = [(tmp_path / run / "losses.svg").read_text() for run in ("py", "cli")]
    assert svg[0] == svg[1]
    # Without out: the same data, and no folder left behind.
    again = plan.compare(only="DAPPLE", pptrain=STAND_IN, steps=4, loss_at=3)
    assert [a["approach"] for a in again["approaches"]] == ["DAPPLE"]
    assert again["config"]["loss_at"] == 3 and again["approaches"][0]["status"] == "sync"
    assert not os.path.exists(again["command"][3])


def test_compare_errors_are_the_clis(tmp_path):
    with pytest.raises(ValueError, match="--steps must be >= 1, got 0"):
        plan.compare(out=tmp_path, pptrain=sys.executable, steps=0)
    with pytest.raises(ValueError, match="--only: unknown approach 'nosuch'"):
        plan.compare(out=tmp_path, pptrain=sys.executable, only="1f1b,nosuch")
    with pytest.raises(ValueError, match="--pptrain: '/nonexistent' is not an executable file"):
        plan.compare(out=tmp_path, pptrain="/nonexistent")
