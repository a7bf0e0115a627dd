"""The scan index travels with the cache (issue 26): a copy restored elsewhere (new path, inodes,
mtimes, an empty user cache dir) is served from the index inside it, but never a row whose
file's bytes differ; JAX's LRU eviction leaves the index alone; two scans may write it at once;
a cache this user may not write keeps its index in the user cache dir.

The oracles: a scan without any index (``CACHEDOCTOR_NO_INDEX=1``) of the same state, a fresh
decode of the changed entry, and JAX's own eviction (its debug log names what it evicts).
Caches are real (session builds, copied).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cachedoctor import layout
from cachedoctor.cache import index, index_file, parallel, reader, travel
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.render.jsonout import dumps, scan_document
from cachedoctor.storage.location import Location
from tests.support import sessioncache
from tests.support.caches import EVICT, cli_env, entries_of, make_cache, needs_filelock

pytestmark = pytest.mark.slow  # JAX-written caches, the CLI and JAX in subprocesses

NOW = 2_000_000_000.0
OPTIONS = (reader.DEFAULT_MAX_DECOMPRESSED,)


@pytest.fixture(autouse=True)
def _travelling_index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-first"))
    monkeypatch.delenv(index_file.DISABLE_ENV, raising=False)
    monkeypatch.delenv(travel.IN_CACHE_ENV, raising=False)  # every cache here is a copy
    monkeypatch.setattr(index, "RACY_S", 0.0)  # copies were just made: store them anyway


@pytest.fixture
def cache(seed_cache: Path, copy_of: Callable[[Path], Path]) -> Path:
    return copy_of(seed_cache)


def entry_names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(layout.CACHE_SUFFIX))


def restored(cache: Path, where: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``cp -r`` of the cache (new path, inodes, mtimes and ctimes: a CI restore), seen from a
    fresh user cache dir."""
    where.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-r", str(cache), str(where)], check=True)
    assert (where / layout.INDEX_DIRNAME / layout.INDEX_FILENAME).is_file()
    before = {p.name: p.stat() for p in cache.iterdir() if p.is_file()}
    after = {p.name: p.stat() for p in where.iterdir() if p.is_file()}
    assert all(after[n].st_ino != before[n].st_ino for n in before)
    monkeypatch.setenv("XDG_CACHE_HOME", str(where.parent / "xdg-restored"))
    return where


def digests_made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``travel.file_digest`` hashes from now on (in this process), in order."""
    hashed: list[str] = []
    real = travel.file_digest

    def counting(path: str, size: int) -> str | None:
        hashed.append(path)
        return real(path, size)

    monkeypatch.setattr(travel, "file_digest", counting)
    return hashed


def report(d: Path, use_index: bool = True) -> str:
    return dumps(scan_document(scan_directory(Location.parse(d), now=NOW, use_index=use_index)))


def cli_json(d: Path, **env: str) -> dict[str, object]:
    """``cachedoctor scan --json`` in a fresh process, its timestamp left out."""
    proc = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "scan", "--json", str(d)],
        env={**cli_env(), **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict)
    doc.pop("scanned_at")
    return doc


def test_restored_copy_is_served_from_its_index(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes: list[str]
) -> None:
    report(cache)  # the last CI run: its index is written into the cache
    copy = restored(cache, tmp_path / "elsewhere" / "jax-cache", monkeypatch)
    aside = tmp_path / "aside"
    (copy / layout.INDEX_DIRNAME).rename(aside)
    expected = report(copy, use_index=False)  # the copy as it would be without the folder
    aside.rename(copy / layout.INDEX_DIRNAME)
    decodes.clear()
    assert report(copy) == expected
    assert decodes == []  # every entry came from the index that came with the copy
    fallback = index_file.fallback_path(copy)
    assert not fallback.exists()  # nothing of it in the (fresh) user cache dir
    # a CI runner scans a restored copy once: its files' identities are learnt by a second
    # scan in this place (served by digest again), and then the next scan hashes nothing
    assert not index.load(str(copy), OPTIONS).place_ok
    assert index.load(str(copy), OPTIONS).seen_here
    assert report(copy) == expected and decodes == []
    assert index.load(str(copy), OPTIONS).place_ok
    hashed = digests_made(monkeypatch)
    monkeypatch.setattr(travel, "hash_entries_of_dir", lambda *a: pytest.fail("hashed early"))
    assert report(copy) == expected
    assert decodes == [] and hashed == []
    # and the CLI, in a fresh process: the same document as without any index
    again = restored(cache, tmp_path / "third" / "jax-cache", monkeypatch)
    with_index = cli_json(again)
    assert with_index == cli_json(again, CACHEDOCTOR_NO_INDEX="1")
    assert with_index["entries"]


def test_a_copy_made_just_now_is_hashed_again(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes: list[str]
) -> None:
    """A file changed within the racy window may change again within one timestamp tick: a row
    served by its digest keeps only its file's size then, and the next scan hashes it again."""
    report(cache)
    copy = restored(cache, tmp_path / "ci" / "jax-cache", monkeypatch)
    monkeypatch.setattr(index, "RACY_S", 3600.0)  # every file of the copy is young
    expected = report(copy, use_index=False)
    decodes.clear()
    assert report(copy) == expected and decodes == []
    assert report(copy) == expected and decodes == []  # the second scan here learns identities
    sizes = {p.name: p.stat().st_size for p in copy.iterdir() if p.name in entry_names(copy)}
    rows = index.load(str(copy), OPTIONS).entries
    assert rows == {name: f"{size}:" for name, size in sizes.items()}
    hashed = digests_made(monkeypatch)
    assert report(copy) == expected and decodes == []
    assert sorted(os.path.basename(p) for p in hashed) == sorted(sizes)


