"""`preflight` and the matmul precision (issue 54, "Predictions/advice"): a program with no dot
is not "cannot tell" when only ``jax_default_matmul_precision`` differs, and a forecast whose
record was kept does not ask to record it. JAX is the oracle: the program then runs at that
precision, and its log says which modules hit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cachedoctor.core.why import ENABLE_HINT
from tests.support.caches import SUPPORT_DIR
from tests.support.hookrun import base_env
from tests.support.keylog import hits, run_logged

pytestmark = pytest.mark.slow  # JAX and the CLI in subprocesses

PROGRAM = SUPPORT_DIR / "precision_program.py"
HIGHEST = {"JAX_DEFAULT_MATMUL_PRECISION": "highest"}


def preflight(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`cachedoctor preflight` where the job runs at the highest matmul precision."""
    proc = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "preflight", str(cache), *args],
        capture_output=True,
        text=True,
        env=base_env(cache, CACHEDOCTOR_HOOK="stats", **HIGHEST),
        timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return proc


def verdicts(cache: Path) -> dict[str, dict[str, Any]]:
    doc = json.loads(preflight(cache, "--json").stdout)
    return {m["module"]: m for m in doc["modules"]}


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    """The program run once with the stats hook at JAX's default precision (each test its own:
    JAX's run at another precision writes to it)."""
    cache = tmp_path / "cache"
    run_logged(cache, program=PROGRAM)
    return cache


def test_a_program_without_a_dot_is_predicted_as_jax_treats_it(recorded: Path) -> None:
    """The precision reaches only dots and convolutions: JAX hits the program without one, and
    misses the one whose dot XLA rewrote into a multiply and a reduce (its stored module has no
    dot instruction; JAX's op name on the reduce says where it came from)."""
    said = verdicts(recorded)
    assert said["jit_plain_math"]["verdict"] == "hit", said["jit_plain_math"]
    assert "no dot, convolution or custom call" in said["jit_plain_math"]["words"]
    assert said["jit_vector_dot"]["verdict"] == "unknown", said["jit_vector_dot"]
    jax_hit = hits(run_logged(recorded, program=PROGRAM, env=HIGHEST))
    assert "jit_plain_math" in jax_hit
    assert "jit_vector_dot" not in jax_hit


def test_the_record_hint_only_where_a_record_would_tell(recorded: Path, tmp_path: Path) -> None:
    """ "Cannot tell" for the precision rests on the record: the hint to record misses is not
    given (followed, it changes nothing: the processes already record). An entry with no record
    at all still gets it."""
    proc = preflight(recorded)
    assert "cannot tell" in proc.stdout, proc.stdout
    assert ENABLE_HINT not in proc.stdout, proc.stdout
    assert json.loads(preflight(recorded, "--json").stdout)["hint"] is None

    unrecorded = tmp_path / "unrecorded"
    run_logged(unrecorded, hook=None, program=PROGRAM)  # no hook: no record of any key
    proc = preflight(unrecorded)
    assert ENABLE_HINT in proc.stdout, proc.stdout
    assert json.loads(preflight(unrecorded, "--json").stdout)["hint"] == ENABLE_HINT
