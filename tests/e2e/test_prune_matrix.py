"""Trust III: ``prune`` never deletes what JAX uses, proved by JAX's own hits.

Every population teams mix writes one cache (``tests/support/prunematrix.py``: plain, the hook
in stable, observe and stats mode, JAX's pointer flag plain and observed, JAX's LRU, a second
JAX). Each cell takes one state of that cache's history (``written``, ``read``: each population
read what it wrote, ``reread``: read again 70 s after the first read), copies it (hard links and
times kept) to the path every run uses, runs one ``prune`` selector (alone, narrowed by
``--module``, or a pair) or ``rekey --relocated`` with ``--apply`` through one spelling of that
path (``abs``; ``rel``: the folder's name typed in its parent; ``link``: a symbolic link to it;
``slash``: with a trailing slash), and reruns every population on what it left. The oracle is
JAX's log: each population hits exactly the keys its rerun of the unpruned state hit
(``test_prune_keeps_what_jax_hits[<cell>-<population>]``), and no entry the command removed is
one an unpruned rerun hit (``[<cell>-removed]``).

Values that depend on the state: ``--older-than`` is the age of the state's last round plus
30 s (under the 70 s to the round before: what the last round used must stay, the issue's
``--older-than 1m``); ``--max-size`` is ``fit``, the entries' bytes with each file counted once
(nothing needs to go), or ``recent``, the bytes of the entries the last round hit or wrote
(only what runs no longer use may go).

The default cells cover each failure of the issue and each selector once; the whole matrix
(every selector alone, narrowed and in pairs, x 4 spellings x 3 states) is collected with
``CACHEDOCTOR_PRUNE_MATRIX=full``, its extra cells marked ``matrix_full``. One cell, every
population: ``pytest tests/e2e/test_prune_matrix.py -k duplicates-abs-written``; one population
of it: ``-k duplicates-abs-written-flag``. The second JAX comes from
``CACHEDOCTOR_OTHER_JAX_PYTHON`` (the test setup builds it: tests/support/otherjax.py; by hand:
``python3.11 -m venv V && V/bin/pip install jax==0.8.3 jaxlib==0.8.3``).
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support import prunematrix as pm
from tests.support import sessioncache
from tests.support.caches import CROSSVER_SKIP, read_noatime
from tests.support.cli import invoke

pytestmark = pytest.mark.slow

FULL_ENV = "CACHEDOCTOR_PRUNE_MATRIX"
MODULE = ("--module", "jit_[fi]*")  # jit_f (a pointer in plain keys) and jit_iota (adopted)

SELECTORS: dict[str, tuple[str, ...]] = {
    "older-than": ("prune", "--older-than", "AGE"),
    "max-size-fit": ("prune", "--max-size", "FIT"),
    "max-size-recent": ("prune", "--max-size", "RECENT"),
    "duplicates": ("prune", "--duplicates"),
    "corrupt": ("prune", "--corrupt"),
    "orphans": ("prune", "--orphans", "--stale-after", "0s"),
    "relocated": ("prune", "--relocated"),
    "stale-jax": ("prune", "--stale-jax"),
    "repair": ("prune", "--repair"),
    "xla-subcaches": ("prune", "--xla-subcaches"),
    "rekey-relocated": ("rekey", "--relocated"),
}
SPELLINGS = ("abs", "rel", "link", "slash")

# (selector, spelling, timing): each failure of the issue, each selector, spelling and state
DEFAULT = {
    ("duplicates", "abs", "written"),  # 2: the flag populations' key, a plain writer later
    ("duplicates", "abs", "reread"),
    ("older-than", "abs", "reread"),  # 1: the relatime access time of the first read
    ("older-than", "abs", "read"),
    ("max-size-fit", "abs", "written"),  # 5: a hard-linked entry counted twice
    ("max-size-recent", "abs", "reread"),  # 1, by --max-size's order
    ("relocated", "abs", "read"),
    ("relocated", "rel", "read"),  # 3: another spelling of the same folder
    ("relocated", "link", "written"),
    ("relocated", "slash", "reread"),
    ("rekey-relocated", "rel", "read"),  # 3
    ("rekey-relocated", "abs", "written"),
    ("stale-jax", "abs", "read"),  # 4: the second JAX's entries
    ("corrupt", "abs", "read"),
    ("orphans", "abs", "reread"),
    ("repair", "abs", "written"),
    ("xla-subcaches", "abs", "read"),
    ("duplicates+module", "abs", "written"),
    # Trust IV: --module with a selector that removes no entry selected every matching entry
    ("repair+module", "abs", "written"),
    ("orphans+module", "abs", "reread"),
    ("xla-subcaches+module", "abs", "read"),
    # issue 54: --module with every selector (the state where the selector alone is tested)
    ("older-than+module", "abs", "reread"),
    ("max-size-fit+module", "abs", "written"),
    ("max-size-recent+module", "abs", "reread"),
    ("corrupt+module", "abs", "read"),
    ("relocated+module", "abs", "read"),
    ("stale-jax+module", "abs", "read"),
    ("older-than+duplicates", "abs", "reread"),
}


def commands() -> dict[str, tuple[str, ...]]:
    """Every selector alone, each prune selector narrowed by --module, and each pair."""
    out = dict(SELECTORS)
    prune = [s for s, c in SELECTORS.items() if c[0] == "prune"]
    for s in prune:
        out[f"{s}+module"] = (*SELECTORS[s], *MODULE)
    for a, b in itertools.combinations([s for s in prune if s != "max-size-fit"], 2):
        out[f"{a}+{b}"] = (*SELECTORS[a], *SELECTORS[b][1:])
    return out


def cells() -> list[Any]:
    full = os.environ.get(FULL_ENV) == "full"
    out = []
    for (selector, command), spelling, timing in itertools.product(
        commands().items(), SPELLINGS, pm.TIMINGS
    ):
        default = (selector, spelling, timing) in DEFAULT
        if not (default or full):
            continue
        cell = pm.Cell(selector, command, spelling, timing)
        for who in (*pm.POPULATION_NAMES, "removed"):
            marks = [] if default else [pytest.mark.matrix_full]
            out.append(pytest.param(cell, who, id=f"{cell.id}-{who}", marks=marks))
    return out


Matrix = pm.Matrix


@pytest.fixture(scope="session")
def matrix(
    tmp_path_factory: pytest.TempPathFactory, shared_builds: sessioncache.SharedBuilds
) -> Matrix:
    return pm.open_matrix(tmp_path_factory, shared_builds)


def test_the_history_holds_what_the_issue_names(matrix: Matrix) -> None:
    """The premises of the cells: each population hits in every rerun, the stable hook shares
    a plain entry's file (a hard link), JAX's LRU keeps -atime files, a plain process wrote
    jit_f after the flag populations, and the reread state's first read is 70 s old."""
    _root, kept, _live, built = matrix
    for timing, reruns in built.baseline.items():
        for name, outcome in reruns.items():
            assert outcome["rc"] == 0 and outcome["hits"], (timing, name, outcome)
        assert "jit_f" in {m for m, _k in reruns["plain"]["misses"]}  # a new pointer key
    for timing in pm.TIMINGS:
        state = kept / timing
        assert any(p.stat().st_nlink > 1 for p in state.glob("*-cache")), timing
        assert list(state.glob("*-atime")) and (state / ".lockfile").exists()
    written = kept / "written"
    flag_keys = {k for _m, k in built.baseline["written"]["flag"]["hits"] if k.startswith("jit_f")}
    jit_f = sorted(written.glob("jit_f-*-cache"), key=lambda p: p.stat().st_mtime_ns)
    assert flag_keys and jit_f[-1].name[: -len("-cache")] not in flag_keys
    # the flag populations' key, read in every round: its access time is the first read's
    (flag_key,) = flag_keys
    first_read = (kept / "reread" / f"{flag_key}-cache").stat().st_atime
    assert built.round_start["reread"] - first_read > pm.REREAD_AFTER_S


