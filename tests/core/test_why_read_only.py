"""Read-only runs (``CACHEDOCTOR_READ_ONLY``) record outside the cache they read: ``why`` finds
their records from the cache and from the records folder alike, each cache's records stay apart
in the default records folder, and ``stats`` names the cache its figures are of.

JAX is the oracle: its DEBUG digest per component of each key says what changed between the run
that wrote the cache and the read-only run that missed ("PERSISTENT COMPILATION CACHE MISS",
``JAX_EXPLAIN_CACHE_MISSES``), and ``why`` must name those components."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cachedoctor.cli import cli
from tests.support.buckets import Servers
from tests.support.keylog import MODULE, differing, logged_keys, run_logged

pytestmark = pytest.mark.slow

FLAG = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}
READ_ONLY = {"CACHEDOCTOR_READ_ONLY": "1"}
# JAX's explain line (JAX_EXPLAIN_CACHE_MISSES, set by base_env): the module and the key it missed
_MISSED = re.compile(r"PERSISTENT COMPILATION CACHE MISS for '([^']+)' with key '([^']+)'")


def invoke(*args: str) -> tuple[int, str]:
    done = CliRunner().invoke(cli, list(args), terminal_width=400)
    return done.exit_code, done.output


def why(folder: Path) -> dict[str, Any]:
    code, out = invoke("why", str(folder), "--json", "--module", MODULE)
    assert code == 0, out
    doc: dict[str, Any] = json.loads(out)
    return doc


def default_root() -> Path:
    """This user's folder of read-only records (conftest points XDG_CACHE_HOME at the test's)."""
    return Path(os.environ["XDG_CACHE_HOME"]) / "cachedoctor" / "read-only-records"


def record_folders(root: Path) -> list[Path]:
    """The folders under ``root`` whose cachedoctor-stats/ holds a record."""
    return sorted({p.parent.parent for p in root.rglob("cachedoctor-stats/*.json")})


def miss_of(doc: dict[str, Any], key: str) -> dict[str, Any]:
    (miss,) = [m for m in doc["misses"] if m["key"] == key]
    assert isinstance(miss, dict)
    return miss


def test_read_only_misses_are_explained_from_the_cache_and_from_the_records_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A normal run writes the cache; two read-only runs miss it, one with an XLA flag added
    (its record in the records folder the environment names, as a CI job's), one with the
    program edited (its record in the default folder). JAX says each missed and what differs;
    ``why CACHE`` explains both misses, and ``why FOLDER`` each folder's, against the key the
    first run wrote, which only the cache's own record holds."""
    cache, named = tmp_path / "cache", tmp_path / "records"
    monkeypatch.setenv("CACHEDOCTOR_RECORDS_DIR", str(named))  # the why below reads it too
    logs = [
        run_logged(cache, "stats"),
        run_logged(
            cache, "stats", env={**READ_ONLY, **FLAG, "CACHEDOCTOR_RECORDS_DIR": str(named)}
        ),
        run_logged(cache, "stats", env={**READ_ONLY, "WHY_EDIT": "1"}),
    ]
    jax_missed = [dict(_MISSED.findall(log)).get(MODULE) or "" for log in logs]
    assert all(jax_missed), jax_missed  # JAX: each run missed jit_step, each a key of its own
    first, flagged, edited = (logged_keys(log)[0] for log in logs)
    assert len(list((cache / "cachedoctor-stats").glob("*.json"))) == 1  # the normal run's only
    (default,) = record_folders(default_root())
    expected = {
        jax_missed[1]: (named, differing(first, flagged), "+ --xla_cpu_enable_fast_math"),
        jax_missed[2]: (default, differing(first, edited), "the program changed"),
    }
    from_cache = why(cache)
    assert [m["verdict"] for m in from_cache["misses"]] == ["first", "changed", "changed"]
    for key, (folder, jax_says, words) in expected.items():
        for doc in (from_cache, why(folder)):
            miss = miss_of(doc, key)
            assert miss["verdict"] == "changed", miss
            assert {c["component"] for c in miss["changes"]} == jax_says, (miss, jax_says)
            assert words in miss["words"], miss["words"]
            assert miss["nearest"] == jax_missed[0] and miss["nearest_in_cache"], miss
            assert miss["cache"] == str(cache.resolve())
    _, text = invoke("why", str(named), "--module", MODULE)
    assert f"records of the cache {cache.resolve()}: 3 process records, 2 of read-only runs" in text


