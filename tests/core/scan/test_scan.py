"""Every finding kind of `scan`, on real caches, plus the pure report logic."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from cachedoctor.cache import listdir
from cachedoctor.cache.jaxenv import JaxInfo, installed_jax
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.findings import Finding, FindingKind, Severity
from cachedoctor.core.scan.build import build_report
from cachedoctor.core.scan.report import ScanReport
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.storage.location import Location
from tests.support.caches import entries_of, make_cache, other_jax_python, raw_payload_layout
from tests.support.hookrun import base_env, compat_params
from tests.support.sessioncache import SharedBuilds


def kinds(report: ScanReport) -> dict[FindingKind, list[Finding]]:
    out: dict[FindingKind, list[Finding]] = {}
    for f in report.findings:
        out.setdefault(f.kind, []).append(f)
    return out


@pytest.mark.slow
def test_seed_cache_reports_unstable_key(seed_cache: Path) -> None:
    report = scan_directory(Location.parse(seed_cache))
    found = kinds(report)
    assert set(found) == {FindingKind.UNSTABLE_KEY}, report.findings
    (finding,) = found[FindingKind.UNSTABLE_KEY]
    assert finding.module == "jit_f"
    assert len(finding.entries) == 3
    assert "3 entries" in finding.message
    digests = {e.executable_digest for e in entries_of(report) if e.key in finding.entries}
    # jax 0.10.2 writes identical bytes; older releases differ in ids only
    expected = "identical executables" if len(digests) == 1 else "the same program"
    assert expected in finding.message
    assert finding.severity is Severity.WARNING
    stats = {m.module: m for m in report.modules}
    assert (stats["jit_f"].entries, stats["jit_f"].programs) == (3, 1)
    assert report.summary.platforms == (("cpu", report.summary.entries),)
    assert report.summary.corrupt == 0


@pytest.mark.slow
def test_plain_program_is_clean(cache_factory: Callable[..., Path]) -> None:
    cache = cache_factory("plain2", [("plain", {}), ("plain", {})])
    report = scan_directory(Location.parse(cache))
    assert report.findings == ()
    assert [m.entries for m in report.modules if m.module == "jit_g"] == [1]


@pytest.fixture(scope="session")
def relocated_cache(shared_builds: SharedBuilds) -> tuple[Path, Path]:
    """A plain cache written at A, copied to B, and the program run again at B."""

    def make(base: Path) -> None:
        make_cache(base / "a", [("plain", {})])
        shutil.copytree(base / "a", base / "b")
        make_cache(base / "b", [("plain", {})])

    base, _ = shared_builds("relocated", make)
    return base / "a", base / "b"


@pytest.mark.slow
def test_relocated_cache(relocated_cache: tuple[Path, Path]) -> None:
    a, b = relocated_cache
    info = installed_jax()
    report = scan_directory(Location.parse(b))
    found = kinds(report)
    if info.hashes_autotune_dir:
        (reloc,) = found[FindingKind.RELOCATED]
        assert str(a) in reloc.message
        assert "will never" in reloc.message
        assert "hashes that option into the key" in reloc.evidence
        # the run at B wrote a second entry for the same program: one cause, one finding
        assert FindingKind.UNSTABLE_KEY not in found
        assert FindingKind.SAME_PROGRAM not in found
    else:
        assert FindingKind.RELOCATED not in found
    # told that this JAX does not hash the path, nothing is relocated
    quiet = scan_directory(Location.parse(b), jax_info=JaxInfo("x", "x", False, False, None))
    assert FindingKind.RELOCATED not in kinds(quiet)


@pytest.mark.slow
def test_missing_atime_and_orphans(tmp_path: Path) -> None:
    cache = tmp_path / "lru"
    make_cache(cache, [("plain", {"JAX_COMPILATION_CACHE_MAX_SIZE": str(1 << 30)})])
    atimes = sorted(cache.glob("*-atime"))
    assert atimes, "JAX with eviction on writes -atime files"
    assert kinds(scan_directory(Location.parse(cache))) == {}
    atimes[0].unlink()
    missing_key = atimes[0].name.removesuffix("-atime")
    orphan = cache / ("jit_gone-" + "9" * 64 + "-atime")
    orphan.write_bytes((0).to_bytes(8, "little"))
    (cache / ("_temp_jit_g-" + "1" * 64)).write_bytes(b"partial")
    report = scan_directory(Location.parse(cache))
    found = kinds(report)
    (missing,) = found[FindingKind.MISSING_ATIME]
    # JAX 0.10's eviction pass fails on such an entry (an error); 0.12 evicts it first
    severity = Severity.WARNING if installed_jax().lru_evicts_without_atime else Severity.ERROR
    assert missing.entries == (missing_key,) and missing.severity is severity
    orphans = found[FindingKind.ORPHAN]
    assert {e for f in orphans for e in f.entries} == {orphan.name, "_temp_jit_g-" + "1" * 64}
    assert report.fails(severity)


@pytest.mark.slow
def test_corrupt_entries(seed_cache: Path, copy_of: Callable[[Path], Path]) -> None:
    cache = copy_of(seed_cache)
    victim = sorted(cache.glob("jit_g-*-cache"))[0]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    old = 1_000_000_000
    os.utime(victim, (old, old))
    report = scan_directory(Location.parse(cache))
    (corrupt,) = kinds(report)[FindingKind.CORRUPT]
    assert corrupt.entries == (victim.name.removesuffix("-cache"),)
    assert corrupt.severity is Severity.ERROR
    assert "cut short" in corrupt.message
    # a very young truncated file may be a write in progress: only a warning
    os.utime(victim, None)
    young = kinds(scan_directory(Location.parse(cache)))[FindingKind.CORRUPT][0]
    assert young.severity is Severity.WARNING and "in progress" in young.message


@pytest.mark.slow
def test_insecure_permissions_and_symlinks(
    seed_cache: Path, copy_of: Callable[[Path], Path], tmp_path: Path
) -> None:
    cache = copy_of(seed_cache)
    cache.chmod(0o777)
    entry = sorted(cache.glob("jit_g-*-cache"))[0]
    entry.chmod(0o666)
    outside = tmp_path / "outside"
    outside.write_bytes(b"not a cache entry")
    (cache / ("jit_link-" + "4" * 64 + "-cache")).symlink_to(outside)
    report = scan_directory(Location.parse(cache))
    insecure = kinds(report)[FindingKind.INSECURE]
    messages = " | ".join(f.message for f in insecure)
    assert "writable by group and others" in messages
    assert "1 entry is writable" in messages
    assert "1 symbolic link in" in messages
    assert report.fails(Severity.ERROR)
    assert outside.read_bytes() == b"not a cache entry"
    assert FindingKind.CORRUPT not in kinds(report)  # a link is reported, not decoded
    cache.chmod(0o700)


@pytest.mark.slow
def test_unknown_files_are_reported_and_kept(
    seed_cache: Path, copy_of: Callable[[Path], Path]
) -> None:
    cache = copy_of(seed_cache)
    (cache / "notes.txt").write_text("mine")
    (cache / "somedir").mkdir()
    (unknown,) = kinds(scan_directory(Location.parse(cache)))[FindingKind.UNKNOWN_FILE]
    assert set(unknown.entries) == {"notes.txt", "somedir"}
    assert (cache / "notes.txt").read_text() == "mine"


def _fake(key: str, fmt: str, platform: str, ifrt: int | None = None) -> EntryInfo:
    return EntryInfo(
        key=key,
        module=key.split("-")[0],
        path=f"/x/{key}-cache",
        size=10,
        mtime_ns=0,
        payload_format=fmt,
        ifrt_version=ifrt,
        platform=platform,
    )


def test_mixtures_from_report_logic(tmp_path: Path) -> None:
    """Mixed formats/platforms need entries no single CPU JAX writes: test the pure logic."""
    listing = listdir.list_cache(tmp_path)
    entries = [
        _fake("jit_a-" + "1" * 64, "pjrt", "cpu"),
        _fake("jit_b-" + "2" * 64, "ifrt", "cpu", 3),
        _fake("jit_c-" + "3" * 64, "ifrt", "gpu", 3),
    ]
    report = build_report(listing, entries, installed_jax(), now=0)
    found = kinds(report)
    assert "1× pjrt" in found[FindingKind.MIXED_VERSIONS][0].message
    assert "2× ifrt-v3" in found[FindingKind.MIXED_VERSIONS][0].message
    assert "gpu" in found[FindingKind.MIXED_PLATFORMS][0].message
    assert all(f.severity is Severity.INFO for f in report.findings)
    assert not report.fails(Severity.WARNING)
    assert report.fails(Severity.INFO)
    assert not report.fails(Severity.INFO, ignore=["mixed-versions", "mixed-platforms"])


@pytest.mark.slow
def test_mixed_versions_from_two_real_jax(tmp_path: Path) -> None:
    make_cache(tmp_path / "c", [("plain", {})])
    make_cache(tmp_path / "c", [("plain", {})], python=other_jax_python())
    layouts = Counter(raw_payload_layout(p) for p in (tmp_path / "c").glob("*-cache"))
    assert layouts["pjrt"] and len(layouts) == 2, layouts  # the ground: the raw bytes
    (mixed,) = kinds(scan_directory(Location.parse(tmp_path / "c")))[FindingKind.MIXED_VERSIONS]
    for layout, count in layouts.items():
        assert f"{count}× {layout}" in mixed.message


def test_unreadable_directory_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        scan_directory(Location.parse(tmp_path / "missing"))
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OSError):
        scan_directory(Location.parse(f))
    assert stat.S_ISREG(f.stat().st_mode)


@pytest.mark.slow
def test_streamed_json_is_the_whole_document(
    seed_cache: Path, copy_of: Callable[[Path], Path], tmp_path: Path
) -> None:
    """`scan --json` writes its entries one at a time; the text is exactly the whole document's."""
    from cachedoctor.render.jsonout import dumps, iter_scan_json, scan_document

    d = copy_of(seed_cache)
    first = sorted(d.glob("*-cache"))[0]
    (d / f"jit_cut-{'a' * 64}-cache").write_bytes(first.read_bytes()[:100])  # a problem entry
    empty = tmp_path / "empty"
    empty.mkdir()
    for cache in (d, empty):
        report = scan_directory(Location.parse(cache), now=2e9)
        streamed = "".join(iter_scan_json(report))
        assert streamed == dumps(scan_document(report))
        assert len(json.loads(streamed)["entries"]) == len(entries_of(report))


