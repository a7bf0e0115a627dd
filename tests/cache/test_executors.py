"""Decoding on an executor (``--executor``, the API's ``executor=``) gives the report of the
default scan, byte for byte bar ``scanned_at``: with a thread pool, a process pool, and a real
Dask ``LocalCluster`` of 1 and 2 worker processes, on a local cache and on a bucket on the local
S3 server. Dask's own task stream is the evidence that the work ran on the cluster."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import cachedoctor
from cachedoctor.cache import executors, parallel
from cachedoctor.cache.executors import ExecutorChoice, parse_executor
from cachedoctor.cache.parallel import ExecutorError
from cachedoctor.cli import cli
from cachedoctor.storage import stores
from tests.support.caches import cli_env

# --- what --executor accepts (fast) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "choice"),
    [
        ("local", ExecutorChoice("local")),
        ("processes:3", ExecutorChoice("processes", workers=3)),
        ("dask://sched.example:8786", ExecutorChoice("dask", address="tcp://sched.example:8786")),
        ("tcp://10.0.0.5:8786", ExecutorChoice("dask", address="tcp://10.0.0.5:8786")),
        ("tcp://[::1]:8786", ExecutorChoice("dask", address="tcp://[::1]:8786")),
    ],
)
def test_executor_forms(text: str, choice: ExecutorChoice) -> None:
    assert parse_executor(text) == choice


@pytest.mark.parametrize(
    "text", ["", "processes", "processes:0", "processes:x", "dask://host", "tcp://h:99999", "ray"]
)
def test_bad_executor_is_a_usage_error(text: str) -> None:
    with pytest.raises(ValueError, match="local, processes:N, dask://HOST:PORT"):
        parse_executor(text)
    result = CliRunner().invoke(cli, ["scan", "--executor", text, "."])
    assert result.exit_code == 2
    assert "Invalid value for '--executor'" in result.output


def test_missing_dask_extra_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed fails
    with (
        pytest.raises(ExecutorError, match=r"pip install 'cachedoctor\[dask\]'"),
        executors.open_executor(parse_executor("dask://127.0.0.1:8786")),
    ):
        pass


def test_results_come_back_in_the_order_of_the_calls() -> None:
    """Later calls finish first; the results still follow the calls."""

    def slow_first(n: int) -> int:
        time.sleep(0.02 * (8 - n))
        return n

    with ThreadPoolExecutor(4) as pool:
        seen: list[int] = []
        out = list(parallel.in_order(pool, slow_first, [(n,) for n in range(8)], seen.append))
    assert out == seen == list(range(8))


def test_a_failing_executor_is_one_line() -> None:
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    with pytest.raises(ExecutorError, match="the executor failed: RuntimeError: cannot schedule"):
        list(parallel.in_order(pool, str, [(1,)]))


def test_api_refuses_what_is_not_an_executor(tmp_path: Path) -> None:
    with pytest.raises(cachedoctor.CachedoctorError, match="executor: expected a concurrent"):
        cachedoctor.scan(tmp_path, executor="dask://x:1")  # type: ignore[arg-type]
    with pytest.raises(cachedoctor.CachedoctorError, match="fail_on: expected"):
        cachedoctor.lint(tmp_path, fail_on="fatal")


def test_store_spec_carries_the_endpoint_and_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    spec = stores.spec_of(stores.open_store("/some/folder"))
    assert ("AWS_ENDPOINT_URL", "http://127.0.0.1:9") in spec.endpoint
    assert "s3cr3t" not in repr(spec)


# --- the report does not change (slow: JAX-built caches, worker processes) ----------------------


@pytest.fixture
def cache(seed_cache: Path, copy_of: Callable[[Path], Path]) -> Path:
    """The seed cache plus a truncated entry and one that is not an entry: entries of several
    sizes, so the chunks (grouped by size) are not in listing order."""
    d = copy_of(seed_cache)
    data = sorted(d.glob("*-cache"))[0].read_bytes()
    (d / f"jit_cut-{'a' * 64}-cache").write_bytes(data[: len(data) // 3])
    (d / f"jit_raw-{'b' * 64}-cache").write_bytes(b"not an entry")
    return d


# Each worker's own endpoint setting points at nothing: a worker must read the bucket the scan
# listed (the endpoint travels in the store's description), with its own credentials.
WORKER_ENV = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "CACHEDOCTOR_NO_INDEX": "1",
}


@pytest.fixture(scope="module", params=[1, 2], ids=["1-worker", "2-workers"])
def dask_cluster(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    """A real Dask LocalCluster of 1 or 2 worker processes: its address, and a client."""
    distributed = pytest.importorskip("distributed", reason="dask not installed (test-remote)")
    cluster = distributed.LocalCluster(
        n_workers=request.param,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",  # a free port: never one a developer's dashboard holds
        env=WORKER_ENV,
    )
    client = distributed.Client(cluster, set_as_default=False)
    client.get_task_stream()  # the scheduler records tasks from now on
    try:
        yield cluster.scheduler_address, client
    finally:
        client.close()
        cluster.close()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cachedoctor", *args],
        env={**cli_env(), "CACHEDOCTOR_NO_INDEX": "1", **(env or {})},  # every entry decoded
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


_SCANNED_AT = re.compile(r'"scanned_at": [0-9.e+]+')


def _bar_time(text: str) -> str:
    assert _SCANNED_AT.search(text), text[:300]
    return _SCANNED_AT.sub('"scanned_at": 0', text)


def _tasks(client: Any, since: float, name: str) -> int:
    return sum(1 for t in client.get_task_stream(start=since) if t["key"].startswith(name))


@pytest.mark.slow
def test_dask_scan_of_a_local_cache_is_the_default_scan(
    cache: Path, dask_cluster: tuple[str, Any]
) -> None:
    address, client = dask_cluster
    default = _cli("scan", "--json", str(cache))
    assert default.returncode == 1, default.stderr  # the two damaged entries are errors
    assert len(json.loads(default.stdout)["entries"]) >= 4
    since = time.time()
    for executor in (address, address.replace("tcp://", "dask://")):
        on_dask = _cli("scan", "--json", "--executor", executor, str(cache))
        assert on_dask.returncode == 1, on_dask.stderr
        assert _bar_time(on_dask.stdout) == _bar_time(default.stdout)
    chunks = _tasks(client, since, "_decode_batch")
    assert chunks >= 2 * 2, "every entry must be decoded on the cluster, in several chunks"
    lint, lint_on_dask = _cli("lint", str(cache)), _cli("lint", "--executor", address, str(cache))
    assert (lint.returncode, lint.stdout) == (lint_on_dask.returncode, lint_on_dask.stdout)
    assert _tasks(client, since, "_decode_batch") > chunks


@pytest.mark.slow
def test_processes_executor_is_the_default_scan(cache: Path) -> None:
    default = _cli("scan", "--json", str(cache))
    pooled = _cli("scan", "--json", "--executor", "processes:2", str(cache))
    assert pooled.returncode == default.returncode == 1, pooled.stderr
    assert _bar_time(pooled.stdout) == _bar_time(default.stdout)


@pytest.mark.slow
def test_api_with_thread_and_process_pools(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEDOCTOR_NO_INDEX", "1")
    default = dataclasses.replace(cachedoctor.scan(cache), scanned_at=0)
    calls: list[int] = []
    with ThreadPoolExecutor(3) as threads:
        real_submit = threads.submit

        def counting(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            calls.append(threading.get_ident())
            return real_submit(fn, *args, **kwargs)

        monkeypatch.setattr(threads, "submit", counting)
        assert dataclasses.replace(cachedoctor.scan(cache, executor=threads), scanned_at=0) == (
            default
        )
    assert len(calls) >= 3
    with ProcessPoolExecutor(2) as processes:
        on_processes = cachedoctor.scan(cache, executor=processes)
        assert dataclasses.replace(on_processes, scanned_at=0) == default
        linted = cachedoctor.lint(cache, executor=processes)
    assert linted.scan.findings[: len(default.findings)] == default.findings


@pytest.mark.slow
@pytest.mark.remote
def test_dask_scan_of_a_bucket_is_the_default_scan(
    cache: Path, dask_cluster: tuple[str, Any]
) -> None:
    from tests.support.buckets import running_servers, upload

    address, client = dask_cluster
    with running_servers() as servers:
        url = servers.url("s3", f"dask-{os.getpid()}-{time.monotonic_ns()}/cache")
        upload(url, cache)
        default = _cli("scan", "--json", url, env=servers.env)
        assert default.returncode == 1, default.stderr
        since = time.time()
        on_dask = _cli("scan", "--json", "--executor", address, url, env=servers.env)
        assert on_dask.returncode == 1, on_dask.stderr
    assert _bar_time(on_dask.stdout) == _bar_time(default.stdout)
    assert len(json.loads(on_dask.stdout)["entries"]) >= 4
    assert _tasks(client, since, "decode_store_chunk") >= 2
    # the workers' reads are counted: the same bytes as the default scan's (request counters)
    read = re.compile(r"entries, ([0-9.]+ \w+) read on (.*?), 0 retries")
    default_read, dask_read = read.search(default.stderr), read.search(on_dask.stderr)
    assert default_read and dask_read, (default.stderr, on_dask.stderr)
    assert dask_read.group(1) == default_read.group(1) != "0 B"
    assert dask_read.group(2) == f"Dask {address}"
