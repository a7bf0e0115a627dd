"""``jax.distributed`` jobs on CPU (2 and 4 processes, started together) sharing one cache, a
local directory or a bucket, with the hook: process 0 hits from job 2, every other process does
as well as JAX itself does there, each says why it misses, and the cache holds one entry per
key and only whole manifests."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cachedoctor.core.findings import FindingKind
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.stablekeys import manifest
from cachedoctor.stablekeys.processes import per_process_keys
from cachedoctor.storage.location import Location
from tests.support.buckets import Servers
from tests.support.caches import SUPPORT_DIR
from tests.support.hookrun import _RUNNER, Run, base_env, entries
from tests.support.sessioncache import SharedBuilds

pytestmark = pytest.mark.slow

PROGRAM = SUPPORT_DIR / "distributed_seed.py"
MODULES = ("jit_custom", "jit_plain")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job(cache: Path | str, processes: int, mode: str = "stable", **env: str) -> list[Run]:
    """All processes of one job, started together; their runs, process 0 first."""
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RUNNER, mode, str(PROGRAM), str(i), port, str(processes)],
            env=base_env(cache, **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    runs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        runs.append(Run(proc.returncode, out, err))
    return runs


def _shards(run: Run) -> dict[str, list[float]]:
    found = {}
    for line in run.stdout.splitlines():
        name, sep, values = line.partition(": ")
        if sep and name in ("custom", "plain"):
            found[name] = [float(v) for v in values.strip("[]").split(", ")]
    return found


def _expected(process: int, processes: int) -> dict[str, list[float]]:
    k = 8 // processes
    local = [float(v) for v in range(process * k, (process + 1) * k)]
    return {"custom": [v + 1 for v in local], "plain": [v * 2 for v in local]}


@pytest.fixture(scope="session")
def jax_alone_hits(shared_builds: SharedBuilds) -> Callable[[int], list[set[str]]]:
    """What JAX itself hits in job 2 of a job without the hook, per process (the oracle of
    "where JAX itself can"): ``jit_plain`` only, and only where JAX can reuse a key. Two jobs
    per job size, run once per session (each worker ran them again before)."""

    def hits(processes: int) -> list[set[str]]:
        def make(folder: Path) -> list[set[str]]:
            job(folder / "cache", processes, mode="none")
            second = job(folder / "cache", processes, mode="none")
            return [{"jit_plain"} - set(run.misses) for run in second]

        _folder, found = shared_builds(f"jax-alone-{processes}", make, PROGRAM.read_text())
        return list(found)

    return hits


WHERE = [
    ("local", 2),
    ("local", 4),
    pytest.param("s3", 2, marks=pytest.mark.remote),
    pytest.param("s3", 4, marks=pytest.mark.remote),
]


@pytest.mark.parametrize(("where", "processes"), WHERE)
def test_job_hits_from_run_two_where_jax_can(
    where: str,
    processes: int,
    tmp_path: Path,
    jax_alone_hits: Callable[[int], list[set[str]]],
    request: pytest.FixtureRequest,
) -> None:
    env: dict[str, str] = {}
    cache: Path | str = tmp_path / "cache"
    if where != "local":
        servers: Servers = request.getfixturevalue("servers")
        cache, env = servers.url(where, f"dist/{tmp_path.name}/cache"), servers.env
    first = job(cache, processes, **env)
    assert all(set(MODULES) <= set(run.misses) for run in first)
    jax_hits = jax_alone_hits(processes)
    for job_number in (2, 3):
        runs = job(cache, processes, **env)
        for i, run in enumerate(runs):
            assert _shards(run) == _expected(i, processes), run.stdout
        p0 = runs[0]
        # process 0 (the one JAX lets write) hits by replaying its recorded calls
        assert p0.misses == [], (job_number, p0.stderr[-2000:])
        assert p0.stats["replayed"] == 1
        for i, run in enumerate(runs[1:], start=1):
            # as well as JAX itself: a module JAX reuses here is reused with the hook too
            assert {"jit_plain"} - set(run.misses) >= jax_hits[i], (i, run.misses)
            assert ("jit_custom" in run.misses) == ("jit_plain" in run.misses)
            # and the process says why, once, naming the key component
            said = [line for line in run.stderr.splitlines() if line.startswith("cachedoctor: ")]
            if "jit_plain" in run.misses:
                assert len(said) == 1 and "accelerator_config" in said[0], run.stderr[-2000:]
                assert f"process {i}'s key differs from process 0's only in" in said[0]
    # one entry per key (only process 0 writes, the same keys every job), whole manifests only
    assert [len(entries(cache, m)) for m in MODULES] == [1, 1]
    found = list(manifest.iter_manifests(Location.parse(cache)))
    assert len(found) == len(manifest.manifest_keys(Location.parse(cache)))
    assert {m.process_index for m in found} == set(range(processes))
    explained = {(k.module, k.process_index): k.fields for k in per_process_keys(found)}
    if not any(jax_hits[1:]):  # JAX keys each process apart: the manifests show where
        for i in range(1, processes):
            assert explained[("jit_plain", i)] == ("accelerator_config",), explained
        # and scan (lint) says so, instead of calling process 1's keys "not stored"
        findings = scan_directory(Location.parse(cache)).findings
        (info,) = [f for f in findings if f.kind is FindingKind.MULTI_PROCESS]
        assert "only in accelerator_config" in info.message and "jit_plain" in info.message
        assert not [f for f in findings if f.kind is FindingKind.NOT_STORED]


def _autotune_modes(cache: Path | str) -> dict[int | None, str | None]:
    """The autotune sub-cache mode each process's compile options carried (its manifests)."""
    return {
        m.process_index: m.autotune_mode
        for m in manifest.iter_manifests(Location.parse(cache))
        if m.module_name == "jit_plain"
    }


