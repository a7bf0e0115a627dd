"""The Python API, through the public names only (``cachedoctor.<name>``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import cachedoctor
from tests.support.hookrun import base_env, run_recorded

PUBLIC = [
    "CachedoctorError", "__version__", "diff", "lint", "metrics", "prune_plan", "scan", "stats"
]  # fmt: skip


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
def test_scan_diff_and_prune_plan(seed_cache: Path, copy_of: Callable[[Path], Path]) -> None:
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

    cache = copy_of(seed_cache)  # with the access times JAX left: --duplicates reads them
    before = sorted(p.name for p in cache.iterdir())
    plan = cachedoctor.prune_plan(cache, module="jit_f")
    assert plan.entries_to_remove == len(_keys(cache, "jit_f"))
    assert {a.module for a in plan.actions if a.op == "remove-entry"} == {"jit_f"}
    # unrecorded plain runs: nothing tells that no run computes these keys again (issue 39)
    kept = cachedoctor.prune_plan(cache, duplicates=True)
    assert kept.entries_to_remove == 0 and [s.name for s in kept.skipped] == ["jit_f"]
    assert sorted(p.name for p in cache.iterdir()) == before  # a plan deletes nothing
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
    with pytest.raises(cachedoctor.CachedoctorError, match=r"^since: not a time: 'soon'"):
        cachedoctor.stats(tmp_path, since="soon")


# Every API function, given what users get wrong; each must raise CachedoctorError, nothing
# else. Run in a fresh interpreter: as root, it runs without CAP_DAC_OVERRIDE (setpriv), so a
# mode-000 folder is unreadable as it is for any other user.
_BAD_INPUT_PROBE = r"""
import json, sys
from pathlib import Path
import cachedoctor

d = Path(sys.argv[1])
entry = d / "cache" / ("jit_x-" + "0" * 64 + "-cache")
calls = {
    "scan missing": lambda: cachedoctor.scan(d / "missing"),
    "scan unreadable": lambda: cachedoctor.scan(d / "unreadable"),
    "scan file": lambda: cachedoctor.scan(d / "a-file"),
    "scan loop": lambda: cachedoctor.scan(d / "loop"),
    "scan not a cache": lambda: cachedoctor.scan(d / "not-a-cache"),
    "scan int": lambda: cachedoctor.scan(5),
    "scan bytes": lambda: cachedoctor.scan(b"/tmp"),
    "stats missing": lambda: cachedoctor.stats(d / "missing"),
    "stats unreadable": lambda: cachedoctor.stats(d / "unreadable"),
    "stats file": lambda: cachedoctor.stats(d / "a-file"),
    "stats loop": lambda: cachedoctor.stats(d / "loop"),
    "stats not a cache": lambda: cachedoctor.stats(d / "not-a-cache"),
    "stats int": lambda: cachedoctor.stats(5),
    "stats since list": lambda: cachedoctor.stats(d / "cache", since=[7]),
    "stats since bool": lambda: cachedoctor.stats(d / "cache", since=True),
    "stats module int": lambda: cachedoctor.stats(d / "cache", module=5),
    "metrics missing": lambda: cachedoctor.metrics(d / "missing"),
    "metrics not a cache": lambda: cachedoctor.metrics(d / "not-a-cache"),
    "metrics since bool": lambda: cachedoctor.metrics(d / "cache", since=True),
    "metrics max_modules -1 int": lambda: cachedoctor.metrics(d / "cache", max_modules=-1),
    "metrics max_modules bool": lambda: cachedoctor.metrics(d / "cache", max_modules=True),
    "prune_plan missing": lambda: cachedoctor.prune_plan(d / "missing", duplicates=True),
    "prune_plan unreadable": lambda: cachedoctor.prune_plan(d / "unreadable", duplicates=True),
    "prune_plan file": lambda: cachedoctor.prune_plan(d / "a-file", duplicates=True),
    "prune_plan loop": lambda: cachedoctor.prune_plan(d / "loop", duplicates=True),
    "prune_plan int": lambda: cachedoctor.prune_plan(5, duplicates=True),
    "prune_plan older_than list": lambda: cachedoctor.prune_plan(d / "cache", older_than=[5]),
    "prune_plan older_than -5": lambda: cachedoctor.prune_plan(d / "cache", older_than=-5),
    "prune_plan max_size bool": lambda: cachedoctor.prune_plan(d / "cache", max_size=True),
    "prune_plan flag str": lambda: cachedoctor.prune_plan(d / "cache", duplicates="yes"),
    "prune_plan module int": lambda: cachedoctor.prune_plan(d / "cache", module=5),
    "diff missing": lambda: cachedoctor.diff(d / "missing-cache", entry),
    "diff unreadable": lambda: cachedoctor.diff(d / "unreadable-entry", entry),
    "diff directory": lambda: cachedoctor.diff(d / "cache", entry),
    "diff loop": lambda: cachedoctor.diff(d / "loop", entry),
    "diff int": lambda: cachedoctor.diff(5, 6),
    "diff None": lambda: cachedoctor.diff(None, entry),
}
out = {}
for name, call in calls.items():
    try:
        call()
        out[name] = ["returned", ""]
    except cachedoctor.CachedoctorError as exc:
        out[name] = ["CachedoctorError", f"{exc.slug}: {exc}"]
    except BaseException as exc:
        out[name] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


