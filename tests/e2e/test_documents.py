"""What every command writes: JSON documents all carry ``schema_version``, and files written
(``show --extract``, ``stats --html``, ``-o``) appear whole or not at all."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from cachedoctor.cli import COMMANDS, cli
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.storage.location import Location
from tests.support.caches import SCRIPT, cli_env, entries_of
from tests.support.cli import invoke

pytestmark = pytest.mark.slow  # JAX-built caches; `check` and `status` start interpreters


def json_commands() -> set[str]:
    """Every command with a ``--json`` flag or a ``--format`` that offers json."""
    ctx = click.Context(cli)
    found = set()
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None
        for param in command.params:
            choices = getattr(param.type, "choices", ())
            if param.name == "as_json" or (param.name == "fmt" and "json" in choices):
                found.add(name)
    return found


def test_every_json_document_has_a_schema_version(
    seed_cache: Path, copy_of: Callable[[Path], Path], tmp_path: Path
) -> None:
    cache = str(copy_of(seed_cache))
    bundle = str(tmp_path / "bundle.tar")
    f1, f2 = sorted(
        e.key for e in entries_of(scan_directory(Location.parse(cache))) if e.module == "jit_f"
    )[:2]
    runs: dict[str, list[tuple[str, ...]]] = {
        "scan": [("scan", cache, "--json")],
        "show": [("show", f1, "--dir", cache, "--json")],
        "diff": [
            ("diff", f1, f2, "--dir", cache, "--json"),
            ("diff", "--module", "jit_f", "--dir", cache, "--json"),
        ],
        "prune": [("prune", cache, "--duplicates", "--json")],
        "rekey": [("rekey", cache, "--json")],
        "lint": [("lint", cache, "--format", "json")],
        "check": [
            ("check", "--runs", "2", "--format", "json", "--", sys.executable, "-c", "print(1)")
        ],
        "stats": [("stats", cache, "--json")],
        "why": [("why", cache, "--json")],
        "preflight": [("preflight", cache, "--json")],
        "pack": [("pack", cache, "-o", bundle, "--json")],
        "unpack": [("unpack", bundle, str(tmp_path / "unpacked"), "--json")],
        "status": [("status", "--json")],
    }
    assert set(runs) == json_commands()
    for name, argvs in runs.items():
        for argv in argvs:
            code, out, err = invoke(*argv)
            assert code in (0, 1), (argv, err)
            doc = json.loads(out)
            assert doc.get("schema_version") == 1, (name, argv, list(doc)[:5])


def _entry(cache: Path) -> Path:
    return max(cache.glob("jit_f-*-cache"), key=lambda p: p.stat().st_size)


def test_extract_of_a_damaged_entry_leaves_no_file(
    seed_cache: Path, copy_of: Callable[[Path], Path], tmp_path: Path
) -> None:
    cache = copy_of(seed_cache)
    entry = _entry(cache)
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) * 2 // 3])  # cut: decompresses part way, then fails
    out = tmp_path / "out"
    out.mkdir()
    code, _, err = invoke("show", str(entry), "--extract", str(out / "payload.bin"))
    assert code == 2 and "cannot extract" in err and "corrupt" in err, err
    assert list(out.iterdir()) == []  # neither the file nor a temp file


def test_extract_never_replaces_a_file_and_writes_the_whole_payload(
    seed_cache: Path, tmp_path: Path
) -> None:
    entry = _entry(seed_cache)
    target = tmp_path / "payload.bin"
    code, _, err = invoke("show", str(entry), "--extract", str(target))
    assert code == 0, err
    written = int(err.split("wrote ")[1].split()[0])
    assert target.stat().st_size == written > 0
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()  # as open() makes a new file
    target.write_bytes(b"mine")
    code, _, err = invoke("show", str(entry), "--extract", str(target))
    assert code == 2 and "exists; not overwriting it" in err
    assert target.read_bytes() == b"mine"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _cli_with_file_size_limit(limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script where no file may grow past ``limit`` bytes (a full disk: writes
    past it fail with EFBIG)."""

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    assert SCRIPT
    return subprocess.run(
        [SCRIPT, *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        preexec_fn=limited,
        timeout=120,
        check=False,
    )


def test_a_write_that_fails_part_way_leaves_no_file(seed_cache: Path, tmp_path: Path) -> None:
    """``show --extract``, ``stats --html`` and a report written with ``-o`` on a disk that
    fills up part way."""
    entry = _entry(seed_cache)
    out = tmp_path / "out"
    out.mkdir()
    proc = _cli_with_file_size_limit(1000, "show", str(entry), "--extract", str(out / "x.bin"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"cachedoctor: io: cannot write {out / 'x.bin'}: File too large")
    assert "Traceback" not in proc.stderr
    assert list(out.iterdir()) == []
    report = out / "lint.json"
    proc = _cli_with_file_size_limit(
        1000, "lint", str(seed_cache), "--format", "json", "-o", str(report)
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"cachedoctor: io: cannot write {report}: File too large")
    assert list(out.iterdir()) == []
    page = out / "stats.html"
    proc = _cli_with_file_size_limit(1000, "stats", str(seed_cache), "--html", str(page))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"cachedoctor: io: cannot write {page}: File too large")
    assert list(out.iterdir()) == []
    whole = _cli_with_file_size_limit(1 << 20, "stats", str(seed_cache), "--html", str(page))
    assert whole.returncode == 0 and 1000 < page.stat().st_size < 1 << 20, whole.stderr
