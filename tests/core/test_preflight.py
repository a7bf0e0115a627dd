"""`cachedoctor preflight`: will this cache hit here, predicted before the run, with JAX as the
oracle: the program then runs in that environment, and JAX's own log says whether it hit
(``Persistent compilation cache hit for``); a predicted miss names only components that JAX's
own DEBUG digests show differing between the two runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cachedoctor.cli import cli
from tests.support.buckets import Servers
from tests.support.hookrun import base_env
from tests.support.keylog import MODULE, differing, hits, logged_keys, run_logged


def preflight(cache: Path | str, *args: str, **env: str) -> tuple[int, dict[str, Any]]:
    """``cachedoctor preflight --json`` in a fresh interpreter with the environment the program
    would run in (its XLA_FLAGS as ``why_program.py`` makes them)."""
    flags = env.pop("XLA_FLAGS", "")
    devices = env.get("WHY_DEVICES", "8")
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    proc = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "preflight", str(cache), "--json", *args],
        capture_output=True,
        text=True,
        env=base_env(cache, **env),
        timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


def module_of(doc: dict[str, Any], name: str = MODULE) -> dict[str, Any]:
    (found,) = [m for m in doc["modules"] if m["module"] == name]
    return dict(found)


def entry_of(doc: dict[str, Any], name: str = MODULE) -> dict[str, Any]:
    (found,) = [e for e in doc["entries"] if e["module"] == name]
    return dict(found)


SCENARIOS: dict[str, dict[str, str]] = {
    "same": {},
    "xla-flag": {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"},
    "devices": {"WHY_DEVICES": "4"},
    "x64": {"JAX_ENABLE_X64": "1"},
    "precision": {"JAX_DEFAULT_MATMUL_PRECISION": "highest"},
}


def _judge(doc: dict[str, Any], first: dict[str, str], stderr: str) -> None:
    """The prediction for jit_step against what JAX then did."""
    predicted = entry_of(doc)
    jax_hit = MODULE in hits(stderr)
    if predicted["verdict"] != "unknown":  # "unknown" claims neither
        assert (predicted["verdict"] == "hit") == jax_hit, (predicted, jax_hit)
    if predicted["verdict"] == "miss":
        second = logged_keys(stderr)[0]
        named = {d["component"] for d in predicted["differences"]}
        assert named and named <= differing(first, second), (named, differing(first, second))


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_preflight_predicts_what_jax_then_does(tmp_path: Path, scenario: str) -> None:
    after = SCENARIOS[scenario]
    cache = tmp_path / "cache"
    first = logged_keys(run_logged(cache))[0]
    code, doc = preflight(cache, **after)
    expected = {"same": "hit", "x64": "unknown", "precision": "unknown"}
    assert entry_of(doc)["verdict"] == expected.get(scenario, "miss"), doc["entries"]
    assert code == (1 if expected.get(scenario, "miss") == "miss" else 0)
    _judge(doc, first, run_logged(cache, env=after))
    if scenario in ("x64", "precision"):
        assert entry_of(doc)["differences"][0]["before"] != entry_of(doc)["differences"][0]["after"]
    if scenario == "xla-flag":
        assert "+ --xla_cpu_enable_fast_math=true" in entry_of(doc)["words"]


@pytest.mark.slow
def test_a_copied_cache_is_predicted_as_jax_treats_it(tmp_path: Path) -> None:
    """A cache copied to another path: jax ≤ 0.10 hashes the autotune dir under it (a miss,
    naming both spellings), 0.12 does not (a hit). The prediction is JAX's either way."""
    cache, copy = tmp_path / "cache", tmp_path / "elsewhere" / "cache"
    first = logged_keys(run_logged(cache))[0]
    shutil.copytree(cache, copy)
    _, doc = preflight(copy)
    predicted = entry_of(doc)
    if predicted["verdict"] == "miss":
        assert f"spelled {copy} here, {cache} when written" in predicted["words"]
    _judge(doc, first, run_logged(copy))


@pytest.mark.slow
def test_a_cache_of_another_jaxlib_will_miss_with_or_without_a_record(tmp_path: Path) -> None:
    """jax 0.8.3 wrote the cache: with a record, preflight names both jaxlib versions; without
    one, the entry's own compile options show another jaxlib (or it cannot tell: never a
    hit). JAX here then misses."""
    from tests.support.caches import other_jax_python
    from tests.support.hookrun import jax_version

    other = other_jax_python()
    recorded, plain = tmp_path / "recorded", tmp_path / "plain"
    first = logged_keys(run_logged(recorded, python=other))[0]
    run_logged(plain, hook=None, python=other)
    import jax

    _, doc = preflight(recorded)
    assert entry_of(doc)["words"].startswith(f"jaxlib {jax_version(other)} → {jax.__version__}")
    _judge(doc, first, run_logged(recorded))
    _, doc = preflight(plain)
    assert entry_of(doc)["verdict"] in ("miss", "unknown"), entry_of(doc)
    assert MODULE not in hits(run_logged(plain, hook=None))