@pytest.mark.slow
def test_module_table_says_how_the_hook_keyed_each_module(tmp_path: Path) -> None:
    """Under the hook in stable mode the seed's custom_partitioning module is keyed by replay,
    a plain jit statically; scan shows both, with why, from the key manifests."""
    import subprocess
    import sys

    from tests.support.hookrun import base_env, run_program

    cache = tmp_path / "cache"
    run_program("seed", cache, mode="stable")
    run_program("plain", cache, mode="stable")
    doc = json.loads(
        subprocess.run(
            [sys.executable, "-m", "cachedoctor", "scan", "--json", str(cache)],
            env=base_env(None),
            capture_output=True,
            text=True,
        ).stdout
    )
    modes = {m["module"]: m["key_modes"] for m in doc["modules"]}
    (replayed,) = modes["jit_f"]
    assert replayed["mode"] == "replay" and replayed["entries"] == 1
    assert "recorded partitioner call(s)" in replayed["reason"]
    assert [m["mode"] for m in modes["jit_g"]] == ["static"]
    table = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "scan", str(cache)],
        env={**base_env(None), "COLUMNS": "250"},
        capture_output=True,
        text=True,
    ).stdout
    row = next(line for line in table.splitlines() if line.lstrip().startswith("jit_f"))
    assert "replay: " in row and "recorded partitioner call(s)" in row, table
    assert "static" in next(line for line in table.splitlines() if "jit_g" in line)


