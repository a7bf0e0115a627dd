"""`cachedoctor why`: each recorded miss explained by the components of JAX's key that differ,
with JAX as the oracle: its own DEBUG log line per component ("get_cache_key hash of serialized
<component>: <digest>") in the same runs says which components differ, and the recorder's
digests must be JAX's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cachedoctor.cli import cli
from tests.support.keylog import (
    MODULE,
    differing,
    hits,
    logged_keys,
    run_logged,
    shared_history,
)
from tests.support.sessioncache import SharedBuilds


def run(cache: Path, hook: str | None = "stats", **env: str) -> list[dict[str, str]]:
    """Run the program; JAX's components of each key it computed, in order."""
    return logged_keys(run_logged(cache, hook, env=env))


def why_text(cache: Path, *args: str) -> tuple[int, str]:
    done = CliRunner().invoke(cli, ["why", str(cache), *args])
    return done.exit_code, done.output


def why(cache: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code, out = why_text(cache, "--json", *args)
    return code, json.loads(out)


SCENARIOS = {
    "xla-flag": (
        {},
        {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"},
        "+ --xla_cpu_enable_fast_math",
    ),
    "devices": ({}, {"WHY_DEVICES": "4"}, "8 cpu devices → 4 cpu devices; compile option"),
    "flag-twice": (
        {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"},
        {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true --xla_cpu_enable_fast_math=true"},
        "XLA flags --xla_cpu_enable_fast_math=true given once → twice",
    ),
    "edited": ({}, {"WHY_EDIT": "1"}, "the program changed"),
    "precision": (
        {},
        {"JAX_DEFAULT_MATMUL_PRECISION": "highest"},
        "the program changed, with `jax_default_matmul_precision` None → 'highest' in force",
    ),
    "moved-with-metadata": (
        {"JAX_COMPILATION_CACHE_INCLUDE_METADATA_IN_KEY": "true"},
        {"JAX_COMPILATION_CACHE_INCLUDE_METADATA_IN_KEY": "true", "WHY_MOVE": "3"},
        "a moved line counts",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_why_names_what_jaxs_own_components_show(
    shared_builds: SharedBuilds, scenario: str
) -> None:
    before, after, words = SCENARIOS[scenario]
    cache, logs = shared_history(shared_builds, (before, after))  # docs/why.md's too
    first, second = (logged_keys(log)[0] for log in logs)
    jax_says = differing(first, second)
    assert jax_says, f"{scenario}: JAX computed the same key: not a miss"
    code, doc = why(cache, "--module", MODULE)
    misses = doc["misses"]
    assert [m["verdict"] for m in misses] == ["first", "changed"], misses
    changed = misses[1]
    named = {c["component"] for c in changed["changes"]}
    assert named == jax_says, (scenario, named, jax_says)
    assert words in changed["words"], changed["words"]
    assert changed["nearest"] == misses[0]["key"] and changed["nearest_in_cache"]
    for said in changed["words"].split("; "):  # no two differing values read alike
        if " → " in said:
            before, after = said.rsplit("` ", 1)[-1].split(" → ")
            assert before.strip() != after.strip(), said
    assert code == 0


@pytest.mark.slow
def test_a_moved_line_is_a_hit_without_metadata_in_the_key(tmp_path: Path) -> None:
    """JAX strips locations from the key by default: a moved line misses nothing to explain."""
    cache = tmp_path / "cache"
    first = run(cache)[0]
    second = run(cache, WHY_MOVE="3")[0]
    assert first == second  # JAX: the same key
    code, doc = why(cache, "--module", MODULE)
    assert [m["verdict"] for m in doc["misses"]] == ["first"] and code == 0


@pytest.mark.slow
def test_the_recorded_digests_are_jaxs(shared_builds: SharedBuilds) -> None:
    """What the recorder keeps of a missed key is JAX's own per-component digests."""
    cache, (log,) = shared_history(shared_builds, ({},))
    logged = logged_keys(log)[0]
    (record,) = (cache / "cachedoctor-stats").glob("*.json")
    missed = json.loads(record.read_text())["missed"]
    (key,) = [k for k in missed if k.startswith(MODULE + "-")]
    recorded = {n: d for n, d in missed[key]["components"] if n in logged}
    assert recorded == logged


@pytest.mark.slow
def test_a_custom_partitioning_pointer_is_named(shared_builds: SharedBuilds) -> None:
    """The seed program: JAX's components differ only in the computation, and why says the
    pointer is all that changed."""
    cache, _ = shared_history(shared_builds, ({}, {}), program=_program("seed"))
    code, doc = why(cache, "--module", "jit_f")
    changed = doc["misses"][-1]
    assert [c["component"] for c in changed["changes"]] == ["computation"]
    assert "custom_partitioning pointer" in changed["words"], changed["words"]
    assert code == 0


@pytest.mark.slow
def test_a_replayed_key_names_the_partition_rule_that_changed(shared_builds: SharedBuilds) -> None:
    """Under the stable hook a module with custom_partitioning is keyed by replaying its
    partitioner calls: the second run hits (JAX's log), the third, whose partitioned
    computation adds 5, misses, and why says the calls no longer reproduce, with nothing else
    of the key changed."""
    runs: tuple[dict[str, str], ...] = ({}, {}, {"CACHEDOCTOR_SEED_ADD": "5"})
    cache, logs = shared_history(shared_builds, runs, hook="stable", program=_program("seed"))
    assert ["jit_f" in hits(log) for log in logs] == [False, True, False]
    code, doc = why(cache, "--module", "jit_f")
    assert [m["verdict"] for m in doc["misses"]] == ["first", "changed"], doc["misses"]
    changed = doc["misses"][1]
    assert [c["component"] for c in changed["changes"]] == ["custom_partitioning_replay"]
    assert "no longer reproduce (custom call 0" in changed["words"], changed["words"]
    assert changed["nearest"] == doc["misses"][0]["key"] and changed["nearest_in_cache"]
    assert code == 0


POINTER_FLAG = "jax_remove_custom_partitioning_ptr_from_cache_key"
_KEY_DIGEST = re.compile(
    r"^jax\._src\.cache_key get_cache_key hash after serializing custom_hook: ([0-9a-f]{64})",
    re.M,
)
_MISSED = re.compile(r"PERSISTENT COMPILATION CACHE MISS for '([^']+)' with key '([^']+)'")


def keys_by_digest(stderr: str) -> dict[str, dict[str, str]]:
    """JAX's DEBUG lines, each key's component digests by the key's own digest (JAX's running
    hash after its last component is the key's hex part)."""
    return dict(zip(_KEY_DIGEST.findall(stderr), logged_keys(stderr), strict=True))


@pytest.mark.slow
def test_turning_the_pointer_flag_on_is_named_not_a_changed_program(
    shared_builds: SharedBuilds,
) -> None:
    """The seed program (a custom_partitioning call) with JAX's pointer flag off, then on, on
    again, and off. JAX's own log is the oracle: the second run misses jit_f (its explain line),
    the third hits, the keys differ only in the computation, and the digest the recorder kept of
    the first run's program without its pointers is the one JAX hashed with the flag on. why
    names the flag, and says the program is otherwise the same: never "the program changed"."""
    on = {POINTER_FLAG.upper(): "true"}
    runs: tuple[dict[str, str], ...] = ({}, on, on, {})
    cache, logs = shared_history(shared_builds, runs, program=_program("seed"))
    missed = [dict(_MISSED.findall(log)).get("jit_f") for log in logs]
    assert missed[2] is None and "jit_f" in hits(logs[2])
    off_key, on_key = missed[0], missed[1]
    assert off_key and on_key and off_key != on_key
    first = keys_by_digest(logs[0])[off_key.rsplit("-", 1)[1]]
    second = keys_by_digest(logs[1])[on_key.rsplit("-", 1)[1]]
    assert differing(first, second) == {"computation"}
    (record,) = [
        doc
        for r in (cache / "cachedoctor-stats").glob("*.json")
        if off_key in (doc := json.loads(r.read_text()))["missed"]
    ]
    kept = dict(record["missed"][off_key]["components"])
    assert kept["computation, pointers removed by JAX"] == second["computation"]
    code, doc = why(cache, "--module", "jit_f")
    assert [m["verdict"] for m in doc["misses"]] == ["first", "changed", "changed"], doc["misses"]
    (change,) = doc["misses"][1]["changes"]
    assert change["component"] == "computation"
    assert change["words"].startswith(f"`{POINTER_FLAG}` False → True: JAX leaves"), change
    assert "the program is otherwise the same" in change["words"]
    assert "program changed" not in change["words"]
    # turned off again: the fourth run misses (a new pointer), against the flag-on key
    assert missed[3] and doc["misses"][2]["nearest"] == on_key
    (change,) = doc["misses"][2]["changes"]
    assert change["words"].startswith(f"`{POINTER_FLAG}` True → False: JAX hashes"), change
    assert change["words"].endswith("; the program is otherwise the same"), change
    assert code == 0


def _program(name: str) -> Path:
    from cachedoctor.programs import program_path

    return Path(program_path(name))


@pytest.mark.slow
def test_unrecorded_history_is_unknown_and_says_what_to_enable(tmp_path: Path) -> None:
    """An entry written by a process that recorded nothing: the later miss is "unknown", the
    exit status 1, and the words say what to turn on."""
    cache = tmp_path / "cache"
    run(cache, hook=None)
    run(cache, XLA_FLAGS="--xla_cpu_enable_fast_math=true")
    code, doc = why(cache, "--module", MODULE)
    (miss,) = doc["misses"]
    assert miss["verdict"] == "unknown" and "--stats-only" in miss["words"]
    assert code == 1


@pytest.mark.slow
def test_the_same_key_missing_again_was_removed(tmp_path: Path) -> None:
    """JAX wrote the key, the entry went, JAX missed the same key: said as such."""
    cache = tmp_path / "cache"
    first = run(cache)
    for entry in cache.glob(f"{MODULE}-*-cache"):
        entry.unlink()
    assert run(cache) == first  # JAX: the same key again
    code, doc = why(cache, "--module", MODULE)
    assert [m["verdict"] for m in doc["misses"]] == ["first", "same-key"]
    assert code == 0


@pytest.mark.slow
def test_text_output_and_no_records(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    run(cache, hook=None)
    code, out = why_text(cache)
    assert "no process recorded its lookups" in out and code == 0, out
    run(cache, XLA_FLAGS="--xla_cpu_enable_fast_math=true")
    code, out = why_text(cache)
    assert "unknown:" in out and code == 1, out


@pytest.mark.slow
def test_a_cache_written_by_another_jaxlib_names_both_versions(
    shared_builds: SharedBuilds,
) -> None:
    """jax 0.8.3 (the test setup's second JAX, recording too) wrote the cache; this JAX misses:
    why names the jaxlib versions, and JAX's components agree that it differs."""
    from tests.support.caches import other_jax_python
    from tests.support.hookrun import jax_version

    other = other_jax_python()
    cache, logs = shared_history(shared_builds, ({}, {}), first_python=other)
    theirs, ours = (logged_keys(log)[0] for log in logs)
    assert theirs["jax_lib version"] != ours["jax_lib version"]
    _, doc = why(cache, "--module", MODULE)
    changed = doc["misses"][-1]
    named = {c["component"] for c in changed["changes"]}
    assert named == differing(ours, theirs), named
    import jax

    said = f"jaxlib {jax_version(other)} → {jax.__version__}"
    assert changed["words"].startswith(said), changed["words"]
    # both on the 8 host devices why_program asks for: the counts are said, not left out
    (topology,) = [c for c in changed["changes"] if c["component"] == "accelerator_config"]
    assert topology["words"].endswith("on 8 cpu devices both times"), topology


@pytest.mark.slow
def test_stats_and_lint_give_the_causes_of_a_modules_misses(tmp_path: Path) -> None:
    """An XLA flag added, then the same run again (a hit): jit_step both missed and hit, so it
    is no never-hit module; stats (JSON, text, --html) and lint name what JAX's own component
    digests show changed, and stats puts the most compile time lost first."""
    cache = tmp_path / "cache"
    flag = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}
    first = run(cache)[0]
    second = run(cache, **flag)[0]
    run(cache, **flag)
    done = CliRunner().invoke(cli, ["stats", str(cache), "--json"])
    doc = json.loads(done.output)
    rows = {m["module"]: m for m in doc["modules"]}
    (cause,) = rows[MODULE]["miss_causes"]
    assert "+ --xla_cpu_enable_fast_math=true" in cause["words"], cause
    assert set(cause["components"]) == differing(first, second)
    lost = [m["compile_secs"] for m in doc["modules"]]
    assert lost == sorted(lost, reverse=True)
    text = CliRunner().invoke(cli, ["stats", str(cache)], terminal_width=400).output
    (line,) = [x for x in text.splitlines() if x.lstrip().startswith(MODULE + " ")]
    assert "XLA flags + --xla_cpu_enable_fast_math=true" in line, text
    page = tmp_path / "stats.html"
    CliRunner().invoke(cli, ["stats", str(cache), "--html", str(page)])
    assert "XLA flags + --xla_cpu_enable_fast_math=true" in page.read_text()
    lint = CliRunner().invoke(cli, ["lint", str(cache), "--format", "json"])
    missed = [f for f in json.loads(lint.output)["findings"] if f["kind"] == "missed"]
    assert [f["module"] for f in missed if f["module"] == MODULE] == [MODULE], missed
