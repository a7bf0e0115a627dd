"""The storage layer without servers: URLs, the retry policy, LocalStore, the reader over a store.

Bucket behaviour against real (local) S3 and GCS servers is in test_storage_remote.py.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from cachedoctor.cache import listdir, reader
from cachedoctor.cache.model import EntryDetail
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.storage import stores, urls
from cachedoctor.storage.local_store import LocalStore
from cachedoctor.storage.location import Location
from cachedoctor.storage.model import DeleteOutcome, IoStats, MissingExtraError, StoreError
from cachedoctor.storage.retry import (
    RetryPolicy,
    bounded_map,
    call_with_retry,
    telling_waits,
    transient_reason,
)
from cachedoctor.storage.urls import subcache_dir_for
from tests.support.caches import cli_env

FAST = RetryPolicy(attempts=4, base_s=0.0, cap_s=0.0)


class FakeClientError(Exception):
    """Shaped like botocore's ClientError: what transient_reason reads is ``response``."""

    def __init__(self, code: str, status: int) -> None:
        super().__init__(f"An error occurred ({code})")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


def test_urls() -> None:
    assert urls.is_url("gs://bucket/jax-cache")
    assert urls.is_url("s3://bucket")
    assert not urls.is_url("/tmp/cache")
    assert not urls.is_url("file:///tmp/cache")
    assert not urls.is_url("http://example/cache")
    assert urls.split_url("s3://b/a/b/") == ("s3", "b", "a/b")
    assert urls.split_url("gs://b") == ("gs", "b", "")


def test_retry_counts_throttles_and_succeeds() -> None:
    stats = IoStats()
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise FakeClientError("SlowDown", 503)
        if len(calls) == 2:
            raise FakeClientError("TooManyRequests", 429)
        return "ok"

    waits: list[float] = []
    assert call_with_retry(flaky, what="x", stats=stats, policy=FAST, sleep=waits.append) == "ok"
    assert stats.retries == 2
    assert stats.retry_reasons == {"SlowDown": 1, "TooManyRequests": 1}
    assert len(waits) == 2


