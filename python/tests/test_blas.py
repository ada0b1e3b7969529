"""`import pptrain` and OpenBLAS's kernels: chosen before torch loads them, kept when the user set
them, and one warning line when torch came first. Each case is a fresh interpreter, with
OPENBLAS_VERBOSE=2 so that OpenBLAS itself says which kernels it loaded ("Core: X")."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

# A product through torch, so that OpenBLAS is used (it is loaded with torch either way).
PRODUCT = "import torch; torch.mm(torch.ones(64, 64), torch.ones(64, 64))"


def python(code, **settings):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "PPTRAIN_BLAS", "PPTRAIN_BLAS_CHOICE",
                        "PPTRAIN_BLAS_TEST_DETECTED")}
    env.update(OPENBLAS_VERBOSE="2", **settings)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    cores = [line[len("Core: "):] for line in lines if line.startswith("Core: ")]
    said = [line for line in lines if line.startswith("pptrain: ")]
    return cores, said


def test_imported_first_it_replaces_the_kernels_of_a_cpu_openblas_does_not_know():
    # OpenBLAS's own choice played by the tests' stand-in: Prescott, as on the issue's Xeon.
    cores, said = python("import pptrain; " + PRODUCT, OPENBLAS_CORETYPE="Prescott",
                         PPTRAIN_BLAS_TEST_DETECTED="Prescott")
    assert len(cores) == 1 and cores[0] != "Prescott", cores
    assert len(said) == 1 and said[0].startswith("pptrain: BLAS: OpenBLAS "), said
    assert f" with {cores[0]} kernels, chosen by pptrain for this CPU and checked (OpenBLAS's " \
           "own choice: Prescott; " in said[0], said
    assert said[0].endswith("PPTRAIN_BLAS=system keeps it)"), said


def test_a_users_setting_and_system_are_kept_silently():
    code = "import pptrain; " + PRODUCT
    assert python(code, OPENBLAS_CORETYPE="Prescott") == (["Prescott"], [])
    assert python(code, OPENBLAS_CORETYPE="Prescott", PPTRAIN_BLAS_TEST_DETECTED="Prescott",
                  PPTRAIN_BLAS="system") == (["Prescott"], [])


def test_imported_after_torch_it_says_how_in_one_line():
    cores, said = python(PRODUCT + "; import pptrain", OPENBLAS_CORETYPE="Prescott",
                         PPTRAIN_BLAS_TEST_DETECTED="Prescott")
    assert cores == ["Prescott"]
    assert len(said) == 1 and said[0].startswith("pptrain: warning: OpenBLAS was loaded before "
                                                 "pptrain"), said
    assert "import pptrain before torch" in said[0]


def test_a_bad_setting_is_one_line():
    env = dict(os.environ, PPTRAIN_BLAS="fast")
    out = subprocess.run([sys.executable, "-c", "import pptrain"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode != 0
    assert out.stderr.splitlines()[-1] == ("pptrain._plan.PlanError: PPTRAIN_BLAS must be "
                                           "'pptrain' or 'system', got 'fast'")
