"""Gold files for the text of ``scan``, ``diff``, ``prune``, ``check``, ``stats`` and ``lint``
on caches JAX wrote (``tests/support/gold.py`` says what is scrubbed: paths, times, hashes,
versions; everything else is compared). A change of output fails here with a diff; when it is
meant, ``pytest tests/e2e/test_gold.py --update-gold`` rewrites ``tests/gold/``, and the diff of
those files is part of the change.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cachedoctor.core.scan.run import scan_directory
from cachedoctor.storage.location import Location
from tests.support import gold
from tests.support.caches import REPO
from tests.support.cli import invoke
from tests.support.hookrun import recorded_seed_cache
from tests.support.sessioncache import SharedBuilds


@pytest.fixture(autouse=True)
def _no_wrapping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wide enough that no line wraps: where a line breaks would depend on the temp path."""
    monkeypatch.setenv("COLUMNS", "1000")


def test_scrub_keeps_words_and_which_hash_is_which() -> None:
    """What varies goes; what the output says stays, and two different keys stay two."""
    k1, k2 = "ab12" * 16, "cd34" * 16
    text = (
        f"jit_f-{k1} vs jit_f-{k2}: same as jit_f-{k1[:12]}… (sha256 0123456789abcdef…)\n"
        "on disk    7.3 KiB, compiled in 0 s, written 2026-12-01 22:13:05 UTC, 18974 bytes\n"
        f"pointer '139629455046736' in /data/cache/x, a defaced word, 44% of 3\n"
        " module ┃ entries\n━━━━━━━━╇━━━━━━━━━\n"
    )
    assert gold.scrub(text, {"/data/cache": "<CACHE>"}) == (
        "jit_f-<K1> vs jit_f-<K2>: same as jit_f-<K1>… (sha256 <X1>…)\n"
        "on disk  <N> KiB, compiled in <T> s, written <DATE> <TIME> UTC, <N> bytes\n"
        "pointer '<X2>' in <CACHE>/x, a defaced word, 44% of 3\n"
        " module ┃ entries\n━━━╇━━━\n"
    )


@pytest.fixture(scope="module")
def recorded(shared_builds: SharedBuilds) -> Path:
    """The seed program run three times with stats recording (JAX's hits and misses)."""
    return recorded_seed_cache(shared_builds, "gold-recorded")


def _check(
    name: str, argv: list[str], paths: dict[str, str], update: bool, *, anonymous: str = ""
) -> None:
    """``anonymous``: a regex of modules whose keys are one label (``<X>``), and the plan's rows
    compared as a set: which key is which follows the random order of their hashes against the
    order JAX wrote them (rows are sorted by key)."""
    code, out, err = invoke(*argv)
    assert code in (0, 1), err
    shown = " ".join(paths.get(a, a) for a in argv)
    got = gold.scrub(f"$ cachedoctor {shown}\n# exit {code}\n{out}", paths)
    if anonymous:
        got = re.sub(rf"\b({anonymous})-<X\d+>", r"\1-<X>", got)
        lines = got.split("\n")
        rows = [i for i, line in enumerate(lines) if line.startswith(" remove")]
        for i, line in zip(rows, sorted(lines[i] for i in rows), strict=True):
            lines[i] = line
        got = "\n".join(lines)
    problem = gold.compare(name, got, update=update)
    if problem:
        pytest.fail(problem, pytrace=False)


def _jit_f_keys(cache: Path) -> list[str]:
    entries = scan_directory(Location.parse(cache)).entries or ()
    ordered = sorted((e.mtime_ns, e.key) for e in entries if e.module == "jit_f")
    return [key for _, key in ordered]


@pytest.mark.slow
def test_scan(seed_cache: Path, update_gold: bool) -> None:
    _check("scan", ["scan", str(seed_cache)], {str(seed_cache): "<CACHE>"}, update_gold)


@pytest.mark.slow
def test_lint(seed_cache: Path, update_gold: bool) -> None:
    _check("lint", ["lint", str(seed_cache)], {str(seed_cache): "<CACHE>"}, update_gold)


@pytest.mark.slow
def test_diff(seed_cache: Path, update_gold: bool) -> None:
    a, b = _jit_f_keys(seed_cache)[:2]
    paths = {str(seed_cache): "<CACHE>"}
    _check("diff", ["diff", a, b, "--dir", str(seed_cache)], paths, update_gold)
    _check(
        "diff-module", ["diff", "--module", "jit_f", "--dir", str(seed_cache)], paths, update_gold
    )


@pytest.mark.slow
def test_prune(seed_cache: Path, copy_of: Callable[[Path], Path], update_gold: bool) -> None:
    cache = copy_of(seed_cache)  # with the access times JAX left: --duplicates reads them
    paths = {str(cache): "<CACHE>"}
    # a reason names the other copies and the later one: which label each gets depends on
    # how the random hashes sort against the order of the runs
    argv = ["prune", str(cache), "--duplicates", "--orphans"]
    _check("prune", argv, paths, update_gold, anonymous="jit_f")
    # every entry goes: which of several goes first depends on mtimes JAX may write alike
    argv = ["prune", str(cache), "--max-size", "1KiB"]
    _check("prune-size", argv, paths, update_gold, anonymous=r"jit_\w+")


@pytest.mark.slow
def test_check(update_gold: bool) -> None:
    argv = ["check", "--quiet", "--", sys.executable, "-m", "cachedoctor.programs.seed"]
    _check("check", argv, {sys.executable: "<PYTHON>", str(REPO): "<REPO>"}, update_gold)


@pytest.mark.slow
def test_stats(recorded: Path, update_gold: bool) -> None:
    _check("stats", ["stats", str(recorded)], {str(recorded): "<CACHE>"}, update_gold)