@pytest.mark.slow
def test_status_summarises_key_modes_of_the_configured_cache(tmp_path: Path) -> None:
    """`status` lists the modules per key mode from the configured cache dir's manifests."""
    import subprocess
    import sys

    from tests.support.hookrun import base_env, run_program

    cache = tmp_path / "cache"
    run_program("seed", cache, mode="stable")
    run_program("plain", cache, mode="stable")
    env = base_env(cache, CACHEDOCTOR_HOOK="stable")
    status = [sys.executable, "-m", "cachedoctor", "status"]
    doc = json.loads(subprocess.run([*status, "--json"], env=env, capture_output=True).stdout)
    assert "jit_f" in doc["key_modes"]["modes"]["replay"]
    assert "jit_g" in doc["key_modes"]["modes"]["static"]
    assert doc["key_modes"]["fallbacks"] == {}
    text = subprocess.run(status, env=env, capture_output=True, text=True).stdout
    replay_line = next(line for line in text.splitlines() if line.strip().startswith("replay"))
    assert replay_line.split()[1:] == ["1", "jit_f"], text


def _regular_and_links(cache: Path) -> tuple[int, int]:
    """The oracle for the entry counts: lstat, not our listing."""
    names = [p for p in cache.iterdir() if p.name.endswith("-cache")]
    links = sum(1 for p in names if p.is_symlink())
    return len(names) - links, links


