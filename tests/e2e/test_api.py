"""The Python API, through the public names only (``cachedoctor.<name>``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import cachedoctor
from tests.support.hookrun import base_env, run_recorded

PUBLIC = ["CachedoctorError", "__version__", "diff", "prune_plan", "scan", "stats"]


def test_public_names_are_stable() -> None:
    """Removing or renaming one breaks users' notebooks: change this list on purpose only."""
    assert sorted(cachedoctor.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(cachedoctor, name) is not None
    with pytest.raises(AttributeError):
        cachedoctor.no_such_function  # noqa: B018


@pytest.mark.slow
def test_import_is_cheap() -> None:
    code = (
        "import sys, cachedoctor; "
        "print(sorted(m for m in ('jax', 'click', 'rich', 'cachedoctor.api') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=base_env(None), check=True
    )
    assert out.stdout.strip() == "[]"


def _keys(cache: Path, module: str) -> list[Path]:
    return sorted(p for p in cache.glob(f"{module}-*-cache"))


@pytest.mark.slow
def test_scan_diff_and_prune_plan(seed_cache: Path) -> None:
    report = cachedoctor.scan(seed_cache)
    assert report.summary.entries == len(list(seed_cache.glob("*-cache")))
    unstable = [f for f in report.findings if f.kind == "unstable-key"]
    assert [f.module for f in unstable] == ["jit_f"]
    as_dict = json.loads(json.dumps(report.to_dict()))
    assert as_dict["summary"]["entries"] == report.summary.entries
    assert as_dict["findings"][0]["kind"] == "unstable-key"

    a, b, *_ = _keys(seed_cache, "jit_f")
    verdict = cachedoctor.diff(a, b).verdict
    assert verdict.kind == "same-executable" and verdict.equivalent
    assert json.loads(json.dumps(cachedoctor.diff(a, b).to_dict()))["verdict"]["kind"] == (
        "same-executable"
    )

    before = sorted(p.name for p in seed_cache.iterdir())
    plan = cachedoctor.prune_plan(seed_cache, duplicates=True)
    assert plan.entries_to_remove == len(_keys(seed_cache, "jit_f")) - 1
    assert {a.module for a in plan.actions if a.op == "remove-entry"} == {"jit_f"}
    assert sorted(p.name for p in seed_cache.iterdir()) == before  # a plan deletes nothing
    assert plan.to_dict()["command"] == "prune"


@pytest.mark.slow
def test_stats_is_what_the_cli_prints(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    run_recorded(cache, "stats", "plain")
    run_recorded(cache, "stats", "plain")
    report = cachedoctor.stats(cache)
    assert report.processes == 2 and report.totals.hits >= 1
    cli = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "stats", str(cache), "--json"],
        capture_output=True,
        text=True,
        env=base_env(None),
        check=True,
    )
    document = json.loads(cli.stdout)
    assert document.pop("schema_version") == 1  # the document is versioned, the report not
    assert document == json.loads(json.dumps(report.to_dict()))
    assert cachedoctor.stats(cache, since="2999-01-01").processes == 0


def test_bad_input_raises_the_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(cachedoctor.CachedoctorError, match="no such directory"):
        cachedoctor.scan(tmp_path / "missing")
    with pytest.raises(cachedoctor.CachedoctorError, match="not a size"):
        cachedoctor.prune_plan(tmp_path, max_size="lots")
    with pytest.raises(cachedoctor.CachedoctorError, match="--since"):
        cachedoctor.stats(tmp_path, since="soon")
