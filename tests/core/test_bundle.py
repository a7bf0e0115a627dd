"""`cachedoctor pack` / `unpack`, with JAX as the oracle: every entry the unpack says will hit,
JAX hits (its own "Persistent compilation cache hit" lines) in a fresh process at the target;
relocated entries moved to their stable keys are hit by the stable hook there. Hand-made bytes
only for damaged and hostile bundles, which must be refused with nothing written."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.buckets import Servers
from tests.support.cli import run_cli
from tests.support.hookrun import base_env, entries
from tests.support.keylog import hits, run_logged

pytestmark = pytest.mark.slow

SEED_MODULES = {"jit_f", "jit_iota", "jit__multi_slice"}  # jit_f: a pointer key without the hook
PLAIN = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def _seed() -> Path:
    from cachedoctor.programs import program_path

    return Path(program_path("seed"))


def cd(*args: str) -> tuple[int, str]:
    """The CLI in a subprocess with the programs' 8 host devices (the preflight asks JAX)."""
    env = base_env(None, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    done = run_cli(*args, env=env)
    return done.returncode, done.stdout + done.stderr


def cd_json(*args: str, **extra: str) -> tuple[int, dict[str, Any]]:
    """``cd ARGS --json``, its environment that of the jobs (``extra``: their hook mode)."""
    env = base_env(None, XLA_FLAGS="--xla_force_host_platform_device_count=8", **extra)
    done = run_cli(*args, "--json", env=env)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_unpacked_where_it_was_packed_jax_hits_every_entry_it_says_will_hit(
    tmp_path: Path,
) -> None:
    """A CI cache restored at the path it was made at: pack, remove, unpack, and JAX (no hook)
    hits each entry the preflight calls a hit; the pointer-keyed jit_f entries stay out."""
    cache, bundle = tmp_path / "cache", tmp_path / "cache.tar"
    for _ in range(2):
        run_logged(cache, "stats", program=_seed())
    code, packed = cd_json("pack", str(cache), "-o", str(bundle))
    assert code == 0, packed
    assert {e["module"] for e in packed["entries"]} == SEED_MODULES - {"jit_f"}
    assert {e["why"] for e in packed["left_out"]} == {"pointer"} and len(packed["left_out"]) == 2
    original = {k: (cache / f"{k}-cache").read_bytes() for k in entries(cache)}
    shutil.rmtree(cache)

    code, dry = cd_json("unpack", str(bundle), str(cache))
    assert code == 0 and not cache.exists(), dry  # a dry run makes nothing
    assert {e["verdict"] for e in dry["entries"]} == {"hit"}, dry["entries"]
    code, done = cd_json("unpack", str(bundle), str(cache), "--apply")
    assert code == 0 and {e["action"] for e in done["entries"]} == {"written"}, done
    for key in entries(cache):
        assert (cache / f"{key}-cache").read_bytes() == original[key]
    assert hits(run_logged(cache, "stats", program=_seed())) == {
        e["module"] for e in done["entries"] if e["verdict"] == "hit"
    }
    code, again = cd_json("unpack", str(bundle), str(cache), "--apply")
    assert {e["action"] for e in again["entries"]} == {"present"}, again  # never replaced


def test_unpacked_elsewhere_relocated_entries_move_and_the_stable_hook_hits(
    tmp_path: Path,
) -> None:
    """Written under the observe hook at one path, unpacked at another: jax <= 0.10 hashes the
    autotune dir under the cache dir, so plain JAX misses there (the preflight says so; JAX's
    log agrees, on entries unpacked as they were); the unpack moves them to their stable keys,
    which the stable hook hits."""
    source, bundle = tmp_path / "a" / "cache", tmp_path / "x.tar"
    for _ in range(2):
        run_logged(source, "observe", program=_seed())
    assert cd("pack", str(source), "-o", str(bundle))[0] == 0
    kept = tmp_path / "kept" / "cache"
    code, plain = cd_json("unpack", str(bundle), str(kept), "--apply", "--no-relocate")
    said = {e["module"] for e in plain["entries"] if e["verdict"] == "hit"}
    assert hits(run_logged(kept, None, program=_seed(), env=PLAIN)) == said, plain["entries"]
    import jax

    relocates = tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 12)
    assert said == (set() if relocates else {e["module"] for e in plain["entries"]})
    assert code == (1 if relocates else 0) and plain["moved"] == []

    target = tmp_path / "b" / "cache"  # jobs with the stable hook: the unpack judges for them
    code, done = cd_json("unpack", str(bundle), str(target), "--apply", CACHEDOCTOR_HOOK="stable")
    if relocates:
        assert {old for old, _ in done["moved"]} == {e["key"] for e in done["entries"]}, done
        assert all("moved to its stable key" in e["words"] for e in done["entries"])
    said = {e["module"] for e in done["entries"] if e["verdict"] == "hit"}
    assert said == {e["module"] for e in done["entries"]}, done["entries"]
    assert hits(run_logged(target, "stable", program=_seed())) == said


