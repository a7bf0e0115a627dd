"""JAX is the oracle: a corpus of real programs, run twice in fresh processes against one cache.

The second run's log lines are the truth: ``Persistent compilation cache hit for 'm' with key
'k'`` (``JAX_LOG_COMPILES=1``), ``PERSISTENT COMPILATION CACHE MISS`` and ``Not writing
persistent cache entry for 'm' because it uses host callbacks`` (``JAX_EXPLAIN_CACHE_MISSES=1``).
Every entry JAX hits must decode cleanly, get no verdict that says it is useless, and survive
every prune selector; every module JAX misses must have a finding that names why.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cachedoctor.cache.jaxenv import installed_jax
from cachedoctor.core.check.check import run_check
from cachedoctor.core.check.runner import program_env, run_command
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.core.prune.planner import plan_prune
from cachedoctor.core.scan.report import ScanReport
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.storage.location import Location
from tests.support.caches import SUPPORT_DIR, entries_of
from tests.support.sessioncache import SharedBuilds

CORPUS = SUPPORT_DIR / "oracle_corpus.py"
HIT_RE = re.compile(r"Persistent compilation cache hit for '([^']+)' with key '([^']+)'")
MISS_RE = re.compile(r"PERSISTENT COMPILATION CACHE MISS for '([^']+)' with key '([^']+)'")
NOT_STORED_RE = re.compile(r"Not writing persistent cache entry for '([^']+)' because it uses host")
USELESS = {FindingKind.CORRUPT, FindingKind.UNSTABLE_KEY, FindingKind.RELOCATED}

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Truth:
    cache: Path
    hits: dict[str, str]  # key -> module, hit by the second run
    misses: dict[str, str]  # key -> module, missed by the second run
    not_stored: frozenset[str]  # modules JAX refused to store (host callbacks)


def run_twice(cache: Path, argv: list[str], cwd_env: dict[str, str] | None = None) -> str:
    """Run ``argv`` twice in fresh interpreters against ``cache``; the second run's log."""
    env = program_env(str(cache), {"JAX_LOG_COMPILES": "1", "JAX_EXPLAIN_CACHE_MISSES": "1"})
    env.update(cwd_env or {})
    logs = []
    for _ in range(2):
        run = run_command(argv, env)
        assert run.returncode == 0, run.stderr[-3000:]
        logs.append(run.stdout + run.stderr)
    return logs[1]


def truth_of(cache: Path, log: str) -> Truth:
    return Truth(
        cache,
        hits={k: m for m, k in HIT_RE.findall(log)},
        misses={k: m for m, k in MISS_RE.findall(log)},
        not_stored=frozenset(NOT_STORED_RE.findall(log)),
    )


@pytest.fixture(scope="module")
def corpus(shared_builds: SharedBuilds) -> Truth:
    def make(root: Path) -> Truth:
        cache = root / "cache"
        cache.mkdir()
        return truth_of(cache, run_twice(cache, [sys.executable, str(CORPUS)]))

    _, truth = shared_builds("oracle", make, CORPUS.read_text())
    assert isinstance(truth, Truth)
    return truth


def assert_agrees_with_jax(truth: Truth, report: ScanReport) -> None:
    entries = {e.key: e for e in entries_of(report)}
    for key in truth.hits:
        assert key in entries, f"JAX hit {key}, scan does not list it"
        assert entries[key].ok, (key, entries[key].problems)
    for f in report.findings:
        if f.kind in USELESS:
            assert not set(f.entries) & set(truth.hits), f
    everything = PruneOptions(duplicates=True, corrupt=True, relocated=True, stale_jax=True)
    plan = plan_prune(Location.parse(str(truth.cache)), everything)
    removed = {a.name.removesuffix("-cache") for a in plan.actions}
    assert not removed & set(truth.hits), [a for a in plan.actions if a.name[:-6] in truth.hits]


def test_jax_hits_are_never_condemned(corpus: Truth) -> None:
    assert len(corpus.hits) >= 40, "the corpus compiles dozens of modules"
    assert_agrees_with_jax(
        corpus, scan_directory(Location.parse(str(corpus.cache)), use_index=False)
    )


def test_every_miss_is_explained(corpus: Truth) -> None:
    """Only host-callback modules miss here: JAX says so, and so must cachedoctor."""
    assert corpus.not_stored >= {"jit_with_callbacks", "jit_solve"}
    assert set(corpus.misses.values()) <= corpus.not_stored