@pytest.mark.remote
def test_autotune_roles_on_a_bucket_are_jax_s(servers: Servers, tmp_path: Path) -> None:
    """Seed 004's roles: JAX gives process 0 the autotune sub-cache in UPDATE mode and the
    others READ. On a bucket, activation keeps the sub-cache local; the roles stay JAX's
    (before: JAX's branch was off there and every process had XLA's default, UPDATE)."""
    oracle = tmp_path / "local-cache"
    job(oracle, 2)  # the hook alone, a local dir: JAX's own sub-cache branch runs
    expected = _autotune_modes(oracle)
    assert expected == {0: "UPDATE", 1: "READ"}
    url = servers.url("s3", f"roles/{tmp_path.name}/cache")
    activated = {
        "CACHEDOCTOR_HOOK": "stable",
        "CACHEDOCTOR_XLA_SUBCACHE_ROOT": str(tmp_path / "subcaches"),
        **servers.env,
    }
    runs = job(url, 2, mode="none", **activated)
    assert not any("cannot give the local autotune" in r.stderr for r in runs)
    assert _autotune_modes(url) == expected

    # `status` asks JAX the same of a fresh interpreter, and reads the bucket's manifests
    env = {**base_env(url, **activated), "NO_COLOR": "1"}
    shown = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(shown.stdout)
    (autotune,) = [r for r in report["roles"] if r.startswith("autotune sub-cache")]
    assert str(tmp_path / "subcaches") in autotune
    assert "process 0 UPDATE, processes 1..N-1 READ" in autotune
    assert not [w for w in report["warnings"] if w["code"] == "autotune-roles"]
    per_process = {(k["module"], k["process_index"]) for k in report["key_modes"]["per_process"]}
    assert ("jit_plain", 1) in per_process
    assert _lint_warnings(url, servers) == []

    # the roles lost, as before on a bucket (JAX's sub-caches off, a folder in XLA_FLAGS and
    # no one to set the mode): lint says so from the manifests
    lost = servers.url("s3", f"roles-lost/{tmp_path.name}/cache")
    flags = f"--xla_gpu_per_fusion_autotune_cache_dir={tmp_path / 'own-autotune'}"
    job(lost, 2, JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="none", XLA_FLAGS=flags, **servers.env)
    assert _autotune_modes(lost) == {0: "UPDATE", 1: "UPDATE"}
    (warning,) = _lint_warnings(lost, servers)
    assert "process(es) 1 of a jax.distributed job" in warning["message"]
    assert "UPDATE mode" in warning["message"]


def _lint_warnings(url: str, servers: Servers) -> list[dict[str, str]]:
    """lint's multi-process warnings on a bucket cache (its JSON document)."""
    linted = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "lint", "--format", "json", url],
        env={**base_env(None, **servers.env), "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert linted.returncode == 0, linted.stderr[-2000:]
    findings = json.loads(linted.stdout)["findings"]
    kinds = {f["kind"] for f in findings}
    assert "not-stored" not in kinds  # process 1's keys are not modules JAX refused to store
    return [f for f in findings if f["kind"] == "multi-process" and f["severity"] == "warning"]


LAUNCH = """
import socket, subprocess, sys
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = str(s.getsockname()[1])
procs = [subprocess.Popen([sys.executable, {program!r}, str(i), port]) for i in (0, 1)]
sys.exit(max(p.wait() for p in procs))
"""


def test_check_names_what_jax_hashes_per_process(tmp_path: Path) -> None:
    """`check -- CMD` on a 2-process job: process 1 recompiles every run, and the report says
    why from the manifests (its key differs from process 0's only in accelerator_config)."""
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCH.format(program=str(PROGRAM)))
    cache = tmp_path / "cache"

    def check(output: str) -> subprocess.CompletedProcess[str]:
        argv = ["check", "--dir", str(cache), "--runs", "2", "--format", output, "--"]
        checked = subprocess.run(
            [sys.executable, "-m", "cachedoctor", *argv, sys.executable, str(launcher)],
            env={**base_env(None), "NO_COLOR": "1", "COLUMNS": "400"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert checked.returncode in (0, 1), checked.stderr[-3000:]  # 1: jit_custom's JAX key
        return checked

    report = json.loads(check("json").stdout)
    found = {(k["module"], k["process_index"]): tuple(k["fields"]) for k in report["per_process"]}
    assert found[("jit_plain", 1)] == ("accelerator_config",)
    shown = check("text").stdout
    assert "whose keys differ from process 0's only in accelerator_config" in shown