@pytest.mark.slow
def test_a_bucket_is_predicted_as_jax_treats_it(servers: Servers, tmp_path: Path) -> None:
    """A cache in a bucket (s3://, the hook recording): the same environment hits, an XLA flag
    misses, as JAX then does."""
    url = servers.url("s3", f"preflight/{tmp_path.name}/cache")
    job = {**servers.env, "CACHEDOCTOR_HOOK": "stats"}  # the job's environment, hook included
    first = logged_keys(run_logged(url, env=servers.env))[0]
    code, doc = preflight(url, **job)
    assert entry_of(doc)["verdict"] == "hit" and code == 0, doc["entries"]
    _judge(doc, first, run_logged(url, env=servers.env))
    flagged = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}
    code, doc = preflight(url, **job, **flagged)
    assert entry_of(doc)["verdict"] == "miss" and code == 1, doc["entries"]
    _judge(doc, first, run_logged(url, env={**servers.env, **flagged}))


@pytest.mark.slow
def test_without_records_it_cannot_tell_and_says_what_to_enable(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    run_logged(cache, hook=None)
    code, doc = preflight(cache)
    assert module_of(doc)["verdict"] == "unknown" and code == 0
    assert "--stats-only" in doc["hint"]
    code, _ = preflight(cache, "--strict")
    assert code == 1


def test_jax_unusable_here_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: Any) -> None:
    from cachedoctor.stablekeys import here

    def no_jax(*_: Any, **__: Any) -> Any:
        raise here.ProbeError("cannot ask JAX what it would hash here: No module named 'jax'")

    monkeypatch.setattr(here, "probe", no_jax)
    cache = tmp_path / "cache"
    cache.mkdir()
    done = CliRunner().invoke(cli, ["preflight", str(cache)])
    assert done.exit_code == 2, done.output
    assert done.output.strip().splitlines() == [
        f"{cache}: cannot predict: cannot ask JAX what it would hash here: No module named 'jax'"
    ]


def _cli(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``cachedoctor ARGS CACHE`` in a fresh interpreter, with the programs' environment."""
    return subprocess.run(
        [sys.executable, "-m", "cachedoctor", *args, str(cache)],
        capture_output=True,
        text=True,
        env=base_env(cache),
        timeout=300,
    )


@pytest.mark.slow
def test_stats_zero_keeps_what_preflight_and_why_read(tmp_path: Path) -> None:
    """Trust IV: `stats --zero --apply` removed the records preflight and why read: before it
    preflight said "will miss" (exit 1), after it "cannot tell" (exit 0), and why said no
    process recorded. The counters reset; the history stays in the archive, and both read it.
    JAX then misses, as predicted."""
    cache = tmp_path / "cache"
    first = logged_keys(run_logged(cache))[0]
    flag = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}
    code, before = preflight(cache, **flag)
    assert code == 1 and entry_of(before)["verdict"] == "miss"
    why_before = _cli(cache, "why", "--json")
    zero = _cli(cache, "stats", "--zero", "--apply")
    assert zero.returncode == 0, zero.stderr
    stats = _cli(cache, "stats", "--json")
    assert json.loads(stats.stdout)["totals"]["requests"] == 0  # the counters did reset
    code, after = preflight(cache, **flag)
    assert code == 1 and entry_of(after)["verdict"] == "miss", entry_of(after)
    assert entry_of(after)["differences"] == entry_of(before)["differences"]
    why_after = _cli(cache, "why", "--json")

    def said(out: str) -> list[dict[str, Any]]:  # the record's file is the archive's now
        return [{k: v for k, v in m.items() if k != "record"} for m in json.loads(out)["misses"]]

    assert said(why_after.stdout) == said(why_before.stdout) != []
    _judge(after, first, run_logged(cache, env=flag))


@pytest.mark.slow
def test_with_metadata_in_the_key_it_cannot_tell(tmp_path: Path) -> None:
    """Trust IV: with `jax_compilation_cache_include_metadata_in_key` on, the key holds the
    program's source lines, which a preflight does not see: it said "will hit" (a moved line
    misses). Now "cannot tell", and a hit elsewhere says it assumes the same program."""
    cache = tmp_path / "cache"
    meta = {"JAX_COMPILATION_CACHE_INCLUDE_METADATA_IN_KEY": "1"}
    first = logged_keys(run_logged(cache, env=meta))[0]
    code, doc = preflight(cache, **meta)
    assert entry_of(doc)["verdict"] == "unknown" and code == 0, entry_of(doc)
    assert "jax_compilation_cache_include_metadata_in_key" in entry_of(doc)["words"]
    _judge(doc, first, run_logged(cache, env=meta))
    plain = tmp_path / "plain"
    run_logged(plain)
    _, doc = preflight(plain)
    assert "(for the same program)" in entry_of(doc)["words"]
