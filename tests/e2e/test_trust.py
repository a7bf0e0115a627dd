"""Trust on first use (issue 18): no hang, no lock-out, no false green, one clear line per error.

Each test runs the installed console script on input built here (real JAX caches from the
session fixtures; hand-made bytes only for broken input) with a timeout, as a user would.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cachedoctor.programs import program_path
from cachedoctor.storage.location import Location
from tests.support.caches import REPO, SCRIPT, cli_env

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess

HASH = "a" * 64
TIMEOUT_S = 60  # a hang fails the test instead of stalling the suite


def cachedoctor(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The console script, with a timeout: a hang is a failure, not a stall."""
    assert SCRIPT, "the cachedoctor console script is not installed in this environment"
    return subprocess.run(
        [SCRIPT, *args],
        capture_output=True,
        text=True,
        env=env or cli_env(),
        cwd=cwd,
        timeout=TIMEOUT_S,
        check=False,
    )


def one_clear_line(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    """Exit 2 with one line that says ``needle``, no traceback, no internal-error."""
    assert proc.returncode == 2, proc
    assert needle in proc.stderr, proc.stderr
    assert "internal-error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# -- 2. special files never block ----------------------------------------------------------


def _plant_special_files(cache: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A FIFO named like an entry, one like an -atime file, and a socket named like an entry."""
    fifo = f"jit_fifo-{HASH}-cache"
    os.mkfifo(cache / fifo)
    os.mkfifo(cache / f"jit_fifo2-{HASH}-atime")
    manifests = cache / "cachedoctor-manifests"
    manifests.mkdir(exist_ok=True)
    for entry in cache.glob("jit_f-*-cache"):  # FIFOs named like the entries' key manifests
        os.mkfifo(manifests / entry.name.replace("-cache", ".json"))
    with monkeypatch.context() as m, socket.socket(socket.AF_UNIX) as sock:
        m.chdir(cache)  # a relative name: an AF_UNIX path is limited to 108 bytes
        sock.bind(f"jit_sock-{'b' * 64}-cache")
    return [fifo]


def test_special_files_named_like_entries_never_block(
    seed_cache: Path, copy_of, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = copy_of(seed_cache)
    (fifo,) = _plant_special_files(cache, monkeypatch)
    scan = cachedoctor("scan", str(cache))
    assert scan.returncode == 0, scan.stderr  # not corrupt: not an entry at all
    assert "unknown-file" in scan.stdout
    assert cachedoctor("lint", str(cache)).returncode == 0
    one_clear_line(cachedoctor("show", str(cache / fifo)), "not a regular file")
    prune = cachedoctor("prune", str(cache), "--corrupt", "--orphans")
    assert prune.returncode == 0, prune.stderr
    assert fifo not in prune.stdout  # never planned for removal: cachedoctor does not own it
    assert cachedoctor("rekey", str(cache)).returncode == 0
    first, last = sorted(cache.glob("jit_f-*-cache"))[::2]
    diff = cachedoctor("diff", str(first), str(last))
    assert diff.returncode in (0, 1) and "Traceback" not in diff.stderr, diff.stderr


def test_check_with_a_fifo_in_its_cache_does_not_block(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    os.mkfifo(cache / f"jit_fifo-{HASH}-cache")
    proc = cachedoctor(
        "check", "--dir", str(cache), "--", sys.executable, str(program_path("plain"))
    )
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr


# -- 3. a broken config never locks the user out -------------------------------------------


@pytest.mark.parametrize("kind", ["junk", "binary", "directory"])
def test_broken_config_is_named_and_recoverable(tmp_path: Path, kind: str) -> None:
    config = tmp_path / "config.toml"
    if kind == "junk":
        config.write_text('[cachedoctor]\ncache_dir = "/x"\nthis is junk\n')
    elif kind == "binary":
        config.write_bytes(b"\x00\xff\xfe\x00binary")
    else:
        config.mkdir()
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(config)}
    status = cachedoctor("status", env=env)
    one_clear_line(status, str(config))
    if kind == "junk":
        assert "line 3" in status.stderr
        disable = cachedoctor("disable", env=env)
        assert disable.returncode == 0 and not config.exists(), disable.stderr
        config.write_text("junk\n")
    if kind == "directory":
        one_clear_line(cachedoctor("disable", env=env), "is a directory")
        return
    enable = cachedoctor("enable", "--dir", str(tmp_path / "cache"), env=env)
    assert enable.returncode == 0, enable.stderr
    assert "broken-config" in enable.stderr and str(config) in enable.stderr
    assert cachedoctor("status", env=env).returncode == 0
    assert cachedoctor("disable", env=env).returncode == 0 and not config.exists()


def test_jax_process_says_once_that_activation_failed(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("junk\n")
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(config), "JAX_PLATFORMS": "cpu"}
    code = "import jax, jax.numpy as jnp; jax.jit(lambda x: x + 1)(jnp.ones(3)); print('ran')"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0 and "ran" in proc.stdout, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "activation failed" in line]
    assert len(said) == 1 and str(config) in said[0] and "line 1" in said[0], proc.stderr


def test_status_exits_nonzero_on_an_activation_error(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    # a good file, but a hook mode from the environment that activation refuses (a value of the
    # wrong type in the file is refused by status itself: tests/stablekeys/test_settings.py)
    config.write_text('[cachedoctor]\ncache_dir = "/tmp/x"\n')
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(config), "CACHEDOCTOR_HOOK": "bogus"}
    proc = cachedoctor("status", env=env)
    assert "activation error" in proc.stdout, proc.stdout
    assert proc.returncode == 1


def test_status_under_disable_ignores_the_config(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(config)}
    cache = tmp_path / "cache"
    assert cachedoctor("enable", "--dir", str(cache), env=env).returncode == 0
    shown = cachedoctor("status", env=env).stdout
    # the setting by its choice name (the roles below name JAX's folder for it)
    settings_shown = shown.split("multi-host roles", 1)[0]
    assert str(cache) in shown and "autotune" in settings_shown
    assert "xla_gpu_per_fusion" not in settings_shown
    off = cachedoctor("status", env={**env, "CACHEDOCTOR_DISABLE": "1"})
    assert off.returncode == 0, off.stderr
    assert str(cache) not in off.stdout.split("effective settings", 1)[1]
    assert "CACHEDOCTOR_DISABLE=1" in off.stdout
    assert " None " not in off.stdout


# -- 6. values that mean nothing are refused -----------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--min-compile-time", "-5"],
        ["--min-compile-time", "nan"],
        ["--max-size", "-5"],
        ["--max-size", "1e400"],
        ["--shell", "fish"],
        ["--min-entry-size", "-1"],
    ],
)
def test_enable_refuses_meaningless_values(tmp_path: Path, args: list[str]) -> None:
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(tmp_path / "config.toml")}
    proc = cachedoctor("enable", "--dir", str(tmp_path / "cache"), *args, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc
    assert not (tmp_path / "config.toml").exists()


def test_enable_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(tmp_path / "config.toml")}
    regular = tmp_path / "file"
    regular.write_text("x")
    one_clear_line(cachedoctor("enable", "--dir", str(regular), env=env), "not a directory")
    one_clear_line(cachedoctor("enable", "--dir", str(regular / "sub"), env=env), str(regular))
    assert not (tmp_path / "config.toml").exists()


def test_enable_takes_sizes_as_prune_does_and_says_what_it_keeps(tmp_path: Path) -> None:
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(tmp_path / "config.toml")}
    first = cachedoctor("enable", "--dir", str(tmp_path / "cache"), "--max-size", "10GB", env=env)
    assert first.returncode == 0, first.stderr
    assert "max_size = 10000000000" in first.stdout
    assert "1 s" in first.stdout  # JAX's min_compile_time_secs default is said
    second = cachedoctor("enable", "--min-compile-time", "0", env=env)
    assert second.returncode == 0, second.stderr
    assert "kept from the previous config: cache_dir, xla_caches, max_size" in second.stdout


def test_scan_refuses_negative_max_modules(seed_cache: Path) -> None:
    proc = cachedoctor("scan", str(seed_cache), "--max-modules", "-1")
    assert proc.returncode == 2 and "max-modules" in proc.stderr


def test_prune_refuses_an_infinite_size(seed_cache: Path) -> None:
    one_clear_line(cachedoctor("prune", str(seed_cache), "--max-size", "1e400"), "not a size")


# -- 7. unreadable is not corrupt ----------------------------------------------------------


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_entry_is_unreadable_for_scan_and_prune(seed_cache: Path, copy_of) -> None:
    cache = copy_of(seed_cache)
    entry = sorted(cache.glob("jit_g-*-cache"))[0]
    entry.chmod(0)
    scan = cachedoctor("scan", str(cache))
    assert "unreadable" in scan.stdout and "corrupt" not in scan.stdout, scan.stdout
    prune = cachedoctor("prune", str(cache), "--corrupt")
    assert "not checked" in prune.stdout and "would remove" not in prune.stdout


def test_an_entry_cachedoctor_cannot_read_whole_is_not_called_corrupt(
    seed_cache: Path,
) -> None:
    from cachedoctor.core.findings import FindingKind
    from cachedoctor.core.scan.run import scan_directory

    report = scan_directory(
        Location.parse(seed_cache), max_decompressed=100, use_index=False
    )  # too-large
    kinds = {f.kind for f in report.findings}
    assert FindingKind.UNREADABLE in kinds and FindingKind.CORRUPT not in kinds, kinds
    for finding in report.findings:
        if finding.kind is FindingKind.UNREADABLE:
            assert "not checked" in finding.message and "prune" not in finding.advice


# -- 4. false greens -----------------------------------------------------------------------


def test_check_that_compiled_nothing_fails_saying_so(seed_cache: Path) -> None:
    fresh = cachedoctor("check", "--", "true")
    assert fresh.returncode == 1, fresh.stdout + fresh.stderr
    assert "nothing was checked" in fresh.stdout
    existing = cachedoctor("check", "--dir", str(seed_cache), "--", "true")
    assert existing.returncode == 1, existing.stdout + existing.stderr
    assert "nothing was checked" in existing.stdout and "jit_f" not in existing.stdout


def test_check_vouches_only_for_what_run_1_compiled(tmp_path: Path, seed_cache: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(seed_cache, cache)  # 5 modules already there; plain compiles others
    plain = [sys.executable, str(program_path("plain"))]
    env = {**cli_env(), "CACHEDOCTOR_PLAIN_SIZE": "24"}  # a new shape: new entries in run 1
    proc = cachedoctor("check", "--dir", str(cache), "--format", "json", "--", *plain, env=env)
    import json

    doc = json.loads(proc.stdout)
    assert doc["compiled_in_run1"] and "jit_f" not in doc["compiled_in_run1"], doc
    assert not doc["nothing_checked"] and proc.returncode == 0, proc.stderr


def test_scan_ignore_is_checked_and_drops_the_finding(seed_cache: Path) -> None:
    one_clear_line(cachedoctor("scan", str(seed_cache), "--ignore", "bogus"), "bogus")
    shown = cachedoctor("scan", str(seed_cache))
    assert "unstable-key" in shown.stdout
    ignored = cachedoctor("scan", str(seed_cache), "--ignore", "unstable-key")
    assert ignored.returncode == 0 and "unstable-key" not in ignored.stdout


@pytest.mark.parametrize("runs", ["0", "1"])
def test_demo_refuses_runs_that_cannot_show_anything(runs: str) -> None:
    proc = cachedoctor("demo", "--runs", runs)
    assert proc.returncode == 2 and "stable" not in proc.stdout, proc.stdout


# -- 5. one clear line instead of internal-error -------------------------------------------


def test_show_and_diff_errors_are_one_short_line(seed_cache: Path, tmp_path: Path) -> None:
    entry = sorted(seed_cache.glob("jit_g-*-cache"))[0]
    missing = tmp_path / "no-such-folder" / "out.bin"
    one_clear_line(cachedoctor("show", str(entry), "--extract", str(missing)), "cannot write")
    long_name = "x" * 5000
    for args in (["show", long_name], ["diff", long_name, entry.name]):
        proc = cachedoctor(*args, "--dir", str(seed_cache))
        one_clear_line(proc, "5000 characters")
        assert len(proc.stderr) < 400
    directory = cachedoctor("show", str(seed_cache))
    one_clear_line(directory, "is a directory")
    assert "1970" not in directory.stdout and "None" not in directory.stdout


def test_binary_baseline_is_one_line(seed_cache: Path, tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_bytes(b"\x00\xff\xfe\x80binary")
    one_clear_line(cachedoctor("lint", str(seed_cache), "--baseline", str(baseline)), "baseline")


# -- 7. show uses the directory `enable` set, like every command ---------------------------


def test_show_key_uses_the_enabled_directory(seed_cache: Path, tmp_path: Path) -> None:
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(tmp_path / "config.toml")}
    assert cachedoctor("enable", "--dir", str(seed_cache), env=env).returncode == 0
    key = sorted(seed_cache.glob("jit_g-*-cache"))[0].name.removesuffix("-cache")
    proc = cachedoctor("show", key[:12], env=env)
    assert proc.returncode == 0 and key in proc.stdout, proc.stderr


# -- 10. leftovers -------------------------------------------------------------------------


def _check_dirs(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("cachedoctor-check-*"))


def test_check_removes_its_temp_folder_on_failure_and_sigterm(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**cli_env(), "TMPDIR": str(tmp)}
    failed = cachedoctor("check", "--", "false", env=env)
    assert failed.returncode == 2 and not _check_dirs(tmp), failed.stderr
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    proc = subprocess.Popen([SCRIPT, "check", "--", *sleeper], env=env)  # type: ignore[list-item]
    for _ in range(300):
        if _check_dirs(tmp) and proc.poll() is None:
            break
        subprocess.run(["sleep", "0.1"], check=True)
    assert _check_dirs(tmp), "check did not start"
    subprocess.run(["sleep", "1"], check=True)  # the command is running
    proc.terminate()
    assert proc.wait(timeout=30) != 0
    assert not _check_dirs(tmp)


def test_check_refuses_an_unwritable_report_before_running(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"]
    proc = cachedoctor("check", "-o", str(tmp_path / "missing" / "r.json"), "--", *cmd)
    one_clear_line(proc, "cannot write the report")
    assert not marker.exists()


# -- 11. not a JAX cache -------------------------------------------------------------------


def test_scanning_a_folder_that_is_not_a_cache_says_so(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "src").mkdir(parents=True)
    (checkout / "README.md").write_text("# a project\n")
    (checkout / "setup.py").write_text("print()\n")
    one_clear_line(cachedoctor("scan", str(checkout)), "does not look like a JAX cache")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cachedoctor("scan", str(empty)).returncode == 0  # a fresh cache is a cache


# -- 7. a stray -atime file is not proof of LRU eviction -----------------------------------


def test_stray_atime_is_a_warning_and_a_lockfile_makes_it_an_error(
    seed_cache: Path, copy_of
) -> None:
    from cachedoctor.core.findings import FindingKind, Severity
    from cachedoctor.core.scan.run import scan_directory

    cache = copy_of(seed_cache)
    key = sorted(cache.glob("jit_g-*-cache"))[0].name.removesuffix("-cache")
    (cache / f"{key}-atime").write_bytes((1).to_bytes(8, "little"))  # one stray -atime
    (finding,) = [
        f
        for f in scan_directory(Location.parse(cache)).findings
        if f.kind is FindingKind.MISSING_ATIME
    ]
    assert finding.severity is Severity.WARNING, finding
    assert cachedoctor("scan", str(cache)).returncode == 0
    (cache / ".lockfile").touch()  # JAX's LRU cache locks this file around every get/put
    (finding,) = [
        f
        for f in scan_directory(Location.parse(cache)).findings
        if f.kind is FindingKind.MISSING_ATIME
    ]
    assert finding.severity is Severity.ERROR


# -- 9. output never loses text ------------------------------------------------------------


def _off_terminal_env() -> dict[str, str]:
    env = cli_env()
    env.pop("COLUMNS", None)  # stdout is a pipe: cachedoctor picks the width itself
    return env


def test_prune_table_off_a_terminal_keeps_every_reason_whole(seed_cache: Path, copy_of) -> None:
    import json

    from cachedoctor.render.plan import short

    cache = copy_of(seed_cache)  # with the access times JAX left: the reasons quote them
    text = cachedoctor("prune", str(cache), "--max-size", "1KB", env=_off_terminal_env())
    doc = json.loads(cachedoctor("prune", str(cache), "--max-size", "1KB", "--json").stdout)
    assert doc["actions"], doc
    # a reason says how long ago the entry was written: the two runs are seconds apart
    ages = re.compile(r"\d+ (?:s|minutes|hours|days) ago")
    for action in doc["actions"]:
        reason = ages.sub("N ago", short(action["reason"]))
        assert reason in ages.sub("N ago", text.stdout), (action["reason"], text.stdout)


def test_a_long_module_name_keeps_the_table(seed_cache: Path, copy_of) -> None:
    cache = copy_of(seed_cache)
    entry = sorted(cache.glob("jit_g-*-cache"))[0]
    long_module = "jit_" + "m" * 176
    entry.rename(cache / entry.name.replace("jit_g-", f"{long_module}-"))
    proc = cachedoctor("scan", str(cache), env=_off_terminal_env())
    (row,) = [line for line in proc.stdout.splitlines() if long_module in line]
    assert row.count("│") == 4, row  # every column on the module's own row


def test_plural_and_unknown_format_wording(seed_cache: Path) -> None:
    from cachedoctor.cache.model import EntryInfo

    proc = cachedoctor("scan", str(seed_cache))
    assert "1 finding\n" in proc.stdout and "1 findings" not in proc.stdout
    info = EntryInfo(key="k", module=None, path="p", size=0, mtime_ns=0, payload_format="ifrt")
    assert info.format_label == "ifrt"


# -- 10. an unreachable endpoint says what it waits for ------------------------------------


def test_unreachable_s3_endpoint_says_what_it_waits_for() -> None:
    pytest.importorskip("s3fs", reason="s3fs comes with the test-remote extra")
    with socket.socket() as sock:  # a port nobody listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **cli_env(),
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }
    proc = cachedoctor("scan", "s3://bucket/prefix", env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("cachedoctor: waiting for listing s3://bucket/prefix"), proc.stderr
    assert "attempts" in first


# -- 8. docs that send users somewhere -----------------------------------------------------


def test_docs_name_what_exists() -> None:
    from cachedoctor.core.findings import FindingKind

    root = REPO
    docs = {p.name: p.read_text() for p in [root / "README.md", *(root / "docs").glob("*.md")]}
    everything = "\n".join(docs.values())
    assert "python seed.py" not in everything  # the seed program is shipped as a module
    assert "python -m cachedoctor.programs.seed" in docs["README.md"]
    assert (
        "pip install cachedoctor" not in everything and "pip install 'cachedoctor" not in everything
    )
    assert (
        "Usage: cli" not in docs["commands.md"] and "Usage: cachedoctor scan" in docs["commands.md"]
    )
    assert "hook branch" not in docs["diff.md"]
    # what --help says is true: --zero writes one archive file, not a folder; --dir's default
    commands = docs["commands.md"]
    assert "cachedoctor-stats/archive/" not in commands
    assert "archive-<UTC time>.jsonl" in " ".join(commands.split())  # wrapped as click wraps
    assert "(default: the current one)" not in commands
    assert "(docs/findings.md)" in docs["README.md"]  # where every kind is, one section each
    for kind in FindingKind:
        assert f"### `{kind.value}`" in docs["findings.md"], kind
    proc = subprocess.run(
        [sys.executable, "-m", "cachedoctor.programs.seed"],
        capture_output=True,
        text=True,
        env={**cli_env(), "JAX_PLATFORMS": "cpu"},
        timeout=300,
    )
    assert proc.returncode == 0 and "result:" in proc.stdout, proc.stderr
