"""One bucket service is one module: ``storage/backends`` holds what differs between them.

A service registered in the test (``memory://``, fsspec's in-memory filesystem with generations
of its own) is parsed, listed, read and pruned through ``Location`` and ``RemoteStore`` with
nothing else changed: no module outside ``storage/backends/`` names a service.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cachedoctor.errors import CachedoctorError
from cachedoctor.storage import backends, stores, urls
from cachedoctor.storage.backends import Failure, Op
from cachedoctor.storage.fileid import FileId
from cachedoctor.storage.location import Location
from cachedoctor.storage.model import DeleteOutcome, MissingExtraError
from cachedoctor.storage.remote_store import RemoteStore
from cachedoctor.storage.store_dir import StoreDir

SRC = Path(__file__).resolve().parents[2] / "src" / "cachedoctor"
ENDPOINT = "CACHEDOCTOR_TEST_MEMORY_ENDPOINT"


class Refused(Exception):
    """The fake service's refusal, with its code (as botocore's ClientError carries one)."""

    def __init__(self, code: str) -> None:
        super().__init__(f"refused: {code}")
        self.service_code = code


def _versioned_memory() -> type[Any]:
    """fsspec's memory filesystem with a store of its own and a generation per write."""
    memory = pytest.importorskip("fsspec.implementations.memory")
    counter = itertools.count(1)

    base: Any = memory.MemoryFileSystem

    class VersionedMemory(base):  # type: ignore[misc]
        store: dict[str, Any] = {}  # noqa: RUF012 - fsspec's own shape, one per test
        pseudo_dirs = [""]  # noqa: RUF012
        generations: dict[str, int] = {}  # noqa: RUF012

        def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kw: Any) -> None:
            super().pipe_file(path, value, mode=mode, **kw)
            self.generations[self._strip_protocol(path)] = next(counter)

        def _versioned(self, info: dict[str, Any]) -> dict[str, Any]:
            generation = self.generations.get(info["name"])
            return {**info, "generation": generation} if info["type"] == "file" else info

        def ls(self, path: str, detail: bool = True, **kw: Any) -> Any:
            found = super().ls(path, detail=detail, **kw)
            return [self._versioned(i) for i in found] if detail else found

        def info(self, path: str, **kw: Any) -> dict[str, Any]:
            return self._versioned(super().info(path, **kw))

    return VersionedMemory


class MemoryBackend:
    """All a new service needs: the ``Backend`` attributes and methods, nothing elsewhere."""

    scheme = "memory"
    article = "a"
    package = "fsspec"
    extra = "memory"
    endpoint_variables: tuple[str, ...] = (ENDPOINT,)
    strip_listed_names = True
    failures: Mapping[Op, Mapping[str, Failure]] = {
        Op.HEAD: {"missing": Failure.GONE},
        Op.CREATE: {},
        Op.DELETE: {"missing": Failure.GONE, "mismatch": Failure.CHANGED},
    }

    def __init__(self) -> None:
        self.cls = _versioned_memory()

    def filesystem_class(self) -> Any:
        return self.cls

    def adapt(self, cls: Any) -> Any:
        return cls

    def new_filesystem(self, cls: Any) -> Any:
        return cls(skip_instance_cache=True)

    def version_of(self, info: Mapping[str, Any]) -> str | None:
        generation = info.get("generation")
        return str(generation) if generation is not None else None

    def listed_fields(self, path: str, size: int, version: str) -> dict[str, Any]:
        return {"generation": int(version)}

    def head_version(self, fs: Any, bucket: str, key: str) -> str | None:
        return self.version_of(fs.info(f"{bucket}/{key}"))

    def delete(self, fs: Any, bucket: str, key: str, version: str | None) -> None:
        path = fs._strip_protocol(f"{bucket}/{key}")
        if path not in fs.store:
            raise Refused("missing")
        if version and str(fs.generations.get(path)) != version:
            raise Refused("mismatch")  # the service enforces the precondition
        fs.rm_file(path)

    def error_code(self, exc: BaseException) -> str | None:
        return exc.service_code if isinstance(exc, Refused) else None


@pytest.fixture
def memory() -> Iterator[MemoryBackend]:
    backend = MemoryBackend()
    backends.register(backend)
    try:
        yield backend
    finally:
        backends.unregister(backend.scheme)


