"""The short version of bench/vs_torch_pipelining.py (docs/PERFORMANCE.md): a tiny transformer
on 2 ranks, one round, so that the benchmark keeps running as torch and pptrain change. It times
nothing: it checks that both APIs trained 1F1B with the same losses, that torch's
ScheduleZBVZeroBubble, which fails on Gloo, is named with its error while pptrain's runs, and
that pptrain's step is compared with its simulation, and that `pptrain train` ran both cases on
its own gpt; and that the peaks of both, pptrain with two malloc settings, are measured."""
import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench", "vs_torch_pipelining.py")


def test_the_benchmark_runs_both_apis_and_names_torchs_failure():
    command = [sys.executable, BENCH, "--ranks", "2", "--seq-lens", "16",
               "--schedules", "1F1B,ZBVZeroBubble", "--layers", "4", "--d-model", "32",
               "--heads", "2", "--vocab", "100", "--rounds", "1", "--steps", "2", "--warmup", "1",
               "--timeout", "120"]
    # Its own process group, killed whole if the test fails or times out.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        out, _ = process.communicate(timeout=400)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert process.returncode == 0, out
    rows = {line.split(" | ")[2]: line.split(" | ") for line in out.splitlines()
            if line.startswith("| 2 | 16 |") and line.count(" | ") == 10}
    assert set(rows) == {"1F1B", "ZBVZeroBubble"}, out
    one = rows["1F1B"]
    assert one[5].endswith("x") and one[-1].strip(" |") == "", out  # a ratio, no note
    # Peaks: pptrain with its malloc settings and with glibc's, and torch.
    assert all(part.isdigit() for part in one[9].split(" / ")) and one[9].count(" / ") == 2, out
    zbv = rows["ZBVZeroBubble"]
    assert zbv[4] == "-" and "torch fails: " in zbv[-1], out  # torch named, pptrain measured
    assert float(zbv[3]) > 0, out
    # Where pptrain's step went (its compare_sim()): a simulation of its measured costs for
    # each case, and I's share of ZBVZeroBubble's backward measured, not assumed.
    went = {line.split(" | ")[2]: line.split(" | ") for line in out.splitlines()
            if line.startswith("| 2 | 16 |") and line.count(" | ") == 8}
    assert set(went) == {"1F1B", "ZBVZeroBubble"}, out
    for row in went.values():
        assert float(row[4]) > 0 and float(row[5]) > 0 and 0 < float(row[6]) <= 1.05, out
    assert went["1F1B"][7] == "-" and 0 < float(went["ZBVZeroBubble"][7]) < 1, out
    # `pptrain train` of pptrain's own gpt in the same shape: a figure for each case.
    trained = [line.split(" | ") for line in out.splitlines() if line.startswith("| 2 | 16 |")
               and line.count(" | ") == 7]
    assert {row[2] for row in trained} == {"1F1B", "ZBVZeroBubble"}, out
    for row in trained:
        assert float(row[3]) > 0 and 0 <= float(row[5]) < 1, out
