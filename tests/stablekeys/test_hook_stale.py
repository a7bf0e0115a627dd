"""The stale-hit suite: a value reaches a custom_partitioning callback by many Python routes.

Each case runs fresh processes with the value A twice, then B, B and A, in one cache: every run
must print its own value (no stale hit), and every run whose value was seen before must hit.
The routes are in ``stale_cases.py``; one process runs every case (one process per case
batch cost each route's run another JAX start-up: 15 JAX processes a cache, in each release's
compat session). The cache is a local directory, or a prefix in a bucket on the local S3 or
GCS server (``remote``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.buckets import Servers
from tests.support.caches import SUPPORT_DIR
from tests.support.hookrun import base_env, run_program

pytestmark = pytest.mark.slow

PROGRAM = SUPPORT_DIR / "stale_cases.py"
SEQUENCE = ("1", "1", "5", "5", "1")  # A, A, B, B, A
CASES = (
    "env,file,np_random_seed,sys_argv,config_flag,pytree_registry,typed_prng_key,"
    "ml_dtypes_array,structured_array,jit_wrapped,"
    "function_attribute,enum_member,wraps_wrapper,dataclass,slots,defaultdict_factory,"
    "metaclass,lru_cache,globals_alias,getframe"
)


def _outputs(stdout: str) -> dict[str, float]:
    found = {}
    for line in stdout.splitlines():
        if line.startswith("case "):
            _, name, value = line.split()
            found[name] = float(value)
    return found


WHERE = [
    "local",
    pytest.param("s3", marks=pytest.mark.remote),
    pytest.param("gs", marks=pytest.mark.remote),
]


def _cache(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[Path | str, dict[str, str]]:
    """A fresh cache: a local folder, or a prefix of its own in a bucket (and the servers' env)."""
    if where == "local":
        return tmp_path / "cache", {}
    servers: Servers = request.getfixturevalue("servers")
    return servers.url(where, f"stale/{tmp_path.name}/cache"), servers.env


@pytest.mark.parametrize("where", WHERE)
def test_no_stale_hit_and_hits_on_rerun(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    cases = CASES.split(",")
    cache, server_env = _cache(where, tmp_path, request)
    seen: set[str] = set()
    for i, value in enumerate(SEQUENCE):
        env = base_env(
            cache,
            CACHEDOCTOR_STALE_V=value,
            CACHEDOCTOR_STALE_FILE=str(tmp_path / "value.txt"),
            CACHEDOCTOR_STALE_CASES=CASES,
            **server_env,
        )
        run = run_program(PROGRAM, cache, env=env)
        outputs = _outputs(run.stdout)
        assert sorted(outputs) == sorted(cases), run.stdout
        stale = {c: v for c, v in outputs.items() if v != float(value)}
        assert not stale, f"run {i + 1} (v={value}): stale results {stale}"
        missed = {m.removeprefix("jit_case_") for m in run.misses if m.startswith("jit_case_")}
        if value in seen:
            assert not missed, f"run {i + 1} (v={value}) missed {sorted(missed)}: {run.stats}"
        else:
            assert missed == set(cases), f"run {i + 1} (v={value}) hit {set(cases) - missed}"
        seen.add(value)


def test_nondeterministic_callback_misses_unless_declared(tmp_path: Path) -> None:
    """A module that differs on every partition call never reproduces; ``depends_on`` hits."""
    cache = tmp_path / "cache"
    env = base_env(
        cache,
        CACHEDOCTOR_STALE_V="1",
        CACHEDOCTOR_STALE_FILE=str(tmp_path / "value.txt"),
        CACHEDOCTOR_STALE_CASES="noisy,noisy_declared",
    )
    runs = [run_program(PROGRAM, cache, env=env) for _ in range(3)]
    for run in runs:
        assert _outputs(run.stdout) == {"noisy": 1.0, "noisy_declared": 1.0}
        assert "jit_case_noisy" in run.misses
    assert "jit_case_noisy_declared" in runs[0].misses
    assert all("jit_case_noisy_declared" not in run.misses for run in runs[1:])
    assert runs[1].stats["replay_misses"] == 1 and "returned something else" in str(
        runs[1].stats["last_replay_miss"]
    )


def test_jax_pointer_flag_under_warnings_as_errors_never_gives_a_stale_hit(tmp_path: Path) -> None:
    """The hook overrides JAX's pointer flag and says so on stderr, not as a Python warning:
    under ``-W error`` a warning became an exception, the hook stepped aside, and JAX's flag
    returned the first run's executable for a changed partition rule (seen: 1.0 for 2.0)."""
    cache = tmp_path / "cache"
    firsts, said = [], []
    for add in ("1.0", "2.0"):
        env = base_env(
            cache,
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            XLA_FLAGS="--xla_force_host_platform_device_count=8",
            JAX_REMOVE_CUSTOM_PARTITIONING_PTR_FROM_CACHE_KEY="1",
            PYTHONWARNINGS="error",
            CACHEDOCTOR_SEED_ADD=add,
        )
        run = run_program("seed", cache, mode="stable", env=env)
        firsts.append(float(run.result.split("[")[1].split(",")[0]))
        said.append([ln for ln in run.stderr.splitlines() if "ptr_from_cache_key is set" in ln])
    assert firsts == [1.0, 2.0]  # each run its own rule's result
    assert all(len(lines) == 1 and lines[0].startswith("cachedoctor: ") for lines in said)
