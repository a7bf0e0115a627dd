"""Caches in buckets, against real servers on 127.0.0.1: moto's S3 server and a GCS emulator.

The same cache, written by JAX, is scanned on local disk and in each bucket, and the findings
must agree. JAX also writes straight to each server (pointed at it by AWS_ENDPOINT_URL /
STORAGE_EMULATOR_HOST, as a user would). A throttling proxy answers 503 SlowDown (S3) or 429
(GCS) to a share of requests: the scan still completes with the same result and counts its
retries. Conditional deletes are checked against a rewrite made after the plan.

Every server and proxy binds 127.0.0.1, serves only this module, and is stopped by it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cachedoctor import layout
from cachedoctor.cache import executors, index, index_file, listdir, reader
from cachedoctor.cache.listdir import DirItem
from cachedoctor.cache.model import EntryDetail, EntryInfo
from cachedoctor.core.check.runner import run_program
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.scan.report import ScanReport
from cachedoctor.core.scan.run import scan_directory, scan_json
from cachedoctor.render.formats import scan_parts
from cachedoctor.render.jsonout import iter_scan_json
from cachedoctor.storage import retry, stores, urls
from cachedoctor.storage.location import Location
from cachedoctor.storage.model import DeleteOutcome
from cachedoctor.storage.remote_store import RemoteStore
from cachedoctor.storage.retry import RetryPolicy
from tests.support.buckets import (
    Servers,
    running_servers,
    throttling_proxy,
    upload,
)
from tests.support.caches import cli_env, entries_of

pytestmark = pytest.mark.remote


moto_server = pytest.importorskip(
    "moto.moto_server.threaded_moto_server", reason="moto[server] not installed (test-remote)"
)


gcs_server = pytest.importorskip(
    "gcp_storage_emulator.server", reason="gcp-storage-emulator not installed (test-remote)"
)


pytest.importorskip("s3fs", reason="s3fs not installed (cachedoctor[s3])")


pytest.importorskip("gcsfs", reason="gcsfs not installed (cachedoctor[gcs])")


NO_XLA_CACHES = {"JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none"}  # see test_same_findings


FAST = RetryPolicy(attempts=8, base_s=0.01, cap_s=0.1)


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    with running_servers() as found:
        yield found


@pytest.fixture(scope="module")
def local_cache(cache_factory: Callable[..., Path]) -> Path:
    """The seed program twice (an unstable key) and a plain program, written by JAX locally."""
    programs = [("seed", NO_XLA_CACHES), ("seed", NO_XLA_CACHES), ("plain", NO_XLA_CACHES)]
    return cache_factory("storage-remote", programs)


@pytest.fixture(scope="module")
def uploaded(servers: Servers, local_cache: Path) -> dict[str, str]:
    urls = {}
    for scheme in ("s3", "gs"):
        urls[scheme] = servers.url(scheme, "uploaded/cache")
        upload(urls[scheme], local_cache)
    return urls


def _comparable(report: ScanReport) -> tuple[Any, ...]:
    """What must not depend on where the cache is. Entry order within a finding follows mtime
    (newest first), and an uploaded object's mtime is its upload time, so it is compared as a
    set."""
    root = report.cache_dir
    findings = sorted(
        (f.kind, f.severity, sorted(f.entries), f.module, f.message.replace(root, "DIR"), f.advice)
        for f in report.findings
    )
    entries = [
        (e.key, e.size, e.compile_time_s, e.executable_digest, e.program_digest, e.problems)
        for e in entries_of(report)
    ]
    return findings, entries, report.summary, report.modules


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_same_findings_local_and_in_the_bucket(
    scheme: str, uploaded: dict[str, str], local_cache: Path
) -> None:
    # XLA's sub-caches are off while populating: with them on, jax 0.10.2 hashes the autotune
    # path into every key, and an uploaded cache is then rightly reported as relocated.
    local = scan_directory(Location.parse(local_cache), now=0.0)
    remote = scan_directory(Location.parse(uploaded[scheme]), now=0.0)
    assert remote.cache_dir == uploaded[scheme]
    assert _comparable(remote) == _comparable(local)
    assert FindingKind.UNSTABLE_KEY in {f.kind for f in remote.findings}  # not a vacuous match
    assert entries_of(remote)[0].path.startswith(uploaded[scheme] + "/")


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_repeated_scan_of_a_bucket_reads_only_changed_objects(
    scheme: str, servers: Servers, local_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan index keys objects by generation / ETag: unchanged ones are not read again."""
    url = servers.url(scheme, "index/cache")
    upload(url, local_cache)
    monkeypatch.setattr(index, "RACY_S", 3600.0)  # objects are never racy: this must not matter
    read: list[str] = []
    real = reader.decode_item

    def counting(
        store: stores.Store, item: listdir.DirItem, **kwargs: Any
    ) -> EntryInfo | EntryDetail:
        read.append(item.name)
        return real(store, item, **kwargs)

    monkeypatch.setattr(reader, "decode_item", counting)
    first = scan_directory(Location.parse(url), now=0.0)
    names = sorted(e.key + layout.CACHE_SUFFIX for e in entries_of(first))
    assert sorted(read) == names
    # named by the URL as spelled (the listing says it is a bucket): existing indexes stay valid
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:32]
    assert (index_file.index_root() / (digest + index_file.SUFFIX)).is_file()
    read.clear()
    assert scan_directory(Location.parse(url), now=0.0) == first
    assert read == []

    store = stores.open_store(url)
    assert isinstance(store, RemoteStore)
    rewritten = names[0]
    store.fs.pipe_file(store.path_of(rewritten), (local_cache / names[1]).read_bytes())
    read.clear()
    again = scan_directory(Location.parse(url), now=0.0)
    assert read == [rewritten]
    assert again == scan_directory(Location.parse(url), now=0.0, use_index=False)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_repeated_scan_of_an_unchanged_bucket_serves_the_kept_report(
    scheme: str,
    servers: Servers,
    local_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    memo_served: list[ScanReport],
) -> None:
    """The scan memo keys a bucket's report by every object's generation / ETag (which every
    write changes, so objects uploaded just now are no matter): a scan after a rewrite is the
    scan without index or memo."""
    url = servers.url(scheme, "memo/cache")
    upload(url, local_cache)
    later = time.time()
    first = scan_directory(Location.parse(url), now=later)
    again = scan_directory(Location.parse(url), now=later)
    assert any(again is r for r in memo_served) and not any(first is r for r in memo_served)
    assert again == first == scan_directory(Location.parse(url), now=later, use_index=False)
    document = "".join(iter_scan_json(first))
    for _ in range(2):  # the text of the JSON document kept beside the memo, then written
        kept = scan_json(Location.parse(url), scan_parts(), now=later)
        assert kept.kept is not None and "".join(iter_scan_json(kept)) == document
    store = stores.open_store(url)
    assert isinstance(store, RemoteStore)
    names = sorted(e.key + layout.CACHE_SUFFIX for e in entries_of(first))
    store.fs.pipe_file(store.path_of(names[0]), b"\x28\xb5\x2f\xfd garbage")
    changed = scan_directory(Location.parse(url), now=later)
    assert not any(changed is r for r in memo_served)
    assert changed == scan_directory(Location.parse(url), now=later, use_index=False) != first


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_cli_scan_and_show_of_a_bucket(
    scheme: str, servers: Servers, uploaded: dict[str, str], local_cache: Path, tmp_path: Path
) -> None:
    env = {**cli_env(), **servers.env}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cachedoctor", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    remote, local = cli("scan", "--json", uploaded[scheme]), cli("scan", "--json", str(local_cache))
    assert remote.returncode == local.returncode, remote.stderr
    r_doc, l_doc = json.loads(remote.stdout), json.loads(local.stdout)
    assert [f["kind"] for f in r_doc["findings"]] == [f["kind"] for f in l_doc["findings"]]
    assert r_doc["summary"] == l_doc["summary"]
    assert f"{uploaded[scheme]}: {len(l_doc['entries'])} entries" in remote.stderr
    assert "retries" in remote.stderr

    # lint judges scan's findings: it takes a bucket through scan_directory unchanged
    r_lint, l_lint = cli("lint", uploaded[scheme]), cli("lint", str(local_cache))
    assert r_lint.returncode == l_lint.returncode, r_lint.stderr
    assert r_lint.stdout.replace(uploaded[scheme], "DIR") == l_lint.stdout.replace(
        str(local_cache), "DIR"
    )

    key = next(e["key"] for e in l_doc["entries"] if e["module"] == "jit_g")
    shown = cli("show", "--json", key[:12], "--dir", uploaded[scheme])
    assert shown.returncode == 0, shown.stderr
    entry = json.loads(shown.stdout)["entry"]
    assert entry["key"] == key and entry["ok"]
    assert entry["path"] == f"{uploaded[scheme]}/{key}-cache"
    assert entry["executable_digest"] == next(
        e["executable_digest"] for e in l_doc["entries"] if e["key"] == key
    )
    by_url = cli("show", "--json", f"{uploaded[scheme]}/{key}-cache")
    assert by_url.returncode == 0, by_url.stderr
    assert by_url.stdout == shown.stdout

    # show and diff resolve an entry the one way (core/diff/load.resolve_entry): --extract
    # reads the object through its folder's store, the same bytes as from the local copy
    out = tmp_path
    extracted = cli("show", key[:12], "--dir", uploaded[scheme], "--extract", str(out / "b"))
    assert extracted.returncode == 0, extracted.stderr
    assert (
        cli("show", str(local_cache / f"{key}-cache"), "--extract", str(out / "l")).returncode == 0
    )
    assert (out / "b").read_bytes() == (out / "l").read_bytes() != b""
    # a local entry file stays the local file when --dir names a bucket
    local_shown = cli(
        "show", "--json", str(local_cache / f"{key}-cache"), "--dir", uploaded[scheme]
    )
    assert local_shown.returncode == 0, local_shown.stderr
    assert json.loads(local_shown.stdout)["entry"]["path"] == str(local_cache / f"{key}-cache")


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_jax_writes_straight_to_the_server(scheme: str, servers: Servers) -> None:
    url = servers.url(scheme, "written-by-jax")
    run = run_program("plain", url)  # the environment points JAX at the server
    assert run.returncode == 0, run.stderr[-2000:]
    report = scan_directory(Location.parse(url), now=0.0)
    assert {e.module for e in entries_of(report)} >= {"jit_g"}
    assert all(e.ok for e in entries_of(report))
    # JAX names its autotune sub-cache inside the URL (CPU never writes it): not "relocated"
    assert any(
        e.autotune_dir == f"{url}/xla_gpu_per_fusion_autotune_cache_dir" for e in entries_of(report)
    )
    assert FindingKind.RELOCATED not in {f.kind for f in report.findings}