@pytest.mark.parametrize(("cell", "who"), cells())
def test_prune_keeps_what_jax_hits(matrix: Matrix, cell: pm.Cell, who: str) -> None:
    root, kept, live, built = matrix
    if who not in built.populations and who != "removed":
        pytest.skip(CROSSVER_SKIP)
    result = pm.cell_result(cell, root, kept, live, built)
    said = f"`{' '.join(result['argv'])}`" + (f" in {result['cwd']}" if result["cwd"] else "")
    reasons = {a["name"]: f"{a['rule']}: {a['reason']}" for a in result["actions"]}
    baseline = built.baseline[cell.timing]
    if who == "removed":
        assert result["code"] == 0, f"{said} exited {result['code']}: {result['err']}"
        hit: dict[str, list[str]] = {}
        for name, outcome in baseline.items():
            for k in pm.hit_keys(outcome):
                hit.setdefault(k, []).append(name)
        wrong = {
            k: f"{', '.join(hit[k])} hit it; {reasons.get(k, 'not in the plan')}"
            for k in result["removed"]
            if k in hit
        }
        assert not wrong, f"{said} removed {len(wrong)} entries a rerun hits: {wrong}"
        return
    after = result["reruns"][who]
    assert after["rc"] == 0, f"{who} failed after {said}: {after['tail']}"
    before_hits, after_hits = pm.hit_keys(baseline[who]), pm.hit_keys(after)
    lost = sorted(set(before_hits) - set(after_hits))
    why = {k: reasons.get(k, "not removed by the plan") for k in lost}
    assert after_hits == before_hits, (
        f"{who} hit {len(after_hits)} keys after {said}, {len(before_hits)} without it; lost: {why}"
    )


# --- --module narrows every selector: a state that holds something for each one to take ------