def test_a_wait_is_told_once_and_only_to_who_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI passes its stderr writer for the command (``telling_waits``); outside it (the
    API, the hook in a JAX process) nobody is told. Store threads are told too."""
    monkeypatch.setattr("cachedoctor.storage.retry._waited", threading.Event())

    def flaky_once() -> Callable[[], str]:
        calls: list[Exception | str] = [ConnectionError("refused"), "ok"]

        def call() -> str:
            value = calls.pop(0)
            if isinstance(value, Exception):
                raise value
            return value

        return call

    told: list[str] = []
    assert call_with_retry(flaky_once(), what="x", policy=FAST, sleep=lambda s: None) == "ok"
    assert told == []
    with telling_waits(told.append):
        bounded_map(
            lambda _: call_with_retry(
                flaky_once(), what="listing s3://b/p", policy=FAST, sleep=lambda s: None
            ),
            [1, 2, 3],
            workers=3,
        )
    assert len(told) == 1 and told[0].startswith("cachedoctor: waiting for listing s3://b/p")
    assert "(ConnectionError)" in told[0]
    monkeypatch.setattr("cachedoctor.storage.retry._waited", threading.Event())
    call_with_retry(flaky_once(), what="x", policy=FAST, sleep=lambda s: None)
    assert len(told) == 1  # the block has ended


def test_retry_gives_up_with_a_named_error() -> None:
    def always() -> None:
        raise FakeClientError("SlowDown", 503)

    stats = IoStats()
    with pytest.raises(StoreError, match="listing s3://b/p: still failing after 4 attempts"):
        call_with_retry(
            always, what="listing s3://b/p", stats=stats, policy=FAST, sleep=lambda s: None
        )
    assert stats.retries == 3


def test_retry_does_not_retry_real_errors() -> None:
    calls = []

    def denied() -> None:
        calls.append(1)
        raise PermissionError(errno.EACCES, "Access Denied")

    with pytest.raises(PermissionError):
        call_with_retry(denied, what="x", policy=FAST, sleep=lambda s: None)
    assert len(calls) == 1


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(attempts=10, base_s=0.1, cap_s=1.0)
    for retry in range(10):
        ceiling = min(1.0, 0.1 * 2**retry)
        assert ceiling / 2 <= policy.delay(retry) <= ceiling


def test_transient_reason_sees_through_library_wrappers() -> None:
    # s3fs turns a SlowDown ClientError into OSError(EBUSY) raised from it
    try:
        try:
            raise FakeClientError("SlowDown", 503)
        except FakeClientError as inner:
            raise OSError(errno.EBUSY, "Please reduce your request rate") from inner
    except OSError as wrapped:
        assert transient_reason(wrapped) == "SlowDown"
    gcsfs_retry = pytest.importorskip("gcsfs.retry", reason="gcsfs not installed")
    assert transient_reason(gcsfs_retry.HttpError({"code": 429, "message": "slow"})) == "http-429"
    assert transient_reason(gcsfs_retry.HttpError({"code": 403, "message": "no"})) is None
    assert transient_reason(FileNotFoundError("gone")) is None


def test_subcache_dir_is_local_and_the_same_on_every_host(monkeypatch: pytest.MonkeyPatch) -> None:
    assert subcache_dir_for("/data/jax-cache") is None
    monkeypatch.delenv(urls.SUBCACHE_ROOT_ENV, raising=False)
    monkeypatch.setenv("HOME", "/home/alice")
    monkeypatch.setenv("USER", "alice")
    first = subcache_dir_for("gs://team-bucket/jax/cache")
    monkeypatch.setenv("HOME", "/home/bob")
    monkeypatch.setenv("USER", "bob")
    assert subcache_dir_for("gs://team-bucket/jax/cache/") == first
    assert first == "/tmp/cachedoctor-xla-subcaches/gs/team-bucket/jax/cache"
    assert subcache_dir_for("s3://b/../x") == "/tmp/cachedoctor-xla-subcaches/s3/b/__/x"
    monkeypatch.setenv(urls.SUBCACHE_ROOT_ENV, "/scratch/xla")
    assert subcache_dir_for("s3://b/p") == "/scratch/xla/s3/b/p"


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs -> ImportError
    with pytest.raises(MissingExtraError, match=r"pip install '\.\[s3\]' in a clone"):
        stores.open_store("s3://bucket/cache")


@pytest.mark.slow
def test_cli_without_the_extra_says_which(tmp_path: Path) -> None:
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "gcsfs.py").write_text("raise ImportError('blocked for this test')\n")
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "scan", "gs://bucket/cache"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "cachedoctor: missing-extra: gs:// cache directories need gcsfs: "
        "pip install '.[gcs]' in a clone of cachedoctor"
    )


def test_local_store_round_trip(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    store.write_atomic("cachedoctor-manifest-a", b"one")
    store.write_atomic("cachedoctor-manifest-a", b"two")
    (item,) = store.list()
    assert (item.name, item.size) == ("cachedoctor-manifest-a", 3)
    with store.open_read(item.name) as fh:
        assert fh.read() == b"two"
    store.write_atomic("cachedoctor-manifests/jit_f-abc.json", b"{}")
    (manifest,) = store.list("cachedoctor-manifests")
    assert (manifest.name, manifest.size) == ("jit_f-abc.json", 2)
    leftovers = [p for _, _, files in os.walk(tmp_path) for p in files if ".cachedoctor-tmp" in p]
    assert not leftovers


def test_local_create_only_writes_keep_the_first_file(tmp_path: Path) -> None:
    """Concurrent creates of one name: one file wins, whole; the others get FileExistsError and
    leave no temp file behind."""
    import threading

    store = stores.open_store(tmp_path)
    name = "cachedoctor-manifests/jit_f-abc.json"
    start = threading.Barrier(16)

    def create(i: int) -> str | None:
        start.wait()
        try:
            store.write_atomic(name, f"writer {i} ".encode() * 2000, create=True)
        except FileExistsError:
            return None
        return f"writer {i} "

    won = [w for w in bounded_map(create, list(range(16)), 16) if w is not None]
    assert len(won) == 1
    assert (tmp_path / name).read_bytes() == won[0].encode() * 2000
    assert sorted(p.name for p in (tmp_path / "cachedoctor-manifests").iterdir()) == [
        "jit_f-abc.json"
    ]
    with pytest.raises(FileExistsError):
        store.write_atomic(name, b"late", create=True)
    store.write_atomic(name, b"replaced")
    assert (tmp_path / name).read_bytes() == b"replaced"


def test_local_delete_only_what_was_planned(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    for name in ("a-cache", "b-cache"):
        (tmp_path / name).write_bytes(b"planned")
    plan = {i.name: i.version for i in store.list()}
    (tmp_path / "b-cache").unlink()
    (tmp_path / "b-cache").write_bytes(b"rewritten after the plan")  # a new writer
    assert store.delete_if_unchanged("a-cache", plan["a-cache"]).outcome is DeleteOutcome.DELETED
    assert store.delete_if_unchanged("b-cache", plan["b-cache"]).outcome is DeleteOutcome.CHANGED
    assert (tmp_path / "b-cache").read_bytes() == b"rewritten after the plan"
    assert store.delete_if_unchanged("a-cache", plan["a-cache"]).outcome is DeleteOutcome.GONE


@pytest.mark.slow
def test_reader_decodes_a_file_object_like_a_path(seed_cache: Path) -> None:
    listing = listdir.list_cache(seed_cache)
    assert listing.entries
    for item in listing.entries:
        path = listing.path(item)
        by_path = reader.decode_entry(path, key=item.key, detail=True)
        with open(path, "rb") as fh:
            by_file = reader.decode_entry(
                path, key=item.key, detail=True, fileobj=fh, size=item.size, mtime_ns=item.mtime_ns
            )
        assert by_file == by_path
        assert isinstance(by_path, EntryDetail) and by_path.info.ok


@pytest.mark.slow
def test_local_store_listing_and_scan_match_the_directory(seed_cache: Path) -> None:
    store = LocalStore(str(seed_cache))
    assert listdir.list_cache(store) == listdir.list_cache(seed_cache)
    via_store = scan_directory(Location.of_store(store), now=0.0)
    direct = scan_directory(Location.parse(seed_cache), now=0.0)
    assert via_store.findings == direct.findings
    assert via_store.entries == direct.entries


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["prune", "--repair", "gs://b/cache"], "--repair works on local cache directories only"),
        (["rekey", "s3://b/cache"], "rekey works on local cache directories only"),
    ],
)
def test_commands_that_need_a_local_directory_refuse_a_bucket(args: list[str], reason: str) -> None:
    """Refused before any request: no server (or credentials) needed."""
    proc = subprocess.run(
        [sys.executable, "-m", "cachedoctor", *args],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("cachedoctor: usage: ") and reason in line
