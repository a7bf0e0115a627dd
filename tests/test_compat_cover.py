"""The compat sessions' pairwise cover (tools/compat_cover.py, issue 55): over the releases
between the oldest and the newest, every release runs every cache scheme and every hook mode,
and every (scheme, mode) pair the probes hold runs on at least one of them. The pairs are
counted here from the node ids' own parameters and the probe table's modes, release by release.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from collections.abc import Iterator

import pytest

from tests.support.caches import REPO

MIDDLE = ["0.6.2", "0.8.3", "0.10.2"]


@pytest.fixture(scope="module")
def compat_cover() -> Iterator[types.ModuleType]:
    """tools/compat_cover.py as noxfile.py imports it (its dataclass needs a module to live in)."""
    with pytest.MonkeyPatch.context() as m:
        m.syspath_prepend(str(REPO / "tools"))
        yield importlib.import_module("compat_cover")


def _pairs_run(
    compat_cover: types.ModuleType, chosen: dict[str, list[str]]
) -> set[tuple[str, str]]:
    """(release, scheme), (release, mode) and (scheme, mode) for every probe each release runs."""
    by_test = {p.test: p for p in compat_cover.PROBES}
    found: set[tuple[str, str]] = set()
    for release, tests in chosen.items():
        for test in tests:
            probe = by_test[test]
            param = test.rpartition("[")[2].rstrip("]") if "[" in test else None
            if param in compat_cover.SCHEMES:  # the test's own parameter says its scheme
                assert param == probe.scheme, test
            elif param is not None:  # or its mode
                assert param in probe.modes, test
            found.add((release, probe.scheme))
            for mode in probe.modes:
                found |= {(release, mode), (probe.scheme, mode)}
    return found


def test_every_release_meets_every_scheme_and_mode_and_every_pair_runs(
    compat_cover: types.ModuleType,
) -> None:
    chosen = compat_cover.cover(MIDDLE)
    assert sorted(chosen) == sorted(MIDDLE)  # no release left out
    found = _pairs_run(compat_cover, chosen)
    schemes, modes = compat_cover.SCHEMES, compat_cover.MODES
    assert {(r, s) for r in MIDDLE for s in schemes} <= found
    assert {(r, m) for r in MIDDLE for m in modes} <= found
    in_table = {pair for p in compat_cover.PROBES for pair in p.pairs()}
    assert {("local", m) for m in modes} | {("s3", "stats"), ("gs", "stable")} <= in_table
    assert in_table <= found
    # a pair is only added once: no release runs a probe twice
    assert all(len(tests) == len(set(tests)) for tests in chosen.values())


def test_a_single_release_between_still_runs_every_pair(compat_cover: types.ModuleType) -> None:
    (tests,) = compat_cover.cover(["0.8.3"]).values()
    found = _pairs_run(compat_cover, {"0.8.3": tests})
    assert {pair for p in compat_cover.PROBES for pair in p.pairs()} <= found


@pytest.mark.slow  # pytest collecting the hook suites in a subprocess (no JAX process runs)
def test_every_probe_is_a_test_of_a_hook_suite_compat_runs(compat_cover: types.ModuleType) -> None:
    files = sorted({p.test.split("::")[0] for p in compat_cover.PROBES})
    noxfile = (REPO / "noxfile.py").read_text()
    assert all(f'"{f}"' in noxfile for f in files), files  # in COMPAT_HOOK_SUITES
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run([*argv, *files], cwd=REPO, capture_output=True, text=True)
    collected = set(done.stdout.split())
    assert done.returncode == 0, done.stdout[-2000:]
    missing = [p.test for p in compat_cover.PROBES if p.test not in collected]
    assert not missing