def test_a_registered_backend_is_parsed_listed_read_and_pruned(memory: MemoryBackend) -> None:
    loc = Location.parse("memory://bkt/cache/")
    assert (loc.spelling, loc.is_local, loc.url) == ("memory://bkt/cache", False, loc.spelling)
    assert urls.is_url("memory://bkt/cache") and loc.subcache_dir is not None
    store = loc.store()
    assert isinstance(store, RemoteStore) and store.backend is memory
    for name, data in [("jit_f-1-cache", b"one"), ("jit_g-2-cache", b"two!")]:
        store.write_atomic(name, data)
    store.write_atomic("cachedoctor-manifests/jit_f-1.json", b"{}", create=True)
    with pytest.raises(FileExistsError):
        store.write_atomic("cachedoctor-manifests/jit_f-1.json", b"{}", create=True)

    listed = {i.name: i for i in store.list()}
    assert sorted(listed) == ["cachedoctor-manifests", "jit_f-1-cache", "jit_g-2-cache"]
    assert (listed["cachedoctor-manifests"].is_dir, listed["cachedoctor-manifests"].size) == (
        True,
        2,
    )
    f, g = listed["jit_f-1-cache"], listed["jit_g-2-cache"]
    assert (f.size, g.size) == (3, 4) and f.version and g.version and f.version != g.version
    with store.open_read("jit_g-2-cache") as fh:
        assert fh.read() == b"two!"
    assert store.fresh_version("jit_f-1-cache") == f.version
    assert store.fresh_version("jit_h-3-cache") is None

    opened = loc.open_dir()  # the folder API prune applies through
    assert isinstance(opened, StoreDir)
    with opened as folder:
        assert folder.listdir() == sorted(listed)
        store.write_atomic("jit_g-2-cache", b"TWO!")  # another writer, after the plan
        assert folder.unlink_if(FileId(f.name, 0, f.size, f.mtime_ns, f.version)) == "removed"
        assert folder.unlink_if(FileId(g.name, 0, g.size, g.mtime_ns, g.version)) == "changed"
        assert folder.unlink_if(FileId(f.name, 0, f.size, f.mtime_ns, f.version)) == "missing"
    # the service's own refusals, through the backend's table: a stale version, a gone object
    refused = store._send_delete(g.name, g.version)
    assert (refused.outcome, refused.conditional) == (DeleteOutcome.CHANGED, True)
    gone = store._send_delete(f.name, f.version)
    assert gone.outcome is DeleteOutcome.GONE
    assert [i.name for i in store.list()] == ["cachedoctor-manifests", "jit_g-2-cache"]


def test_a_registered_backend_is_named_in_messages_and_its_endpoint_travels(
    memory: MemoryBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(CachedoctorError) as refused:
        Location.parse("ftp://host/c")
    assert str(refused.value) == (
        "ftp://host/c: ftp:// is not supported; give a local folder, a gs://bucket/prefix, "
        "an s3://bucket/prefix or a memory://bucket/prefix"
    )
    monkeypatch.setenv(ENDPOINT, "here")
    store = Location.parse("memory://bkt/other").store()
    store.write_atomic("jit_f-1-cache", b"one")
    spec = stores.spec_of(store)
    assert (ENDPOINT, "here") in spec.endpoint
    assert [i.name for i in stores.reopen(spec).list()] == ["jit_f-1-cache"]

    memory.cls = None  # type: ignore[assignment]

    def missing() -> Any:
        raise ImportError("no module named memoryfs")

    monkeypatch.setattr(memory, "filesystem_class", missing)
    with pytest.raises(MissingExtraError, match=r"memory:// cache directories need fsspec: pip"):
        Location.parse("memory://bkt/third").store()


def test_an_unregistered_scheme_is_refused_again(memory: MemoryBackend) -> None:
    backends.unregister("memory")
    with pytest.raises(CachedoctorError, match="memory:// is not supported") as refused:
        Location.parse("memory://bkt/cache")
    assert refused.value.slug == "bad-url"
    assert Location.of_setting("memory://bkt/cache") is None


# Every service-specific line lives in storage/backends/: elsewhere in the package no string
# names a service's scheme or extra, and nothing imports a bucket client.
_SERVICE_LITERAL = re.compile(r"""["'](gs|s3|gcs)["']""")
_CLIENT_IMPORT = re.compile(r"^\s*(import|from)\s+(gcsfs|s3fs|botocore|aiobotocore)\b", re.M)


def service_specific_lines(root: Path) -> list[str]:
    """``path:line`` of each service literal or bucket-client import outside the backends."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("storage/backends/"):
            continue
        text = path.read_text(encoding="utf-8")
        for pattern in (_SERVICE_LITERAL, _CLIENT_IMPORT):
            found += [
                f"{rel}:{text.count(chr(10), 0, m.start()) + 1}" for m in pattern.finditer(text)
            ]
    return found


def test_no_module_outside_the_backends_names_a_service() -> None:
    assert service_specific_lines(SRC) == []
    backends_dir = SRC / "storage" / "backends"
    assert _SERVICE_LITERAL.search((backends_dir / "s3.py").read_text(encoding="utf-8"))
    assert _CLIENT_IMPORT.search((backends_dir / "gs.py").read_text(encoding="utf-8"))
