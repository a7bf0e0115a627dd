"""``prune --max-size`` lists its removals in the order it evicts them (issue 54, "Text").

The oracle is the order of real runs under JAX's LRU (``jax_compilation_cache_max_size`` set:
JAX writes an entry's ``-atime`` at its write and at every hit): three runs of the plain program
at three sizes, then the first size again. The least recently used entries are the second
run's, then the third's, then the first's (hit last); the plan's rows, text and JSON, and the
order ``--apply`` removes in, must be that order (they were sorted by key).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.support import hookrun
from tests.support.cli import invoke

pytestmark = pytest.mark.slow

HIT_RE = hookrun.HIT_KEY_RE


def run(cache: Path, size: str) -> set[str]:
    """One run of the plain program at ``size`` under JAX's LRU; the keys JAX says it hit."""
    env = hookrun.base_env(
        cache,
        JAX_LOG_COMPILES="1",
        JAX_COMPILATION_CACHE_MAX_SIZE=str(10**9),  # JAX's LRU on, far from evicting anything
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        CACHEDOCTOR_PLAIN_SIZE=size,
    )
    done = hookrun.run_program("plain", cache, mode="none", env=env)
    return set(HIT_RE.findall(done.stderr + done.stdout))


def order_of_runs(cache: Path) -> list[set[str]]:
    """The entries of each size's run, least recently used first."""
    written = []
    for size in ("16", "24", "32"):
        before = set(hookrun.entries(cache))
        run(cache, size)
        written.append(set(hookrun.entries(cache)) - before)
    assert run(cache, "16") == written[0]  # the first run's entries, hit last
    return [written[1], written[2], written[0]]


def run_of(key: str, runs: list[set[str]]) -> int:
    return next(n for n, keys in enumerate(runs) if key in keys)


def test_max_size_rows_come_in_eviction_order(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    runs = order_of_runs(cache)
    code, out, err = invoke("prune", str(cache), "--max-size", "0", "--json")
    assert code == 0, err
    names = [a["name"] for a in json.loads(out)["actions"] if a["op"] == "remove-entry"]
    assert set(names) == set().union(*runs)
    assert [run_of(k, runs) for k in names] == sorted(run_of(k, runs) for k in names), names

    wide = {**os.environ, "COLUMNS": "400"}
    code, out, err = invoke("prune", str(cache), "--max-size", "0", env=wide)
    assert code == 0, err
    shown = re.findall(r"│ (jit_\w+-[0-9a-f]{12})…", out)  # the table's rows, top to bottom
    assert shown == [k[: len(s)] for k, s in zip(names, shown, strict=True)], out

    # a budget that holds only the entries hit last: the two runs before it go, in order
    budget = sum((cache / f"{k}-cache").stat().st_size for k in runs[2])
    code, out, err = invoke("prune", str(cache), "--max-size", str(budget), "--apply", "--json")
    assert code == 0, err
    done = [a["name"] for a in json.loads(out)["actions"] if a["status"] == "done"]
    assert [run_of(k, runs) for k in done] == [0] * len(runs[0]) + [1] * len(runs[1]), done
    assert run(cache, "16") == runs[2]  # JAX still hits what it used last