def _store_via(scheme: str, endpoint: str, url: str, mp: pytest.MonkeyPatch) -> RemoteStore:
    mp.setenv("AWS_ENDPOINT_URL" if scheme == "s3" else "STORAGE_EMULATOR_HOST", endpoint)
    return RemoteStore(url, policy=FAST, workers=4)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_throttled_scan_completes_with_the_same_result(
    scheme: str, servers: Servers, uploaded: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clean = scan_directory(Location.parse(uploaded[scheme]), now=0.0)
    with throttling_proxy(scheme, servers, every=3) as (proxy, endpoint):
        store = _store_via(scheme, endpoint, uploaded[scheme], monkeypatch)
        # every object read again (the index would serve them all): the reads are throttled
        throttled = scan_directory(Location.of_store(store), now=0.0, use_index=False)
    assert _comparable(throttled) == _comparable(clean)
    assert proxy.throttled > 0
    # the libraries' own retries are off: every refusal reached our one retry function
    assert store.stats.retries == proxy.throttled
    assert set(store.stats.retry_reasons) == {"SlowDown" if scheme == "s3" else "http-429"}


def _worker_decode(store: RemoteStore, items: list[DirItem]) -> list[EntryInfo]:
    """What a worker in another process returns for a chunk: its own filesystem, cold memos."""
    reader.clear_memos()
    stores._FILESYSTEMS.clear()
    return executors.decode_store_chunk(stores.spec_of(store), items, 1 << 33, False)[0]


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_worker_reads_the_listed_objects_without_asking_for_their_details(
    scheme: str, servers: Servers, uploaded: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk sent to a worker carries the scan's listing: each object costs its read alone,
    not a HEAD (S3) or a metadata GET and a one-key listing (GCS) first."""
    with throttling_proxy(scheme, servers, every=0) as (proxy, endpoint):
        store = _store_via(scheme, endpoint, uploaded[scheme], monkeypatch)
        items = listdir.list_cache(store).entries
        here = reader.decode_store_entries(store, items)
        before = len(proxy.log)
        found = _worker_decode(store, items)
        requests = proxy.log[before:]
    assert found == here and not any(e.problems for e in found)
    # one ranged GET of each object's bytes (each is under READ_BLOCK), and nothing else
    assert sorted(method for method, _, _ in requests) == ["GET"] * len(items), requests
    if scheme == "gs":
        assert all("alt=media" in path for _, path, _ in requests), requests


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "gs"])
@pytest.mark.parametrize("where", ["scan", "worker"])
def test_an_object_rewritten_after_the_listing_is_reported_changed_not_damaged(
    scheme: str, where: str, servers: Servers, local_cache: Path
) -> None:
    """Another writer replaces an object between the scan's listing and its read (a second
    host writing the same key): the read is refused (S3, the listed ETag) or takes the listed
    size of the new bytes (GCS). Either way the entry is unreadable for this scan, saying why,
    never corrupt."""
    url = servers.url(scheme, f"rewritten-{where}/cache")
    upload(url, local_cache)
    store = stores.open_store(url)
    assert isinstance(store, RemoteStore)
    items = listdir.list_cache(store).entries
    small, large = sorted(items, key=lambda i: i.size)[0], sorted(items, key=lambda i: i.size)[-1]
    stores.open_store(url).write_atomic(small.name, (local_cache / large.name).read_bytes())
    decoded = reader.decode_store_entries(store, items) if where == "scan" else None
    found = decoded if decoded is not None else _worker_decode(store, items)
    (changed,) = [e for e in found if e.key == small.key]
    assert [p.kind for p in changed.problems] == ["unreadable"], changed.problems
    assert "rewritten (version " in changed.problems[0].message
    assert f"listed as version {small.version}" in changed.problems[0].message
    assert not any(e.problems for e in found if e.key != small.key)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_delete_only_what_was_planned(scheme: str, servers: Servers, local_cache: Path) -> None:
    url = servers.url(scheme, "prune/cache")
    upload(url, local_cache)
    store = stores.open_store(url)
    plan = [i for i in listdir.list_cache(store).entries]
    assert len(plan) >= 3 and all(i.version for i in plan)
    rewritten = plan[0]
    new_bytes = (local_cache / plan[1].name).read_bytes()  # another writer, after the plan
    assert isinstance(store, RemoteStore)
    store.fs.pipe_file(store.path_of(rewritten.name), new_bytes)

    results = {i.name: store.delete_if_unchanged(i.name, i.version) for i in plan}
    assert results[rewritten.name].outcome is DeleteOutcome.CHANGED
    assert all(
        r.outcome is DeleteOutcome.DELETED for n, r in results.items() if n != rewritten.name
    )
    left = [i.name for i in store.list()]
    assert left == [rewritten.name]
    with store.open_read(rewritten.name) as fh:
        assert fh.read() == new_bytes
    again = store.delete_if_unchanged(plan[1].name, plan[1].version)
    assert again.outcome is DeleteOutcome.GONE


@pytest.mark.slow
def test_s3_server_refuses_a_delete_of_a_changed_object(
    servers: Servers, local_cache: Path
) -> None:
    """The race the pre-check cannot see: the object changes between check and delete."""
    url = servers.url("s3", "race/cache")
    upload(url, local_cache)
    store = stores.open_store(url)
    assert isinstance(store, RemoteStore)
    item = store.list()[0]
    store.fs.pipe_file(store.path_of(item.name), b"rewritten")
    result = store._send_delete(item.name, item.version)  # skip the pre-check on purpose
    assert (result.outcome, result.conditional) == (DeleteOutcome.CHANGED, True)
    assert store.stat(item.name) is not None


@pytest.mark.slow
def test_gcs_delete_is_sent_with_if_generation_match(
    servers: Servers, local_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gcp-storage-emulator ignores preconditions, so check what we send: real GCS enforces it."""
    url = servers.url("gs", "conditional/cache")
    upload(url, local_cache)
    with throttling_proxy("gs", servers, every=10**9) as (proxy, endpoint):
        store = _store_via("gs", endpoint, url, monkeypatch)
        item = store.list()[0]
        result = store.delete_if_unchanged(item.name, item.version)
    assert (result.outcome, result.conditional) == (DeleteOutcome.DELETED, True)
    deletes = [path for method, path, _ in proxy.log if method == "DELETE"]
    assert len(deletes) == 1 and f"ifGenerationMatch={item.version}" in deletes[0]


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_manifest_objects_are_written_whole(scheme: str, servers: Servers) -> None:
    store = stores.open_store(servers.url(scheme, "manifests"))
    name = "cachedoctor-manifests/jit_f-abc.json"
    store.write_atomic(name, b'{"v": 1}')
    store.write_atomic(name, b'{"v": 2}')
    (folder,) = store.list()
    assert (folder.name, folder.is_dir, folder.size) == ("cachedoctor-manifests", True, 8)
    (item,) = store.list("cachedoctor-manifests")
    assert (item.name, item.size, item.is_dir) == ("jit_f-abc.json", 8, False)
    with store.open_read(name) as fh:
        assert fh.read() == b'{"v": 2}'
    with pytest.raises(FileNotFoundError), store.open_read("cachedoctor-manifests/no.json") as fh:
        fh.read()


def _create_concurrently(store: stores.Store, name: str, writers: int) -> list[str]:
    """``writers`` threads create ``name`` at once, each with its own body: what each got."""
    import threading

    start = threading.Barrier(writers)

    def create(i: int) -> str:
        body = f"writer {i} ".encode() * 2000  # 20 KB: a torn write would show
        start.wait()
        try:
            store.write_atomic(name, body, create=True)
        except FileExistsError:
            return "exists"
        return f"writer {i} "

    return list(retry.bounded_map(create, list(range(writers)), writers))


def test_create_only_writes_keep_the_first_object_on_s3(servers: Servers) -> None:
    """16 processes' worth of concurrent creates of one manifest: one wins, whole; moto enforces
    If-None-Match as S3 does."""
    store = stores.open_store(servers.url("s3", "create-only/cache"), workers=16)
    name = "cachedoctor-manifests/jit_f-abc.json"
    outcomes = _create_concurrently(store, name, 16)
    (winner,) = [o for o in outcomes if o != "exists"]
    with store.open_read(name) as fh:
        assert fh.read() == winner.encode() * 2000
    with pytest.raises(FileExistsError):
        store.write_atomic(name, b"late", create=True)
    store.write_atomic(name, b"replaced")  # without create: a plain PUT, as before
    with store.open_read(name) as fh:
        assert fh.read() == b"replaced"


def test_create_only_writes_send_the_gcs_precondition(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gcp-storage-emulator ignores preconditions, so check what we send: real GCS enforces it
    (a second create gets 412, which gcsfs raises as FileExistsError)."""
    url = servers.url("gs", "create-only/cache")
    with throttling_proxy("gs", servers, every=10**9) as (proxy, endpoint):
        store = _store_via("gs", endpoint, url, monkeypatch)
        store.write_atomic("cachedoctor-manifests/jit_f-abc.json", b"{}", create=True)
        store.write_atomic("cachedoctor-manifests/jit_f-def.json", b"{}")
    uploads = [path for method, path, _ in proxy.log if method == "POST" and "/upload/" in path]
    assert len(uploads) == 2
    assert "ifGenerationMatch=0" in uploads[0] and "ifGenerationMatch" not in uploads[1]


def _cli(servers: Servers, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cachedoctor", *args],
        env={**cli_env(), **servers.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _versions(url: str) -> dict[str, str | None]:
    """Every object under the prefix with its generation / ETag (a fresh listing)."""
    store = stores.open_store(url)
    assert isinstance(store, RemoteStore)
    found = store.fs.find(store.path_of(), detail=True)
    key = "generation" if store.scheme == "gs" else "ETag"
    return {name: str(info.get(key)) for name, info in found.items()}


def _no_mtime(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != "mtime_ns"}


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_diff_of_bucket_entries_matches_local(
    scheme: str, servers: Servers, uploaded: dict[str, str], local_cache: Path
) -> None:
    url, local = uploaded[scheme], str(local_cache)
    keys = sorted(p.name.removesuffix("-cache") for p in local_cache.glob("*-cache"))
    seed = [k for k in keys if listdir.module_of(k) == "jit_f"]
    assert len(seed) == 2  # the seed program twice under two keys (its unstable key)

    def doc(run: subprocess.CompletedProcess[str], root: str) -> Any:
        """The document with the directory named DIR and no file times (upload times differ)."""
        assert run.returncode in (0, 1), run.stderr
        return json.loads(run.stdout.replace(root, "DIR"), object_hook=_no_mtime), run.returncode

    a, b = seed[0][:20], seed[1][:20]  # unique key prefixes
    remote = doc(_cli(servers, "diff", "--json", a, b, "--dir", url), url)
    assert remote == doc(_cli(servers, "diff", "--json", a, b, "--dir", local), local)
    assert remote[0]["verdict"]["kind"] == "same-executable"  # what an unstable key gives
    by_url = _cli(servers, "diff", "--json", f"{url}/{seed[0]}-cache", f"{url}/{seed[1]}-cache")
    assert doc(by_url, url) == remote
    module = str(listdir.module_of(seed[0]))
    remote_mod = doc(_cli(servers, "diff", "--json", "--module", module, "--dir", url), url)
    local_mod = doc(_cli(servers, "diff", "--json", "--module", module, "--dir", local), local)

    def covered(d: dict[str, Any]) -> tuple[Any, ...]:  # "latest" follows upload times here
        keys = {d["latest"]} | {x[side]["key"] for x in d["diffs"] for side in ("a", "b")}
        return d["equivalent"], sorted(keys), sorted(x["verdict"]["kind"] for x in d["diffs"])

    assert remote_mod[1] == local_mod[1]
    assert covered(remote_mod[0]) == covered(local_mod[0]) and set(covered(local_mod[0])[1]) == set(
        seed
    )


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_prune_a_bucket_dry_run_then_apply(
    scheme: str, servers: Servers, local_cache: Path
) -> None:
    from cachedoctor.core.prune.actions import Status
    from cachedoctor.core.prune.apply import apply
    from cachedoctor.core.prune.options import PruneOptions
    from cachedoctor.core.prune.planner import plan_prune

    url = servers.url(scheme, "prune-cli/cache")
    upload(url, local_cache)
    before = _versions(url)
    dry = _cli(servers, "prune", "--module", "*", "--json", url)
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    entries = len(list(local_cache.glob("*-cache")))
    assert len(planned["actions"]) == entries >= 3
    assert _versions(url) == before  # a dry run changes nothing
    assert any("conditional delete" in n for n in planned["notes"])

    plan = plan_prune(Location.parse(url), PruneOptions(module="*", selectors=("module *",)))
    assert sorted(a.name for a in plan.actions) == sorted(a["name"] for a in planned["actions"])
    assert all(a.files[0].version for a in plan.actions)
    rewritten = plan.actions[0].name + "-cache"
    store = stores.open_store(url)
    assert isinstance(store, RemoteStore)
    store.fs.pipe_file(store.path_of(rewritten), b"another host wrote this after the plan")
    result = apply(plan)
    status = {o.action.name + "-cache": (o.status, o.detail) for o in result.outcomes}
    assert status.pop(rewritten) == (Status.SKIPPED, "changed since the plan")
    assert set(status.values()) == {(Status.DONE, "")}
    after = _versions(url)
    assert [name.rsplit("/", 1)[-1] for name in after] == [rewritten]
    assert after != {k: v for k, v in before.items() if k in after}  # the rewrite, kept

    applied = _cli(servers, "prune", "--module", "*", "--apply", url)
    assert applied.returncode == 0, applied.stderr
    assert "applied: 1 done" in applied.stdout
    with pytest.raises(FileNotFoundError):
        stores.open_store(url).list()


@pytest.mark.slow
def test_hook_writes_manifests_as_objects(servers: Servers) -> None:
    """JAX writes to the S3 server with the stable-key hook on: one manifest object per key."""
    from cachedoctor.core.check.runner import program_env, run_command
    from cachedoctor.programs import program_path
    from cachedoctor.stablekeys import manifest

    url = servers.url("s3", "hooked/cache")
    argv = [
        sys.executable,
        "-m",
        "cachedoctor.stablekeys.hook",
        "--mode",
        "stable",
        str(program_path("plain")),
    ]
    run = run_command(argv, program_env(url, NO_XLA_CACHES))
    assert run.returncode == 0, run.stderr[-2000:]
    store = stores.open_store(url)
    keys = sorted(i.key for i in listdir.list_cache(store).entries if i.key)
    assert keys
    objects = {i.name for i in store.list(layout.MANIFEST_DIRNAME)}
    assert {f"{k}.json" for k in keys} <= objects  # JAX wrote each entry under its stable key
    found = {m.key: m for m in manifest.iter_manifests(Location.parse(url))}
    for key in keys:
        m = manifest.load_manifest(Location.parse(url), key)
        assert m is not None and m == found[key] and m.mode == "stable"
        assert manifest.recompute_key(m) == key
    assert manifest.manifest_exists(Location.parse(url), keys[0])
    assert not manifest.manifest_exists(Location.parse(url), "jit_nothing-" + "0" * 64)

    # diff reads them from the bucket as from a local directory
    shown = _cli(servers, "diff", "--json", keys[0], keys[-1], "--dir", url)
    assert shown.returncode in (0, 1), shown.stderr
    section = json.loads(shown.stdout)["manifest"]
    assert section["available"] and section["stable_keys"] == [keys[0], keys[-1]]

    # prune takes each entry's manifest object with it
    pruned = _cli(servers, "prune", "--module", "*", "--apply", url)
    assert pruned.returncode == 0, pruned.stderr
    assert f"applied: {len(keys)} done, 0 skipped, 0 failed" in pruned.stdout
    with pytest.raises(FileNotFoundError):
        store.list()


@pytest.mark.slow
def test_enable_with_a_bucket_keeps_xla_subcaches_local(
    servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After `enable --dir s3://…`, JAX's compile options name the local sub-cache path."""
    import sysconfig

    from cachedoctor.core.check.runner import program_env, run_command

    startup = Path(sysconfig.get_paths()["purelib"]) / "cachedoctor_startup.pth"
    if not startup.exists():
        pytest.skip("cachedoctor is not installed in this interpreter (pip install -e .)")
    url = servers.url("s3", "enabled/cache")
    monkeypatch.setenv("CACHEDOCTOR_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("CACHEDOCTOR_XLA_SUBCACHE_ROOT", str(tmp_path / "subcaches"))
    enabled = _cli(servers, "enable", "--dir", url, "--xla-caches", "autotune", "--mode", "off")
    assert enabled.returncode == 0, enabled.stderr
    local = urls.subcache_dir_for(url)
    assert local is not None and local.startswith(str(tmp_path))
    assert f"XLA sub-caches kept locally at {local} (XLA cannot write gs:// or s3://)" in (
        enabled.stdout
    )
    env = program_env(url)
    env.pop("PYTHONPATH", None)
    run = run_command(
        [
            sys.executable,
            "-c",
            "import runpy, cachedoctor.programs as p; "
            "runpy.run_path(str(p.program_path('plain')), run_name='__main__')",
        ],
        env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = scan_directory(Location.parse(url), now=0.0)
    assert report.entries
    autotune = f"{local}/xla_gpu_per_fusion_autotune_cache_dir"
    assert {e.autotune_dir for e in report.entries} == {autotune}
    assert FindingKind.RELOCATED not in {f.kind for f in report.findings}
