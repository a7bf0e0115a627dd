"""`cachedoctor stats` at the edge: what it refuses, its exit codes and what it says when it
has nothing to show (issue 28, items 5-8). The records come from real JAX processes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cachedoctor.layout import STATS_DIRNAME
from tests.support.caches import SCRIPT, cli_env
from tests.support.hookrun import run_recorded
from tests.support.sessioncache import SharedBuilds

NO_HOOK = "run JAX with the hook"


def stats(*args: str) -> subprocess.CompletedProcess[str]:
    assert SCRIPT, "the cachedoctor console script is not installed in this environment"
    return subprocess.run(
        [SCRIPT, "stats", *args], capture_output=True, text=True, env=cli_env(), timeout=300
    )


def one_line_error(proc: subprocess.CompletedProcess[str], slug: str) -> None:
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cachedoctor: {slug}: "), proc.stderr
    assert "internal-error" not in proc.stderr and proc.stdout == ""


@pytest.fixture(scope="module")
def records(shared_builds: SharedBuilds) -> Path:
    """Two processes of a plain jit program with stats recording (once per session: copy it)."""

    def make(root: Path) -> None:
        (root / "cache").mkdir()
        for _ in range(2):
            run_recorded(root / "cache", "stats", "plain")

    root, _ = shared_builds("stats-cli-records", make)
    return root / "cache"


def _record_names(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / STATS_DIRNAME).glob("*.json"))


@pytest.mark.slow
@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize(
    ("where", "slug"),
    [
        ("missing", "no-such-dir"),
        ("a-file", "not-a-dir"),
        ("loop", "symlink-loop"),
        ("not-a-cache", "not-a-cache"),
    ],
)
def test_a_folder_that_is_not_a_cache_is_exit_2(
    tmp_path: Path, where: str, slug: str, zero: bool
) -> None:
    (tmp_path / "a-file").write_text("x")
    os.symlink("loop", tmp_path / "loop")
    (tmp_path / "not-a-cache").mkdir()
    (tmp_path / "not-a-cache" / "README.md").write_text("a checkout, not a cache")
    one_line_error(stats(str(tmp_path / where), *(["--zero", "--apply"] if zero else [])), slug)


@pytest.mark.slow
def test_a_stats_folder_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / STATS_DIRNAME).write_text("a file where the folder should be")
    one_line_error(stats(str(tmp_path)), "not-a-dir")


@pytest.mark.slow
def test_max_modules_is_a_count(tmp_path: Path) -> None:
    proc = stats(str(tmp_path), "--max-modules", "-1")
    assert proc.returncode == 2 and "--max-modules" in proc.stderr, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["--zero", "--since", "1min"],
        ["--zero", "--module", "jit_nothing", "--apply"],
        ["--zero", "--json", "--apply"],
        ["--zero", "--html", "page.html", "--apply"],
    ],
)
def test_zero_refuses_a_filter_it_would_ignore(records: Path, copy_of, args: list[str]) -> None:
    cache = copy_of(records)
    before = _record_names(cache)
    proc = stats(str(cache), *args)
    assert proc.returncode == 2 and "--zero archives every record" in proc.stderr, proc
    assert _record_names(cache) == before and len(before) == 2  # nothing archived
    assert not list((cache / STATS_DIRNAME).glob("archive-*"))


@pytest.mark.slow
def test_nothing_to_show_says_why(records: Path, copy_of) -> None:
    cache = copy_of(records)
    future = stats(str(cache), "--since", "2099-01-01")
    assert future.returncode == 0, future.stderr
    assert "2 stats records, none since 2099-01-01 00:00 UTC" in future.stdout
    assert NO_HOOK not in future.stdout
    other = stats(str(cache), "--module", "jit_nothing*")
    assert "2 stats records, none of module jit_nothing*" in other.stdout, other.stdout
    assert NO_HOOK not in other.stdout

    zeroed = stats(str(cache), "--zero", "--apply")
    assert zeroed.returncode == 0 and "archived 2 records" in zeroed.stdout, zeroed
    (archive,) = (cache / STATS_DIRNAME).glob("archive-*.jsonl")
    after = stats(str(cache))
    assert (
        f"no stats records since the last `--zero` (archived in {STATS_DIRNAME}/{archive.name})"
        in after.stdout
    )
    assert NO_HOOK not in after.stdout

    shutil.rmtree(cache / STATS_DIRNAME)
    assert NO_HOOK in stats(str(cache)).stdout  # never recorded: the hook is the advice