def _summary_line(out: str, name: str) -> str:
    """One row of the text summary, its padding collapsed."""
    return " ".join(next(line for line in out.splitlines() if line.startswith(name)).split())


@pytest.mark.slow
def test_counts_add_up_with_a_link_bad_files_and_an_orphan_atime(
    seed_cache: Path, copy_of: Callable[[Path], Path], tmp_path: Path
) -> None:
    """Issue 29 (7): a link is no entry, undecodable files no program, and an -atime file of no
    entry is no evidence that eviction runs on the entries (JAX wrote this cache without it)."""
    from cachedoctor.core.prune.actions import Op
    from cachedoctor.core.prune.options import PruneOptions
    from cachedoctor.core.prune.planner import plan_prune
    from tests.support.cli import invoke

    cache = copy_of(seed_cache)
    assert not (cache / ".lockfile").exists()
    for atime in cache.glob("*-atime"):  # jax 0.4.38 writes one beside every entry, LRU or not
        atime.unlink()
    good = sorted(cache.glob("jit_g-*-cache"))[0]
    (cache / f"jit_link-{'4' * 64}-cache").symlink_to(good.name)
    (cache / f"jit_trunc-{'5' * 64}-cache").write_bytes(good.read_bytes()[:100])
    (cache / f"jit_empty-{'6' * 64}-cache").write_bytes(b"")
    for bad in cache.glob("jit_[te]*-cache"):
        os.utime(bad, (1e9, 1e9))  # old: damaged, not a write in progress
    (cache / f"jit_gone-{'9' * 64}-atime").write_bytes((0).to_bytes(8, "little"))
    regular, links = _regular_and_links(cache)
    assert links == 1

    report = scan_directory(Location.parse(cache))
    s = report.summary
    assert (s.entries, s.symlinks, s.corrupt) == (regular, 1, 2)
    assert sum(m.entries for m in report.modules) == s.entries
    rows = {m.module: m for m in report.modules}
    assert "jit_link" not in rows  # a link is not an entry: the insecure finding names it
    assert [
        (rows[m].entries, rows[m].programs, rows[m].undecodable) for m in ("jit_trunc", "jit_empty")
    ] == [(1, 0, 1)] * 2
    assert s.bytes_on_disk == sum(
        p.stat().st_size for p in cache.glob("*-cache") if not p.is_symlink()
    )
    assert (s.eviction_in_use, s.entry_atime_files, s.orphan_atime_files) == (False, 0, 1)
    found = kinds(report)
    assert FindingKind.MISSING_ATIME not in found
    assert [f.entries for f in found[FindingKind.ORPHAN]] == [(f"jit_gone-{'9' * 64}-atime",)]

    _, out, _ = invoke("scan", str(cache))
    assert _summary_line(out, "entries") == (
        f"entries {regular} (2 undecodable; +1 symbolic link named -cache, not followed)"
    )
    assert _summary_line(out, "LRU eviction") == "LRU eviction off (1 -atime file without an entry)"
    plan = plan_prune(Location.parse(cache), PruneOptions(repair=True))
    assert not [a for a in plan.actions if a.op is Op.RECREATE_ATIME]
    assert not plan.eviction_in_use


