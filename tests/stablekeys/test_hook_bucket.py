"""The hook with a ``gs://`` / ``s3://`` cache dir (local S3 and GCS servers): the seed program
hits from run 2 by replay, a changed partition rule gives its new result, concurrent writers
leave whole manifests, and the manifests are read once per process."""

from __future__ import annotations

import pytest

from cachedoctor.stablekeys import manifest
from tests.support.buckets import Servers
from tests.support.hookrun import base_env, entries, run_program, run_recorded

pytestmark = [pytest.mark.slow, pytest.mark.remote]

SEED_RESULT = "result: [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]"


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_seed_on_a_bucket_one_entry_hits_from_run_two(scheme: str, servers: Servers) -> None:
    url = servers.url(scheme, "seed/cache")
    env = base_env(url, **servers.env)
    runs = [run_program("seed", url, env=env) for _ in range(3)]
    assert "jit_f" in runs[0].misses and runs[0].stats["recorded"] == 1
    for run in runs[1:]:
        assert run.result == SEED_RESULT
        assert run.misses == [], run.stderr[-2000:]
        assert run.stats["replayed"] == 1 and run.stats["unsound"] == 0
    (key,) = entries(url, "jit_f")
    m = manifest.load_manifest(url, key)
    assert m is not None and m.key_mode == "replay" and manifest.recompute_key(m) == key

    changed = run_program("seed", url, env={**env, "CACHEDOCTOR_SEED_ADD": "2.0"})
    assert changed.result == "result: [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]"
    assert "jit_f" in changed.misses and changed.stats["replay_misses"] == 1
    back = run_program("seed", url, env=env)
    assert back.result == SEED_RESULT and back.misses == []
    assert len(entries(url, "jit_f")) == 2


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_stats_record_reaches_the_bucket(scheme: str, servers: Servers) -> None:
    """The record is written as the process ends (on S3 none ever arrived: the write came after
    Python had shut its thread pools down, "cannot schedule new futures after shutdown")."""
    from cachedoctor.core.usage.records import read_records
    from cachedoctor.storage import stores

    url = servers.url(scheme, "stats/cache")
    for mode in ("stable", "stats"):
        log = run_recorded(url, mode, "plain", **servers.env)
        assert "could not write the stats record" not in log, log[-2000:]
    records, problems = read_records(stores.open_store(url))
    assert problems == [] and sorted(r.hook for r in records) == ["stable", "stats"]
    assert all(r.modules["jit_g"].requests == 1 for r in records)
