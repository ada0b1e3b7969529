"""Starting a command for a test: in a process group of its own, killed whole when it outlives
its time, so that no worker outlives the test."""

import os
import signal
import subprocess

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