@pytest.mark.slow
def test_lru_line_and_missing_atime_agree(
    evict_cache: Path, copy_of: Callable[[Path], Path]
) -> None:
    """JAX with eviction on wrote an -atime file beside each entry and its .lockfile; with one
    -atime file gone and an orphan added, both statements count only the entries' -atime files."""
    cache = copy_of(evict_cache)
    keys = sorted(p.name.removesuffix("-cache") for p in cache.glob("*-cache"))
    assert all((cache / f"{k}-atime").exists() for k in keys) and (cache / ".lockfile").exists()
    (cache / f"{keys[0]}-atime").unlink()
    (cache / f"jit_gone-{'9' * 64}-atime").write_bytes((0).to_bytes(8, "little"))
    with_atime = len(keys) - 1

    report = scan_directory(Location.parse(cache))
    s = report.summary
    assert (s.eviction_in_use, s.lockfile, s.entry_atime_files, s.orphan_atime_files) == (
        True,
        True,
        with_atime,
        1,
    )
    # as the installed JAX's eviction pass treats an entry without one (jax 0.12 evicts it
    # first; up to 0.10 the pass fails and stops all writes)
    evicts_first = installed_jax().lru_evicts_without_atime
    (missing,) = kinds(report)[FindingKind.MISSING_ATIME]
    assert missing.severity is (Severity.WARNING if evicts_first else Severity.ERROR)
    assert missing.entries == (keys[0],)

    (cache / ".lockfile").unlink()  # a copy without dot files: the -atime files stay evidence
    report = scan_directory(Location.parse(cache))
    (missing,) = kinds(report)[FindingKind.MISSING_ATIME]
    assert missing.severity is Severity.WARNING and missing.entries == (keys[0],)
    if evicts_first:
        assert "evicts them first" in missing.message, missing.message
    else:
        assert f"{with_atime} entries have one" in missing.message
    assert "does not seem to run" not in missing.message
    from tests.support.cli import invoke

    _, out, _ = invoke("scan", str(cache))
    assert _summary_line(out, "LRU eviction") == (
        f"LRU eviction in use (-atime files beside {with_atime} of {len(keys)} entries; "
        "no .lockfile; 1 -atime file without an entry)"
    )


@pytest.mark.slow
def test_an_undecodable_entry_adds_no_compile_time(
    seed_cache: Path, copy_of: Callable[[Path], Path]
) -> None:
    """A damaged entry whose first four bytes read as 19,352,772 s: its bytes are no compile
    time, so the total stays what JAX's entries hold, and the summary counts it as without."""
    import zstandard

    cache = copy_of(seed_cache)
    before = scan_directory(Location.parse(cache)).summary
    assert before.without_compile_time == 0
    head = (19_352_772).to_bytes(4, "big")
    damaged = zstandard.ZstdCompressor().compress(head + b"\x0a\xff" + os.urandom(64))
    (cache / ("jit_f-" + "ab" * 32 + "-cache")).write_bytes(damaged)
    after = scan_directory(Location.parse(cache)).summary
    assert after.entries == before.entries + 1 and after.corrupt == before.corrupt + 1
    assert after.compile_seconds == before.compile_seconds
    assert after.without_compile_time == 1
    module = next(m for m in scan_directory(Location.parse(cache)).modules if m.module == "jit_f")
    assert module.compile_seconds < 19_352_772


