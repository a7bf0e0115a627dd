"""The CLI as users run it: the installed console script and in-process through click."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachedoctor.cli import _glibc, cli
from cachedoctor.errors import CachedoctorError, ExitCode
from tests.support.caches import SCRIPT, cli_env

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert SCRIPT, "the cachedoctor console script is not installed in this environment"
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, env=env or cli_env(), check=False
    )


def test_help_lists_commands_without_importing_jax() -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cachedoctor", "--help"],
        capture_output=True,
        text=True,
        env=cli_env(),
        check=False,
    )
    assert proc.returncode == 0
    for command in ("scan", "show", "demo"):
        assert command in proc.stdout
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines()}
    assert "jax" not in imported and "jaxlib" not in imported


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_leave_the_allocator_alone(flag: str) -> None:
    """Keeping freed memory is for commands that decode; ``--help`` and ``--version`` do not
    pay for ctypes' import (~6 ms of a 72 ms start)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cachedoctor", flag],
        capture_output=True,
        text=True,
        env=cli_env(),
        check=False,
    )
    assert proc.returncode == 0
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines()}
    assert "ctypes" not in imported


def test_scan_help_loads_no_executor_code() -> None:
    """--executor's pool and Dask code load only when a command is given one."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cachedoctor", "scan", "--help"],
        capture_output=True,
        text=True,
        env=cli_env(),
        check=False,
    )
    assert proc.returncode == 0 and "--executor" in proc.stdout
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines()}
    assert not imported & {"cachedoctor.cache.executors", "cachedoctor.cache.parallel", "dask"}


def test_scan_script_exit_codes(seed_cache: Path) -> None:
    ok = run_script("scan", str(seed_cache))
    assert ok.returncode == 0, ok.stderr
    assert "unstable-key" in ok.stdout and "jit_f" in ok.stdout
    strict = run_script("scan", str(seed_cache), "--fail-on", "warning")
    assert strict.returncode == 1
    ignored = run_script(
        "scan", str(seed_cache), "--fail-on", "warning", "--ignore", "unstable-key"
    )
    assert ignored.returncode == 0


def test_scan_json_schema(seed_cache: Path) -> None:
    proc = run_script("scan", str(seed_cache), "--json")
    assert proc.returncode == 0
    doc = json.loads(proc.stdout)
    assert doc["schema_version"] == 1
    assert doc["cache_dir"] == str(seed_cache)
    assert set(doc) >= {"summary", "modules", "entries", "findings", "files", "jax", "tool"}
    assert doc["summary"]["entries"] == len(doc["entries"])
    entry = doc["entries"][0]
    for field in (
        "key",
        "module",
        "size",
        "compression",
        "platform",
        "format",
        "ok",
        "problems",
        "executable_digest",
        "program_digest",
        "hlo",
        "autotune_dir",
        "num_partitions",
    ):
        assert field in entry
    (finding,) = doc["findings"]
    assert finding["kind"] == "unstable-key" and finding["severity"] == "warning"
    assert len(finding["entries"]) == 3


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["scan", "/nonexistent/cache"], "no such directory"),
        (["scan"], "no cache directory given"),
        (["scan", "/etc/hostname"], "not-a-dir: not a directory: /etc/hostname"),
        (["show", "nope", "--dir", "/nonexistent"], "no-such-dir: no such directory"),
        (["scan", "--fail-on", "loud", "."], "Invalid value"),
    ],
)
def test_errors_are_one_line(args: list[str], needle: str) -> None:
    proc = run_script(*args)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout


def test_scan_uses_env_dir(seed_cache: Path) -> None:
    env = cli_env()
    env["JAX_COMPILATION_CACHE_DIR"] = str(seed_cache)
    proc = run_script("scan", "--json", env=env)
    assert json.loads(proc.stdout)["cache_dir"] == str(seed_cache)


def test_show_by_prefix_hlo_and_extract(seed_cache: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    ambiguous = runner.invoke(cli, ["show", "jit_f", "--dir", str(seed_cache)])
    error = ambiguous.exception  # main() turns it into one line and exit status 2
    assert isinstance(error, CachedoctorError) and error.code == ExitCode.USAGE
    assert error.slug == "ambiguous-entry" and "matches 3 entries" in str(error)
    assert "give more of the key" in str(error)
    key = next(p.name for p in seed_cache.glob("jit_g-*-cache")).removesuffix("-cache")
    prefix = key.split("-")[1][:10]
    out = tmp_path / "exe.bin"
    result = runner.invoke(
        cli, ["show", prefix, "--dir", str(seed_cache), "--hlo", "--extract", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert key in result.output
    assert "HloModule jit_g" in result.output
    assert "sine" in result.output
    assert out.stat().st_size > 0
    again = run_script("show", str(seed_cache / f"{key}-cache"), "--extract", str(out))
    assert again.returncode == 2 and "exists" in again.stderr


def test_show_json_of_corrupt_entry(tmp_path: Path) -> None:
    bad = tmp_path / ("jit_x-" + "5" * 64 + "-cache")
    bad.write_bytes(b"\x28\xb5\x2f\xfd garbage")
    proc = run_script("show", str(bad), "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["entry"]["ok"] is False and doc["entry"]["problems"]


def test_demo_shows_the_unstable_key_and_the_fix() -> None:
    proc = run_script("demo", "--runs", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plain, _, fixed = proc.stdout.partition("3. cachedoctor enable")
    assert plain.count("miss, compiled") == 2
    assert "unstable-key" in plain
    assert fixed.count("miss, compiled") == 1 and fixed.count("hit") >= 1
    assert "1 of 1 later runs hit the cache" in fixed


def test_version_names_cachedoctor_and_the_installed_jax() -> None:
    from importlib import metadata

    import cachedoctor

    proc = run_script("--version")
    assert proc.returncode == 0, proc.stderr
    assert metadata.version("cachedoctor") == cachedoctor.__version__  # one place: _version.py
    jax, jaxlib = metadata.version("jax"), metadata.version("jaxlib")
    assert proc.stdout.startswith(
        f"cachedoctor {cachedoctor.__version__} (jax {jax}, jaxlib {jaxlib};"
    )


_FAULTS_OF_DECODING = """
import resource, sys
if sys.argv[1] == "kept":
    from cachedoctor.cli import _keep_freed_memory
    _keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
before = faults()
for n in range(32):  # an entry decompressed (3-7 MiB), its module copied out, both dropped
    whole = bytearray((3 + (n * 7) % 5) << 20)
    module = bytearray(len(whole) // 3)
    del whole, module
print(faults() - before)
"""


@pytest.mark.skipif(not _glibc(), reason="mallopt and its parameters are glibc's")
def test_the_cli_reuses_the_memory_it_frees() -> None:
    """A scan decompresses each entry into a fresh buffer of up to MBs; glibc's defaults hand
    such buffers back when freed until its thresholds catch up, and each is faulted in again,
    page by page (~6,500 faults here). The CLI's process keeps what it frees: it faults in only
    its peak (~2,400)."""

    def faults(mode: str) -> int:
        run = [sys.executable, "-c", _FAULTS_OF_DECODING, mode]
        return int(subprocess.run(run, capture_output=True, text=True, check=True).stdout)

    assert 2 * faults("kept") < faults("default")