PATTERN = MODULE[1]
LITTERED: dict[str, tuple[str, ...]] = {
    "older-than": ("--older-than", "1d"),  # every time is 10 days old
    "max-size": ("--max-size", "1"),
    "duplicates": ("--duplicates",),
    "corrupt": ("--corrupt",),
    "orphans": ("--orphans", "--stale-after", "0s"),
    "relocated": ("--relocated",),
    "stale-jax": ("--stale-jax",),
    "stale-jax-in-use": ("--stale-jax-in-use",),
    "repair": ("--repair",),
    "xla-subcaches": ("--xla-subcaches",),
}
# the selectors that, alone, act on something outside the pattern in the littered state (the
# narrowing has something to keep); the second JAX's entries only where it ran
TAKES_OUTSIDE = {"older-than", "max-size", "corrupt", "orphans", "repair", "xla-subcaches"}
OWN_LOCK = ".cachedoctor-lock"  # cachedoctor's own lock, taken before it changes anything
KEY_NAMED = re.compile(r"(.+)-[0-9a-f]{64}(?:-cache|-atime|\.[A-Za-z0-9.]+)?")


def module_named(path: str) -> str | None:
    """The module a file's name names, as JAX names it (``<module>-<sha256 hex>-cache``; the
    ``-atime`` file and the key manifests carry the key), or None: it names no module."""
    found = KEY_NAMED.fullmatch(os.path.basename(path))
    return found.group(1) if found else None


def littered(kept: Path, at: Path) -> Path:
    """The ``reread`` state with something for every selector to take, inside the pattern and
    outside it: an entry cut short in ``jit_iota`` and ``jit__multi_slice`` (JAX cannot load
    it), an ``-atime`` file whose entry went in ``jit_iota`` and ``jit_g``, a key manifest whose
    entry went in ``jit_f`` and ``jit__multi_slice``, a stale temp file and XLA's autotune
    sub-cache (they name no module), and every time 10 days old."""
    pm.copy_tree(kept / "reread", at)
    keys = sorted(p.name[: -len("-cache")] for p in at.glob("*-cache"))
    with_atime = sorted(p.name[: -len("-atime")] for p in at.glob("*-atime"))
    manifested = sorted(p.stem for p in (at / "cachedoctor-manifests").glob("*.json"))

    def first(module: str, among: list[str], avoid: set[str]) -> str:
        return next(k for k in among if module_named(k) == module and k not in avoid)

    gone = {first(m, with_atime, set()) for m in ("jit_iota", "jit_g")}
    gone |= {
        first(m, [k for k in manifested if k in keys], gone) for m in ("jit_f", "jit__multi_slice")
    }
    for key in gone:
        (at / f"{key}-cache").unlink()
    for module in ("jit_iota", "jit__multi_slice"):
        cut = at / f"{first(module, keys, gone | set(with_atime))}-cache"
        cut.write_bytes(read_noatime(cut)[: cut.stat().st_size // 2])
    (at / "tmp.littered").write_bytes(b"half a write")
    sub = at / "xla_gpu_per_fusion_autotune_cache_dir"
    sub.mkdir()
    (sub / f"{'A' * 43}.textproto").write_text("run_time { nanos: 5 }\n")
    pm.shift_times(at, -10 * 86400)
    return at


@pytest.mark.parametrize("selector", sorted(LITTERED))
def test_module_narrows_every_selector(matrix: Matrix, tmp_path: Path, selector: str) -> None:
    """Issue 54: ``--module PATTERN`` with any selector changes nothing outside the pattern
    (a file whose name names no module, a temp file or XLA's sub-cache, is kept) and removes no
    entry the selector alone would not (``--max-size`` apart: it evicts among the matching
    modules until the cache fits). The oracle is the names JAX gave the files. Before the fix,
    ``--repair``, ``--orphans`` and ``--xla-subcaches`` with ``--module`` removed every entry of
    the matching modules, and the stale temp file, an orphan manifest outside the pattern and
    the sub-cache with them."""
    _root, kept, _live, built = matrix
    cache = littered(kept, tmp_path / "cache")
    args = ("prune", str(cache), *LITTERED[selector])
    code, out, err = invoke(*args, "--json")
    assert code == 0, err
    plan = json.loads(out)["actions"]
    alone = {a["name"] for a in plan if a["op"] == "remove-entry"}
    takes_outside = sorted(
        a["name"] for a in plan if not fnmatch.fnmatchcase(module_named(a["name"]) or "", PATTERN)
    )
    if selector in TAKES_OUTSIDE or (
        selector == "stale-jax-in-use" and "jax083" in built.populations
    ):
        assert takes_outside, (
            f"the premise: `{' '.join(args)}` alone takes something outside {PATTERN}"
        )
    before = pm.contents(cache)
    code, out, err = invoke(*args, *MODULE, "--apply", "--json")
    assert code == 0, err
    after = pm.contents(cache)
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    outside = [
        p
        for p in changed
        if p != OWN_LOCK and not fnmatch.fnmatchcase(module_named(p) or "", PATTERN)
    ]
    said = f"`{' '.join(args)} {' '.join(MODULE)} --apply`"
    assert not outside, f"{said} changed {len(outside)} paths outside {PATTERN}: {outside[:6]}"
    removed = {p[: -len("-cache")] for p in changed if p.endswith("-cache") and p not in after}
    if selector != "max-size":
        wider = sorted(removed - alone)
        assert not wider, (
            f"{said} removed {len(wider)} entries the selector alone keeps: {wider[:6]}"
        )