def _without_dac_override() -> list[str]:
    """A prefix that runs a command as root without the capability to ignore file modes."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("as root, mode-000 files are readable; setpriv (util-linux) drops that right")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]


@pytest.mark.slow
def test_every_function_raises_only_cachedoctor_error_for_bad_input(tmp_path: Path) -> None:
    (tmp_path / "unreadable").mkdir(mode=0o000)
    (tmp_path / "unreadable-entry").write_bytes(b"\x28\xb5\x2f\xfd")
    (tmp_path / "unreadable-entry").chmod(0o000)
    (tmp_path / "a-file").write_text("x")
    os.symlink("loop", tmp_path / "loop")
    (tmp_path / "not-a-cache").mkdir()
    (tmp_path / "not-a-cache" / "README.md").write_text("a checkout, not a cache")
    (tmp_path / "cache").mkdir()
    proc = subprocess.run(
        [*_without_dac_override(), sys.executable, "-c", _BAD_INPUT_PROBE, str(tmp_path)],
        capture_output=True,
        text=True,
        env=base_env(None),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    wrong = {name: r for name, r in results.items() if r[0] != "CachedoctorError"}
    assert not wrong, wrong
    slugs = {name: r[1].split(":")[0] for name, r in results.items()}
    assert slugs["scan missing"] == slugs["stats missing"] == slugs["metrics missing"]
    assert slugs["metrics missing"] == "no-such-dir"
    assert slugs["metrics not a cache"] == "not-a-cache"
    assert slugs["scan unreadable"] == slugs["prune_plan unreadable"] == "permission-denied"
    assert slugs["scan file"] == slugs["stats file"] == slugs["prune_plan file"] == "not-a-dir"
    assert slugs["scan loop"] == slugs["stats loop"] == "symlink-loop"
    assert slugs["scan not a cache"] == slugs["stats not a cache"] == "not-a-cache"
    assert slugs["diff unreadable"] == "unreadable" and slugs["diff loop"] == "symlink"
    assert all(slugs[n] == "usage" for n in results if n.endswith(("int", "bool", "list", "str")))
    for name in ("scan", "stats", "prune_plan"):  # the message names the argument
        assert results[f"{name} int"][1].startswith("usage: cache_dir: expected a path")


@pytest.mark.slow
def test_durations_and_sizes_take_numbers_too(seed_cache: Path) -> None:
    """``older_than=5`` (seconds) and ``max_size=10**9`` (bytes) mean what the CLI's do."""
    by_number = cachedoctor.prune_plan(seed_cache, older_than=86400 * 14, max_size=10**9)
    by_text = cachedoctor.prune_plan(seed_cache, older_than="2w", max_size="1GB")
    assert by_number.to_dict()["actions"] == by_text.to_dict()["actions"]
    assert by_text.selectors == ("older-than 2w", "max-size 1GB")  # spelled as given
    since = cachedoctor.stats(seed_cache, since=1796075058).since
    assert since == cachedoctor.stats(seed_cache, since="1796075058").since == 1796075058.0


def test_every_since_form_api_md_lists_is_accepted(tmp_path: Path) -> None:
    """docs/api.md's sentence on ``since`` is a promise: each quoted form it lists works."""
    api_md = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    sentence = re.search(r"`since` takes (.*?);", api_md, re.S)
    assert sentence, "docs/api.md no longer says what since takes"
    forms = re.findall(r'`"([^"`]+)"`', sentence.group(1))
    assert len(forms) >= 5 and "Unix time" in sentence.group(1), forms
    for form in [*forms, "1796075058", 1796075058, 1796075058.5]:
        value = "2026-01-31" if form == "YYYY-MM-DD" else form
        assert cachedoctor.stats(tmp_path, since=value).processes == 0, form