@pytest.mark.slow
@pytest.mark.parametrize("python", compat_params())
def test_a_moved_copy_of_another_jaxlib_is_not_called_relocated(
    tmp_path: Path, python: str
) -> None:
    """Another jaxlib's cache, copied to another path: JAX misses its entries even at the path
    they were written for (its own log says so), so they are another jaxlib's, never
    `relocated`; `prune --stale-jax`, as the advice says, removes them."""
    import subprocess
    import sys

    from tests.support.hookrun import MISS_RE, run_program

    orig, moved = tmp_path / "orig", tmp_path / "moved"
    orig.mkdir()
    run_program("plain", orig, mode="none", python=python)
    shutil.copytree(orig, moved)
    keys = sorted(str(i.key) for i in listdir.list_cache(moved).entries)
    report = scan_directory(Location.parse(moved))
    kinds = {f.kind for f in report.findings}
    assert FindingKind.RELOCATED not in kinds, [f.message for f in report.findings]
    if installed_jax().hashes_autotune_dir is False:
        pytest.skip("this JAX does not hash the autotune path: no copy is relocated for it")
    (other,) = [f for f in report.findings if f.kind is FindingKind.MIXED_VERSIONS]
    assert sorted(other.entries) == keys and "another jaxlib" in other.message, other
    assert "prune --stale-jax" in other.advice

    # JAX's own behaviour: this JAX misses them at the spelling they were written for
    log = run_program("plain", orig, mode="none").stderr
    assert "jit_g" in MISS_RE.findall(log), log[-3000:]

    # the installed jaxlib never wrote here: whether the other version still runs on this copy
    # cannot be told, so --stale-jax keeps them and says so; --stale-jax-in-use removes them
    argv = [sys.executable, "-m", "cachedoctor", "prune", str(moved), "--stale-jax", "--apply"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=base_env(None), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(str(i.key) for i in listdir.list_cache(moved).entries) == keys
    assert "--stale-jax-in-use" in proc.stdout and "wrote no entry" in proc.stdout, proc.stdout
    argv[-1:] = ["--stale-jax-in-use", "--apply"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=base_env(None), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert not listdir.list_cache(moved).entries


@pytest.mark.slow
@pytest.mark.parametrize("python", [pytest.param(sys.executable, id="this-jax"), *compat_params()])
def test_an_entry_without_its_atime_file_is_judged_as_jax_treats_it(
    tmp_path: Path, python: str
) -> None:
    """An entry written with the LRU off, then a put with it on: JAX 0.10 fails the put (its
    eviction pass reads the missing -atime file), 0.12 writes (it takes such an entry as the
    least recently used). The scan of that JAX's cachedoctor says what that JAX's log says."""
    import subprocess

    program = Path(__file__).resolve().parents[2] / "support" / "callbacks_program.py"
    cache = tmp_path / "cache"
    cache.mkdir()
    logs = []
    for function, lru in (
        ("plain", {}),
        ("other", {"JAX_COMPILATION_CACHE_MAX_SIZE": "1000000000"}),
    ):
        proc = subprocess.run(
            [python, str(program), function],
            capture_output=True, text=True, env=base_env(cache, **lru), timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        logs.append(proc.stderr)
    failed = "Error writing persistent compilation cache entry for 'jit_other'" in logs[1]
    assert "Writing jit_other to persistent compilation cache" in logs[1], logs[1][-3000:]
    assert failed == ("FileNotFoundError" in logs[1]), logs[1][-3000:]  # the -atime file's
    assert any(cache.glob("jit_other-*-cache")) is not failed

    proc = subprocess.run(
        [python, "-m", "cachedoctor", "scan", str(cache), "--json"],
        capture_output=True, text=True, env=base_env(None), timeout=300,
    )  # fmt: skip
    found = [f for f in json.loads(proc.stdout)["findings"] if f["kind"] == "missing-atime"]
    if all(Path(f"{e}".removesuffix("-cache") + "-atime").exists() for e in cache.glob("*-cache")):
        # jax 0.4.38's eviction pass gave the earlier entry an -atime file itself: none lacks one
        assert not failed and not found, found
        return
    (missing,) = found
    if failed:
        assert missing["severity"] == "error", missing
        assert "fails its eviction pass" in missing["message"], missing
    else:
        assert missing["severity"] == "warning", missing
        assert "evicts them first" in missing["message"], missing
        assert "fails" not in missing["message"], missing