@pytest.mark.parametrize("offset", ["magic", "middle"])
def test_a_flipped_byte_is_decoded_afresh(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes: list[str], offset: str
) -> None:
    """Same name, size and mtime as the row's file, one byte different: the digest differs."""
    report(cache)
    copy = restored(cache, tmp_path / "ci" / "jax-cache", monkeypatch)
    victim = copy / entry_names(copy)[0]
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[0 if offset == "magic" else len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    fresh = reader.decode_entry(victim)
    decodes.clear()
    got = {e.path: e for e in entries_of(scan_directory(Location.parse(copy), now=NOW))}
    assert decodes == [victim.name]  # that entry alone
    assert got[str(victim)] == fresh
    if offset == "magic":  # its verdict: corrupt, as a scan without index says
        assert [p.kind for p in got[str(victim)].problems] == ["not-compressed"]
    assert report(copy) == report(copy, use_index=False)


def test_index_rows_follow_the_entries(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prune --apply`` never names the folder, and the rows of the entries it removes go."""
    report(cache)
    gone = entry_names(cache)[0]
    (cache / "stray.tmp").write_bytes(b"x")  # something for a dry run to list
    env = {**cli_env(), "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}
    argv = [sys.executable, "-m", "cachedoctor", "prune", "--orphans", "--stale-after", "0"]
    dry = subprocess.run([*argv, str(cache)], env=env, capture_output=True, text=True, check=False)
    assert dry.returncode == 0, dry.stderr
    assert "stray.tmp" in dry.stdout and layout.INDEX_DIRNAME not in dry.stdout + dry.stderr
    (cache / gone).unlink()  # as prune --apply or JAX's eviction removes an entry
    report(cache)
    rows = index.load(str(cache), OPTIONS).entries
    assert sorted(rows) == entry_names(cache) and gone not in rows


def test_jax_lru_eviction_evicts_only_entries(evict_cache: Path, tmp_path: Path) -> None:
    """JAX with ``jax_compilation_cache_max_size`` over a cache holding the index folder
    evicts what it evicts from the same cache without the folder (its debug log names each
    entry), and leaves the folder as it was; the next scan drops the evicted entries' rows."""
    needs_filelock()
    with_index, without = tmp_path / "a" / "cache", tmp_path / "b" / "cache"  # entries hash
    for copy in (with_index, without):  # the cache's path: two of the same length
        sessioncache.copy_as_written(evict_cache, copy)
    report(with_index)
    folder = with_index / layout.INDEX_DIRNAME
    index_bytes = (folder / layout.INDEX_FILENAME).read_bytes()
    sizes = {p.name: p.stat().st_size for p in with_index.glob(f"*{layout.CACHE_SUFFIX}")}
    assert len(index_bytes) > sum(sizes.values())  # counted, it would evict every entry
    env = {**EVICT, "JAX_COMPILATION_CACHE_MAX_SIZE": str(sum(sizes.values()))}
    env |= {"CACHEDOCTOR_PLAIN_SIZE": "256", "JAX_LOGGING_LEVEL": "DEBUG"}

    def evict(cache: Path) -> tuple[list[str], tuple[list[str], int]]:
        (run,) = make_cache(cache, [("plain", env)])
        assert "persistent compilation cache entry" not in run.stderr, run.stderr[-3000:]
        evicted = sorted(re.findall(r"Evicting cache entry '([^']+)'", run.stderr))
        names = {p.name for p in cache.iterdir() if p.name != layout.INDEX_DIRNAME}
        old = sorted(n for n in names if n in sizes)
        return evicted, (old, len(names) - len(old))  # new keys hash the path: counted

    evicted, kept = evict(with_index)
    assert evicted  # the new entries did not fit: JAX evicted some
    assert (evicted, kept) == evict(without)
    assert all(k + layout.CACHE_SUFFIX in sizes for k in evicted)  # entries, and only those
    assert (folder / layout.INDEX_FILENAME).read_bytes() == index_bytes
    report(with_index)  # the next scan drops the rows of what JAX evicted
    assert sorted(index.load(str(with_index), OPTIONS).entries) == entry_names(with_index)


def test_two_scans_at_once(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes scan (and write the index) at once, on a first scan and on a restored
    copy: both report what a scan without index does, and the index serves the next scan."""
    more = tmp_path / "more"
    shutil.copytree(cache, more)
    for n, path in enumerate(sorted(more.glob(f"*{layout.CACHE_SUFFIX}"))):
        for k in range(40):  # copies under other keys: enough rows to overlap the writes
            key = f"jit_copy{n}_{k}-{os.urandom(32).hex()}{layout.CACHE_SUFFIX}"
            shutil.copyfile(path, cache / key)
    shutil.rmtree(more)
    time.sleep(2.5)  # a scan in another process never stores files changed in the last 2 s
    env = {**cli_env(), "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}

    def both(d: Path) -> None:
        expected = cli_json(d, CACHEDOCTOR_NO_INDEX="1")
        argv = [sys.executable, "-m", "cachedoctor", "scan", "--json", str(d)]
        procs = [
            subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(2)
        ]
        for proc in procs:
            out, err = proc.communicate(timeout=600)
            assert proc.returncode in (0, 1) and not err, err.decode()
            doc = json.loads(out)
            doc.pop("scanned_at")
            assert doc == expected

    both(cache)  # both decode everything and write a whole index (renamed over)
    assert sorted(index.load(str(cache), OPTIONS).entries) == entry_names(cache)
    copy = restored(cache, tmp_path / "ci" / "jax-cache", monkeypatch)
    env["XDG_CACHE_HOME"] = os.environ["XDG_CACHE_HOME"]
    both(copy)  # both serve by digest and update the rows in place
    loaded = index.load(str(copy), OPTIONS)
    assert loaded.loaded and sorted(loaded.entries) == entry_names(copy)
    monkeypatch.setenv(parallel.WORKERS_ENV, "1")
    assert cli_json(copy) == cli_json(copy, CACHEDOCTOR_NO_INDEX="1")


def _not_writable(cache: Path) -> None:
    """Make ``cache`` one this user may not write into: read-only for a user, another
    user's (nobody's) for root, whom no mode stops."""
    if os.geteuid() == 0:
        os.chown(cache, 65534, 65534)
    else:
        cache.chmod(0o555)


def test_cache_not_writable_keeps_its_index_in_the_user_cache_dir(
    cache: Path, decodes: list[str]
) -> None:
    _not_writable(cache)
    try:
        expected = report(cache, use_index=False)
        assert report(cache) == expected
        assert not (cache / layout.INDEX_DIRNAME).exists()
        assert index_file.index_path(cache) == index_file.fallback_path(cache)
        assert index_file.fallback_path(cache).is_file()
        decodes.clear()
        assert report(cache) == expected
        assert decodes == []  # served from the user cache dir's index
    finally:
        cache.chmod(0o755)


def test_opt_out_keeps_the_index_out_of_the_cache(
    cache: Path, monkeypatch: pytest.MonkeyPatch, decodes: list[str]
) -> None:
    monkeypatch.setenv(travel.IN_CACHE_ENV, "0")
    report(cache)
    assert not (cache / layout.INDEX_DIRNAME).exists()
    decodes.clear()
    report(cache)
    assert decodes == [] and index_file.fallback_path(cache).is_file()


def test_nothing_is_written_into_a_folder_without_entries(tmp_path: Path) -> None:
    """A folder named by mistake (a checkout) or an empty cache gets no index folder."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "README.md").write_text("not a cache")
    scan_directory(Location.parse(checkout), now=NOW)
    scan_directory(Location.parse(checkout), now=NOW)
    assert sorted(p.name for p in checkout.iterdir()) == ["README.md"]