def test_each_caches_records_stay_apart_and_stats_names_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two caches, each used read-only: their records go to two folders, and ``stats`` of each
    names its cache (text and JSON), not the records folder. Records of both in the one folder
    every cache's went to before (as an earlier cachedoctor wrote them: moved there from where
    the runs put them) are still read where they are: ``why`` of a cache takes its own alone,
    and ``stats`` of that folder names both caches."""
    caches = [tmp_path / "a" / "jaxcache", tmp_path / "b" / "jaxcache"]
    for cache in caches:
        run_logged(cache, "stats")
        run_logged(cache, "stats", env={**READ_ONLY, **FLAG})
        assert len(list((cache / "cachedoctor-stats").glob("*.json"))) == 1
    folders = record_folders(default_root())
    assert len(folders) == 2, folders  # one each: never mixed
    for folder in folders:
        (record,) = folder.glob("cachedoctor-stats/*.json")
        named = json.loads(record.read_text())["cache_dir"]
        code, text = invoke("stats", str(folder))
        assert code == 0 and text.splitlines()[0] == f"cache {named}", text
        assert f"records of its read-only runs, in {folder}" in text
        doc = json.loads(invoke("stats", str(folder), "--json")[1])
        assert doc["cache"] == named and doc["caches"] == [
            {"cache": named, "processes": 1, "read_only": True}
        ]
    named = sorted(json.loads(p.read_text())["cache_dir"] for p in default_root().rglob("*.json"))
    assert named == sorted(str(c.resolve()) for c in caches)
    code, text = invoke("stats", str(caches[0]))
    assert "1 record of its read-only runs in" in text, text
    # the earlier layout: every cache's records in the root's own cachedoctor-stats/, each
    # naming its cache as JAX spelled it (the first here through a link to its folder)
    legacy = default_root() / "cachedoctor-stats"
    legacy.mkdir()
    alias = tmp_path / "alias"
    alias.symlink_to(caches[0].parent)
    for folder in folders:
        for record in folder.glob("cachedoctor-stats/*.json"):
            doc = json.loads(record.read_text())
            if doc["cache_dir"] == str(caches[0].resolve()):
                doc["cache_dir"] = str(alias / caches[0].name) + "/"
            (legacy / record.name).write_text(json.dumps(doc))
            record.unlink()
    for cache in caches:
        doc = why(cache)
        assert [m["verdict"] for m in doc["misses"]] == ["first", "changed"], doc["misses"]
        assert {m["cache"] for m in doc["misses"]} == {str(cache.resolve())}
    doc = json.loads(invoke("stats", str(default_root()), "--json")[1])
    assert doc["cache"] is None
    assert sorted(c["cache"] for c in doc["caches"]) == sorted(str(c.resolve()) for c in caches)
    code, text = invoke("stats", str(default_root()))
    assert text.splitlines()[0] == f"records in {default_root()}, of 2 caches", text
    # a cache gone (deleted, or the records copied off its machine): its read-only miss cannot
    # be told from a first compile, and is not called one
    shutil.rmtree(caches[1])
    code, out = invoke("why", str(default_root()), "--json", "--module", MODULE)
    verdicts = {(m["cache"], m["verdict"]) for m in json.loads(out)["misses"]}
    assert verdicts == {
        (str(caches[0].resolve()), "first"),
        (str(caches[0].resolve()), "changed"),
        (str(caches[1].resolve()), "unknown"),
    }
    assert code == 1


@pytest.mark.remote
def test_a_read_only_run_on_a_bucket_is_explained_from_the_bucket_and_the_records(
    servers: Servers, tmp_path: Path
) -> None:
    """An s3:// cache: a normal run records into the bucket, a read-only one with an XLA flag
    added records into the default folder of that bucket's cache. ``why`` of the bucket and of
    the folder both set its miss against the bucket's recorded key, naming what JAX's digests
    say differs."""
    url = servers.url("s3", f"why-read-only/{tmp_path.name}/cache")
    logs = [
        run_logged(url, "stats", env=servers.env),
        run_logged(url, "stats", env={**servers.env, **READ_ONLY, **FLAG}),
    ]
    first, second = (dict(_MISSED.findall(log))[MODULE] for log in logs)
    jax_says = differing(*(logged_keys(log)[0] for log in logs))
    (folder,) = record_folders(default_root())
    for named in (url, str(folder)):
        code, out = invoke("why", named, "--json", "--module", MODULE)
        assert code == 0, out
        miss = miss_of(json.loads(out), second)
        assert miss["verdict"] == "changed" and miss["cache"] == url, miss
        assert {c["component"] for c in miss["changes"]} == jax_says, miss
        assert miss["nearest"] == first and miss["nearest_in_cache"], miss
