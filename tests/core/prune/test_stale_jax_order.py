"""``prune --stale-jax`` decides on the times it prints (issue 54, "Selectors").

The oracle is the order of real runs of two JAX versions on one cache, each with the stats
hook on: jax 0.8.3 twice, then the installed JAX twice, is an upgrade (0.8.3's entries are
stale and go); 0.8.3, the installed JAX, 0.8.3 is a cache two versions share (both kept). After
``--apply``, JAX's own log of the next runs says no hit was lost.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cachedoctor.core.prune.actions import Plan, Selector
from cachedoctor.core.prune.apply import apply
from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.core.prune.planner import plan_prune
from cachedoctor.storage.location import Location
from tests.support import hookrun
from tests.support.caches import other_jax_python

pytestmark = pytest.mark.slow

HIT_RE = hookrun.HIT_KEY_RE


def run(cache: Path, python: str) -> set[str]:
    """One run of the plain program with the stats hook on; the keys JAX's log says it hit."""
    env = hookrun.base_env(
        cache,
        CACHEDOCTOR_HOOK="stats",
        JAX_LOG_COMPILES="1",
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        CACHEDOCTOR_PLAIN_SIZE="16",
    )
    done = hookrun.run_program("plain", cache, mode="none", env=env, python=python)
    return set(HIT_RE.findall(done.stderr + done.stdout))


def stale_plan(cache: Path) -> Plan:
    return plan_prune(Location.parse(cache), PruneOptions.from_selectors(stale_jax=True))


def removed(plan: Plan) -> set[str]:
    return {a.name for a in plan.actions if Selector.STALE_JAX in a.rules}


def test_a_version_upgraded_away_is_stale(tmp_path: Path) -> None:
    """0.8.3 wrote and hit its entries, then only the installed JAX ran: 0.8.3's last use
    (its stats record's hit) precedes the installed JAX's first write, so its entries go, and
    the plan says both times. The old rule printed the record's time but decided on the
    relatime window after the access time (up to now), and kept them."""
    other = other_jax_python()
    cache = tmp_path / "cache"
    run(cache, other)
    old = set(hookrun.entries(cache))
    assert run(cache, other) == old  # 0.8.3 hits every entry it wrote
    run(cache, sys.executable)  # the upgrade
    ours = set(hookrun.entries(cache)) - old
    assert run(cache, sys.executable) == ours

    plan = stale_plan(cache)
    assert removed(plan) == old
    for action in plan.actions:
        if action.name in old:
            assert "not used since jaxlib" in action.reason, action.reason
            assert "(stats record" in action.reason, action.reason
    apply(plan)
    assert set(hookrun.entries(cache)) == ours
    assert run(cache, sys.executable) == ours  # no hit of the installed JAX lost


def test_a_cache_two_versions_share_keeps_both(tmp_path: Path) -> None:
    """0.8.3 runs again after the installed JAX first wrote here: its entries are in use,
    kept with the time that says so."""
    other = other_jax_python()
    cache = tmp_path / "cache"
    run(cache, other)
    old = set(hookrun.entries(cache))
    run(cache, sys.executable)
    assert run(cache, other) == old  # 0.8.3 still runs here, after the installed JAX

    plan = stale_plan(cache)
    assert removed(plan) == set()
    kept = {s.name: s.reason for s in plan.skipped if s.rule is Selector.STALE_JAX}
    assert set(kept) == old
    assert all("may still use it" in why and "--stale-jax-in-use" in why for why in kept.values())
    apply(plan)
    assert run(cache, other) == old  # no hit of 0.8.3 lost