def test_relative_cache_dir_is_judged_as_spelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JAX_COMPILATION_CACHE_DIR=.jax_cache: JAX hits from the same working directory, so a scan
    with that spelling there must not call the entries relocated; a scan by the absolute path is
    judged for that spelling, with which JAX hashes another string and misses (see
    test_relocated_spelling.py), and says so."""
    work = tmp_path / "work"
    work.mkdir()
    argv = [
        sys.executable,
        "-c",
        f"import os, runpy; os.chdir({str(work)!r}); "
        "runpy.run_module('cachedoctor.programs.plain', run_name='__main__')",
    ]
    log = run_twice(Path(".jax_cache"), argv)
    monkeypatch.chdir(work)
    truth = truth_of(Path(".jax_cache"), log)
    assert truth.hits and not truth.misses
    report = scan_directory(Location.parse(".jax_cache"), use_index=False)
    assert not [f for f in report.findings if f.kind is FindingKind.RELOCATED]
    assert_agrees_with_jax(truth, report)
    if installed_jax().hashes_autotune_dir:
        absolute = scan_directory(Location.parse(str(work / ".jax_cache")), use_index=False)
        (relocated,) = [f for f in absolute.findings if f.kind is FindingKind.RELOCATED]
        assert set(relocated.entries) == set(truth.hits)
        assert "written for a cache spelled .jax_cache;" in relocated.message


def test_symlinked_cache_is_relocated(tmp_path: Path) -> None:
    """Through a symbolic link JAX misses: the path it hashes is spelled differently."""
    real = tmp_path / "real"
    link = tmp_path / "link"
    argv = [sys.executable, "-m", "cachedoctor.programs.plain"]
    run_twice(real, argv)
    written_at_real = {p.name.removesuffix("-cache") for p in real.glob("*-cache")}
    link.symlink_to(real)
    truth = truth_of(link, run_twice(link, argv))
    assert truth.hits and not set(truth.hits) & written_at_real  # JAX: the old ones never hit
    report = scan_directory(Location.parse(str(link)), use_index=False)
    (relocated,) = [f for f in report.findings if f.kind is FindingKind.RELOCATED]
    assert set(relocated.entries) == written_at_real
    assert_agrees_with_jax(truth, report)


HOST_CALLBACKS = """
import jax, jax.numpy as jnp, numpy as np
@jax.jit
def noisy(a):
    jax.debug.print("sum={s}", s=a.sum())
    return a * 2
@jax.jit
def quiet(a):
    return a + 1
print(noisy(jnp.ones(3)), quiet(jnp.ones(3)))
"""


def test_check_names_modules_jax_never_stores(tmp_path: Path) -> None:
    """JAX refuses to store a module with a host callback; check says so instead of 'all hit'."""
    script = tmp_path / "callbacks.py"
    script.write_text(HOST_CALLBACKS)
    env = {
        k: v for k, v in program_env(str(tmp_path / "unused")).items() if k.startswith(("P", "H"))
    }
    env["JAX_PLATFORMS"] = "cpu"
    report = run_check([sys.executable, str(script)], base_env=env)
    assert report.not_stored == ("jit_noisy",)
    assert "jit_quiet" in report.modules and "jit_noisy" not in report.modules
    assert "not stored by JAX, so compiled afresh every run: jit_noisy" in report.summary_line()
    (why,) = report.refused  # JAX's reason, from the hook's records, its line quoted
    assert why.kind == "host-callbacks" and why.source == "stats records"
    assert why.jax_log is not None and set(NOT_STORED_RE.findall(why.jax_log)) == {"jit_noisy"}


def test_scan_names_modules_jax_never_stores_and_manifests_do_not_churn(tmp_path: Path) -> None:
    """Observe manifests record modules JAX refuses to store; scan reports them, runs keep them."""
    from tests.support.hookrun import base_env
    from tests.support.hookrun import run_program as run_hooked

    script = tmp_path / "callbacks.py"
    script.write_text(HOST_CALLBACKS)
    cache = tmp_path / "cache"
    env = base_env(
        cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    run_hooked(script, cache, mode="observe", env=env)
    manifests = {p.name: p.stat().st_mtime_ns for p in cache.glob("cachedoctor-manifests/*.json")}
    report = scan_directory(Location.parse(str(cache)), use_index=False)
    (not_stored,) = [f for f in report.findings if f.kind is FindingKind.NOT_STORED]
    assert "jit_noisy" in not_stored.message and "jit_quiet" not in not_stored.message
    # no stats record (the hook's observe mode records none): the reason is unknown, said so,
    # and the advice asks for JAX's own words instead of a key comparison (issue 29 item 3)
    assert "no evidence of why" in not_stored.message and "no stats record" in not_stored.evidence
    assert "JAX_EXPLAIN_CACHE_MISSES=1" in not_stored.advice and "diff" not in not_stored.advice
    assert "manifests" in not_stored.evidence
    run_hooked(script, cache, mode="observe", env=env)
    again = {p.name: p.stat().st_mtime_ns for p in cache.glob("cachedoctor-manifests/*.json")}
    assert again == manifests  # written once, not on every run
