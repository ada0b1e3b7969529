"""Starting a command for a test: in a process group of its own, killed whole when it outlives
its time, so that no worker outlives the test."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest


def run(command, timeout=240, env=None, hang_fails=True):
    """Runs `command` in a process group of its own, killed whole if it outlives `timeout`;
    returns (exit status, stdout, stderr). A command killed so fails the test, or with
    hang_fails=False returns None for its status, with what it wrote until then."""
    env = dict(os.environ if env is None else env, PPTRAIN_COMM_TIMEOUT_S="20")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        if hang_fails:
            pytest.fail(f"{' '.join(command)} did not finish in {timeout} s")
        return None, out, err
    return process.returncode, out, err


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc, *program):
    """The command that starts `program` (a script and its arguments) on `nproc` ranks of this
    host with torchrun, meeting at a free port."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *program]


def case_results(out, cases, nproc, code, err, who):
    """What the ranks of a launch wrote for each case (OUT.<case>.<rank>.json, a list by rank),
    or for a case some rank wrote nothing for, a string saying that `who`'s launch exited with
    `code` before it, with the end of its stderr `err`."""
    results = {}
    for case in cases:
        paths = [f"{out}.{case}.{rank}.json" for rank in range(nproc)]
        if all(os.path.exists(p) for p in paths):
            results[case] = [json.load(open(p)) for p in paths]
        else:
            results[case] = f"{who}'s launch exited with {code} before {case}:\n{err[-4000:]}"
    return results
