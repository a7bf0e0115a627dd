"""Which of the hook suites' tests each JAX release's compat session runs (issue 55, lever 1).

The oldest and the newest supported release run every compat test. Each release between them
runs the reader, fixture and key tests in full and, of the suites that run the hook in JAX
processes, a pairwise cover of release x cache scheme x hook mode: a few probes (tests of one
scheme, each running the modes it names) chosen so that every (release, scheme), every
(release, mode) and every (scheme, mode) pair the probes hold is run at least once over those
releases. ``noxfile.py`` passes a release's probes to pytest by node id (an id that no longer
exists is pytest's error, not a silent skip); tests/test_compat_cover.py checks the cover.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SCHEMES = ("local", "s3", "gs")
MODES = ("stable", "observe", "stats", "off")  # off: JAX without the hook (settings.HOOK_CHOICES)


@dataclass(frozen=True)
class Probe:
    test: str  # a pytest node id
    scheme: str
    modes: frozenset[str]
    processes: int  # the JAX processes it starts: its cost

    def pairs(self) -> set[tuple[str, str]]:
        return {(self.scheme, mode) for mode in self.modes}


# Tests of the hook suites that each check the hook's promise on one scheme in the modes named
# (a run without the hook counts as "off": the control JAX's own behaviour is read from), and
# the JAX processes each starts.
_READ_ONLY = "test_readonly.py::test_a_read_only_run_hits_what_a_normal_run_hits_and_writes_nothing"
_SEED_ON_BUCKET = "test_hook_bucket.py::test_seed_on_a_bucket_one_entry_hits_from_run_two"
_STATS_RECORD = "test_hook_bucket.py::test_stats_record_reaches_the_bucket"
_TABLE = [
    ("test_hook.py::test_observe_mode_keeps_jax_keys", "local", "observe off", 2),
    ("test_hook.py::test_seed_without_hook_never_hits", "local", "off", 2),
    ("test_hook.py::test_warm_cache_migrates_without_recompiling", "local", "stable off", 4),
    (f"{_READ_ONLY}[stats]", "local", "stats", 3),
    (f"{_STATS_RECORD}[s3]", "s3", "stats", 2),
    (f"{_STATS_RECORD}[gs]", "gs", "stats", 2),
    (f"{_SEED_ON_BUCKET}[s3]", "s3", "stable", 5),
    (f"{_SEED_ON_BUCKET}[gs]", "gs", "stable", 5),
]
PROBES = tuple(
    Probe("tests/stablekeys/" + test, scheme, frozenset(modes.split()), processes)
    for test, scheme, modes, processes in _TABLE
)


def _cost(probes: Iterable[Probe]) -> int:
    return sum(p.processes for p in probes)


def _cheapest_full_set(probes: Sequence[Probe]) -> tuple[Probe, ...]:
    """The cheapest probes that together run every scheme and every mode (ties: table order)."""
    best: tuple[Probe, ...] | None = None
    for size in range(1, len(probes) + 1):
        for chosen in itertools.combinations(probes, size):
            schemes = {p.scheme for p in chosen}
            modes = set().union(*(p.modes for p in chosen))
            full = schemes == set(SCHEMES) and modes == set(MODES)
            if full and (best is None or _cost(chosen) < _cost(best)):
                best = chosen
    if best is None:
        raise ValueError("the probes do not run every scheme and every mode")
    return best


def cover(releases: Sequence[str], probes: Sequence[Probe] = PROBES) -> dict[str, list[str]]:
    """The probes each release runs: all schemes and modes on each, then every (scheme, mode)
    pair not yet run on the release that has run least so far."""
    base = _cheapest_full_set(probes)
    chosen = {release: list(base) for release in releases}
    if not releases:
        return {}
    missing = set().union(*(p.pairs() for p in probes)) - set().union(*(p.pairs() for p in base))
    while missing:
        pair = min(missing)
        probe = min((p for p in probes if pair in p.pairs()), key=lambda p: p.processes)
        release = min(releases, key=lambda r: _cost(chosen[r]))
        chosen[release].append(probe)
        missing -= probe.pairs()
    return {release: [p.test for p in found] for release, found in chosen.items()}
