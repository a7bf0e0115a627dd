"""Every command reads sizes, durations and moments with the one grammar of units.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.caches import SCRIPT, cli_env


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert SCRIPT, "the cachedoctor console script is not installed in this environment"
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, env=env or cli_env(), check=False
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["prune", "{d}", "--older-than", "2w"],
        ["prune", "{d}", "--max-size", "1GiB", "--stale-after", "2w", "--lock-timeout", "1min"],
        ["stats", "{d}", "--since", "2w"],
        ["stats", "{d}", "--since", "2026-01-31"],
        ["stats", "{d}", "--since", "1796075058"],  # a Unix time, as the API takes it
        ["rekey", "{d}", "--lock-timeout", "90s"],
    ],
)
def test_the_same_forms_work_everywhere(tmp_path: Path, args: list[str]) -> None:
    proc = run(*[a.format(d=tmp_path) for a in args])
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["prune", "{d}", "--older-than", "1y"], "not a duration: '1y' (use a number with s, min"),
        (["prune", "{d}", "--older-than", "5x"], "not a duration: '5x'"),
        (["prune", "{d}", "--stale-after", "-1h"], "not a duration: '-1h'"),
        (["prune", "{d}", "--max-size", "lots"], "not a size: 'lots'"),
        (["prune", "{d}", "--duplicates", "--lock-timeout", "-5"], "not a duration: '-5'"),
        (["stats", "{d}", "--since", "1y"], "not a time: '1y'"),
        (["enable", "--dir", "{d}", "--max-size", "1y", "--print-env"], "not a size: '1y'"),
        (["enable", "--dir", "{d}", "--min-compile-time", "nan", "--print-env"], "seconds >= 0"),
    ],
)
def test_what_is_not_a_value_is_a_usage_error_naming_the_forms(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(tmp_path / "absent.toml")}
    proc = run(*[a.format(d=tmp_path) for a in args], env=env)
    assert proc.returncode == 2, proc
    assert needle in proc.stderr, proc.stderr
    assert "could not convert" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_prune_reports_the_selectors_as_typed(tmp_path: Path) -> None:
    proc = run("prune", str(tmp_path), "--older-than", "2w", "--max-size", "1GiB")
    assert proc.returncode == 0, proc.stderr
    assert "[older-than 2w, max-size 1GiB]" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["scan", "ftp://host/c"],
        ["prune", "http://h/c", "--duplicates"],
        ["show", "k", "--dir", "ftp://h/c"],
    ],
)
def test_a_folder_that_is_no_folder_or_bucket_is_a_usage_error(args: list[str]) -> None:
    proc = run(*args)
    assert proc.returncode == 2, proc
    assert "is not supported; give a local folder, a gs://bucket/prefix" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_file_url_names_its_folder(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    by_url = run("scan", "--json", f"file://{tmp_path / 'c'}")
    by_path = run("scan", "--json", str(tmp_path / "c"))
    assert by_url.returncode == by_path.returncode == 0, by_url.stderr
    assert '"cache_dir": "' + str(tmp_path / "c") + '"' in by_url.stdout
