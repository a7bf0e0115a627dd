"""A store writes a local file into the cache a part at a time (``write_atomic`` given a path:
what ``unpack`` hands it, so that no member is held whole), with the same promises as a write
of bytes: whole or not at all, and with ``create`` never over an object or file that is there.
Against the local folder and the S3 and GCS servers (moto, the GCS emulator)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cachedoctor.storage import remote_store, stores
from tests.support.buckets import Servers


def _source(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = tmp_path / "staged"
    path.write_bytes(data)
    return path, data


def _written_twice(store: stores.Store, name: str, source: Path, data: bytes) -> None:
    store.write_atomic(name, source, create=True, mode=0o644)
    with store.open_read(name) as fh:
        assert fh.read() == data
    with pytest.raises(FileExistsError):
        store.write_atomic(name, source, create=True)


def test_a_folder_takes_a_file_whole_and_never_over_another(tmp_path: Path) -> None:
    source, data = _source(tmp_path, (3 << 20) + 5)  # over the copy's one-megabyte chunk
    folder = tmp_path / "cache"
    folder.mkdir()
    store = stores.open_store(str(folder))
    _written_twice(store, "jit_f-" + "a" * 64 + "-cache", source, data)
    store.write_atomic("cachedoctor-manifests/m.json", source)  # a folder made on its way
    assert (folder / "cachedoctor-manifests" / "m.json").read_bytes() == data
    assert sorted(p.name for p in folder.iterdir()) == [
        "cachedoctor-manifests",
        "jit_f-" + "a" * 64 + "-cache",
    ]


@pytest.mark.remote
@pytest.mark.parametrize("parts", [False, True], ids=["one-put", "in-parts"])
def test_s3_takes_a_file_in_parts_and_never_over_another(
    servers: Servers, tmp_path: Path, parts: bool
) -> None:
    """Over two parts (:data:`remote_store.PART`): S3's multipart upload, completed only whole
    and with If-None-Match (moto enforces it as S3 does)."""
    source, data = _source(tmp_path, 2 * remote_store.PART + 7 if parts else 1000)
    store = stores.open_store(servers.url("s3", f"streamed/{tmp_path.name}"))
    _written_twice(store, "jit_f-" + "b" * 64 + "-cache", source, data)


@pytest.mark.remote
@pytest.mark.parametrize("parts", [False, True], ids=["one-put", "in-parts"])
def test_gcs_takes_a_file_in_parts_with_the_create_precondition(
    servers: Servers, tmp_path: Path, parts: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GCS's simple or resumable upload, whole; the emulator ignores preconditions, so what is
    sent is checked: ``ifGenerationMatch=0`` on the create (real GCS refuses a second one)."""
    from cachedoctor.storage.remote_store import RemoteStore
    from tests.support.buckets import throttling_proxy

    source, data = _source(tmp_path, 2 * remote_store.PART + 7 if parts else 1000)
    url = servers.url("gs", f"streamed/{tmp_path.name}")
    with throttling_proxy("gs", servers, every=10**9) as (proxy, endpoint):
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        store = RemoteStore(url, workers=2)
        store.write_atomic("jit_f-" + "c" * 64 + "-cache", source, create=True)
        with store.open_read("jit_f-" + "c" * 64 + "-cache") as fh:
            assert fh.read() == data
    uploads = [path for method, path, _ in proxy.log if method == "POST" and "/upload/" in path]
    assert "ifGenerationMatch=0" in uploads[0], uploads  # the upload's first request
    assert len(uploads) == (1 + 3 if parts else 1), uploads  # begun, then one request a part


def test_the_part_size_keeps_under_s3s_part_limit() -> None:
    assert remote_store.part_size(1 << 20) == remote_store.PART
    huge = 200 << 30  # 200 GiB: 25,600 parts of 8 MiB, over S3's 10,000
    part = remote_store.part_size(huge)
    assert part % (256 << 10) == 0 and -(-huge // part) <= remote_store.MAX_PARTS