def _hostile(tmp_path: Path, name: str, header_change: dict[str, Any] | None, data: bytes) -> Path:
    """A bundle of one member ``name`` holding ``data``, its header made from the data (then
    changed by ``header_change``)."""
    header: dict[str, Any] = {
        "format": "cachedoctor-bundle/1",
        "entries": [
            {
                "key": "jit_x-" + "a" * 64,
                "module": "jit_x",
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        ],
        "files": [],
        **(header_change or {}),
    }
    path = tmp_path / "hostile.tar"
    with tarfile.open(path, "w") as tar:
        for member, body in (
            ("cachedoctor-bundle.json", json.dumps(header).encode()),
            (name, data),
        ):
            info = tarfile.TarInfo(member)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path


@pytest.mark.parametrize(
    "case",
    ["random", "truncated", "digest", "traversal", "not-named", "no-header"],
)
def test_a_damaged_or_hostile_bundle_is_refused_and_nothing_is_written(
    tmp_path: Path, case: str
) -> None:
    target = tmp_path / "target"
    target.mkdir()
    good = b"\x28\xb5\x2f\xfd" + b"x" * 100
    if case == "random":
        bundle = tmp_path / "random.tar"
        bundle.write_bytes(hashlib.sha256(b"r").digest() * 300)
    elif case == "truncated":
        full = _hostile(tmp_path, "entries/jit_x-" + "a" * 64 + "-cache", None, good * 50)
        bundle = tmp_path / "truncated.tar"
        bundle.write_bytes(full.read_bytes()[:1500])
    elif case == "digest":
        bundle = _hostile(tmp_path, "entries/jit_x-" + "a" * 64 + "-cache", None, good)
        raw = bundle.read_bytes().replace(good, good[:-1] + b"y")
        bundle.write_bytes(raw)
    elif case == "traversal":
        files = [{"name": "../escape", "size": 1, "sha256": "0" * 64}]
        bundle = _hostile(tmp_path, "../escape", {"files": files}, good)
    elif case == "not-named":  # the header says one entry; the tar holds another name only
        bundle = _hostile(tmp_path, "entries/jit_y-" + "b" * 64 + "-cache", None, good)
    else:
        bundle = tmp_path / "plain.tar"
        with tarfile.open(bundle, "w") as tar:
            info = tarfile.TarInfo("README")
            tar.addfile(info, io.BytesIO(b""))
    for args in ((), ("--apply",)):
        code, out = cd("unpack", str(bundle), str(target), *args)
        assert code == 2, out
        assert out.startswith("cachedoctor: ") and len(out.strip().splitlines()) == 1, out
        assert "Traceback" not in out and "internal-error" not in out, out
    assert list(target.iterdir()) == []
    assert not (tmp_path / "escape").exists()


@pytest.mark.remote
def test_out_of_and_into_a_bucket(servers: Servers, tmp_path: Path) -> None:
    """Packed from s3://, unpacked into another s3:// prefix: the same bytes under the same
    keys, and the preflight judged each entry."""
    src = servers.url("s3", f"bundle/{tmp_path.name}/src")
    dst = servers.url("s3", f"bundle/{tmp_path.name}/dst")
    for _ in range(2):
        run_logged(src, "stable", program=_seed(), env=servers.env)
    bundle = tmp_path / "b.tar"
    code, packed = cd_json("pack", src, "-o", str(bundle))
    assert code == 0, packed
    code, done = cd_json("unpack", str(bundle), dst, "--apply", CACHEDOCTOR_HOOK="stable")
    assert {e["action"] for e in done["entries"]} == {"written"}, done
    assert {e["verdict"] for e in done["entries"]} <= {"hit", "miss", "unknown"}
    assert entries(dst) == sorted(e["key"] for e in packed["entries"])
    from cachedoctor.storage import stores

    a, b = stores.open_store(src), stores.open_store(dst)
    for key in entries(dst):
        with a.open_read(f"{key}-cache") as fa, b.open_read(f"{key}-cache") as fb:
            assert fa.read() == fb.read()
    said = {e["module"] for e in done["entries"] if e["verdict"] == "hit"}
    assert hits(run_logged(dst, "stable", program=_seed(), env=servers.env)) == said, done


def test_pack_follows_no_link_inside_the_cache(tmp_path: Path) -> None:
    """A record and an entry that are links to a file outside the cache: packed neither, the
    rest packed, the outside file's bytes nowhere in the bundle."""
    cache, bundle, outside = tmp_path / "cache", tmp_path / "b.tar", tmp_path / "secret"
    run_logged(cache, "stats", program=_seed())
    outside.write_bytes(b"outside-the-cache " * 10)
    (cache / "cachedoctor-stats" / "linked.json").symlink_to(outside)
    (cache / ("jit_zz-" + "a" * 64 + "-cache")).symlink_to(outside)
    code, packed = cd_json("pack", str(cache), "-o", str(bundle))
    assert code == 0 and packed["entries"], packed
    assert b"outside-the-cache" not in bundle.read_bytes()
    assert "jit_zz-" + "a" * 64 not in {e["key"] for e in packed["entries"]}


def test_an_entry_whose_read_fails_part_way_is_left_out_whole(
    seed_cache: Path, copy_of: Callable[[Path], Path], tmp_path: Path, monkeypatch: Any
) -> None:
    """Pack copies each entry a chunk at a time (never the whole bundle in memory): an entry
    whose read fails after its first chunk (EIO) is left out, saying why, none of its bytes
    stay, and every member packed has the bytes its header's digest names."""
    from cachedoctor.core import bundle, bundle_file
    from cachedoctor.storage.local_store import LocalStore
    from cachedoctor.storage.location import Location

    real_open, real_selected = LocalStore.open_read, bundle._selected
    failing: list[str] = []

    class FailsAfterOneRead:
        def __init__(self, f: Any) -> None:
            self.f, self.reads = f, 0

        def read(self, n: int = -1) -> bytes:
            self.reads += 1
            if self.reads > 1:
                raise OSError(errno.EIO, "Input/output error")
            return bytes(self.f.read(n))

        def __enter__(self) -> FailsAfterOneRead:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

    def open_read(store: LocalStore, name: str) -> Any:
        f = real_open(store, name)
        return FailsAfterOneRead(f) if name == f"{failing[0]}-cache" else f

    def selected(*args: Any, **kwargs: Any) -> Any:
        # the scan reads as always; the failure comes while the members are copied
        keep, *rest = real_selected(*args, **kwargs)
        failing.append(keep[0].key)
        monkeypatch.setattr(LocalStore, "open_read", open_read)
        return (keep, *rest)

    monkeypatch.setattr(bundle, "_selected", selected)
    out = tmp_path / "b.tar"
    report = bundle.pack(Location.parse(str(copy_of(seed_cache))), out)
    (left,) = [x for x in report.left_out if x.key == failing[0]]
    assert left.why == "damaged" and "Input/output error" in left.words
    assert report.entries and failing[0] not in {e.key for e in report.entries}
    with tarfile.open(out) as tar:
        header = json.loads(tar.extractfile(bundle_file.HEADER).read())  # type: ignore[union-attr]
        named = {f"entries/{e['key']}-cache": e["sha256"] for e in header["entries"]}
        named.update({f["name"]: f["sha256"] for f in header["files"]})
        members = [m for m in tar.getmembers() if m.name != bundle_file.HEADER]
        assert sorted(m.name for m in members) == sorted(named)
        for m in members:
            data = tar.extractfile(m).read()  # type: ignore[union-attr]
            assert hashlib.sha256(data).hexdigest() == named[m.name], m.name


def test_unpacked_into_a_cache_with_jax_lru_jax_still_stores(tmp_path: Path) -> None:
    """Trust IV: unpack wrote entries without -atime files into a cache with JAX's LRU, and
    JAX's eviction pass then failed every later put (FileNotFoundError): no new program was
    stored again. Now each entry comes with its -atime file, and JAX's next run with eviction on
    stores its new program (JAX's own log: no write error; the entry is there)."""
    from cachedoctor import layout
    from cachedoctor.programs import program_path
    from tests.support.caches import EVICT

    source, bundle, target = tmp_path / "src", tmp_path / "b.tar", tmp_path / "target"
    run_logged(source, None, program=_seed(), env=PLAIN)
    assert cd("pack", str(source), "-o", str(bundle))[0] == 0
    plain = program_path("plain")
    run_logged(target, None, program=plain, env={**PLAIN, **EVICT})  # JAX's LRU: .lockfile
    assert (target / layout.LOCKFILE).exists()
    _, done = cd_json("unpack", str(bundle), str(target), "--apply")
    written = [e["key"] for e in done["entries"] if e["action"] == "written"]
    before = set(entries(target))
    log = run_logged(
        target, None, program=plain, env={**PLAIN, **EVICT, "CACHEDOCTOR_PLAIN_SIZE": "48"}
    )
    assert "Error writing persistent compilation cache entry" not in log, log[-2000:]
    new = set(entries(target)) - before
    assert any(k.startswith("jit_g-") for k in new), new  # the new program was stored
    assert written and done.get("atime_files") == len(written), done
    for key in written:
        assert len((target / f"{key}{layout.ATIME_SUFFIX}").read_bytes()) == 8
