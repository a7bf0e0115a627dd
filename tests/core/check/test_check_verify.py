"""``check --verify`` compares programs, not bytes, and completes on CPU (issue 29, item 5).

The verify run reads the cache without trusting it: every module compiles afresh under the key a
cached run looks up, and the program each cached entry holds is compared with the fresh one.
JAX's own content check (jax_compilation_cache_check_contents) is the oracle for "recompiles to
other bytes": it raises where ours must carry on.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cachedoctor.core.check.check import run_check
from cachedoctor.core.check.report import Outcome
from cachedoctor.core.check.runner import check_env, run_command
from cachedoctor.programs import program_path
from tests.support.caches import cli_env

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess

ENV = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
STRIP = {"JAX_REMOVE_CUSTOM_PARTITIONING_PTR_FROM_CACHE_KEY": "1"}
SEED = [sys.executable, str(program_path("seed"))]


def cachedoctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cachedoctor", *args],
        capture_output=True, text=True, env=env or cli_env(), check=False, timeout=600,
    )  # fmt: skip


def test_verify_completes_where_jax_content_check_stops(tmp_path: Path) -> None:
    """The seed program's sharded modules recompile to other bytes on CPU: JAX's check raises
    CacheVerificationError on them; --verify compares programs and checks every module."""
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {**ENV, **STRIP}
    assert run_command(SEED, check_env(env, str(cache), observe=False)).returncode == 0
    jax_check = run_command(
        SEED,
        {**check_env(env, str(cache), observe=False), "JAX_COMPILATION_CACHE_CHECK_CONTENTS": "1"},
    )
    if "CacheVerificationError" not in jax_check.stderr:
        pytest.skip("this JAX/XLA recompiles the seed program to the same bytes")
    report = run_check(SEED, cache_dir=str(cache), verify=True, base_env=env)
    verify = report.verify
    assert verify is not None and verify.complete and verify.not_checked == ()
    assert verify.stale == ()
    outcomes = {c.module: c.outcome for c in verify.checks}
    assert outcomes == dict.fromkeys(("jit__multi_slice", "jit_f", "jit_iota"), Outcome.SAME)
    assert any(c.same_bytes is False for c in verify.checks)  # what stopped JAX's check
    assert not report.failed


def test_verify_finds_the_stale_entry_jax_pointer_flag_serves(tmp_path: Path) -> None:
    """Pointer out of the key, partitioned code changed: the cached run prints the old answer."""
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {**ENV, **STRIP}
    assert run_command(SEED, check_env(env, str(cache), observe=False)).returncode == 0  # x + 1
    changed = {**env, "CACHEDOCTOR_SEED_ADD": "5"}  # now x + 5, the same stripped key
    stale_run = run_command(SEED, check_env(changed, str(cache), observe=False))
    assert "result: [1.0, 2.0" in stale_run.stdout  # JAX loaded the old executable
    report = run_check(SEED, runs=1, cache_dir=str(cache), verify=True, base_env=changed)
    verify = report.verify
    assert verify is not None and verify.complete
    assert [(c.module, c.outcome) for c in verify.stale] == [("jit_f", Outcome.STALE)]
    (stale,) = verify.stale
    assert stale.key in stale.entries and stale.cached_program != stale.fresh_program
    assert report.failed


# jit_second is compiled only while no marker file exists: by run 1 alone
FIRST_RUN_ONLY = """
import os, sys
import jax, jax.numpy as jnp
print("first:", jax.jit(lambda x: x + 1.0)(jnp.ones(4)).sum())
if not os.path.exists(sys.argv[1]):
    def second(x):
        return x * 2.0
    print("second:", jax.jit(second)(jnp.ones(4)).sum())
    open(sys.argv[1], "w").close()
"""


def test_a_module_the_verify_run_never_reached_is_not_checked_never_stale(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(FIRST_RUN_ONLY)
    argv = [sys.executable, str(script), str(tmp_path / "marker")]
    proc = cachedoctor("check", "--verify", "--quiet", "--format", "json", "--", *argv)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # `check --help`: NOT CHECKED is 2
    verify = json.loads(proc.stdout)["verify"]
    assert verify["not_checked"] == ["jit_second"] and verify["stale"] == []
    assert "jit_second" not in {c["module"] for c in verify["checks"]}
    assert {c["module"]: c["outcome"] for c in verify["checks"]}["jit__lambda"] == "same-program"


# one module name, three programs (one per shape); the f32[4] one closes over an unseeded
# constant, so only it changes between runs (numpyro's jit_scan)
THREE_PROGRAMS = """
import numpy as np
import jax, jax.numpy as jnp
c = np.random.rand(4).astype(np.float32)
@jax.jit
def scan(x):
    return x * c + 1.0 if x.shape[0] == 4 else x + 1.0
for n in (2, 4, 3):
    print("result:", float(scan(jnp.ones(n, jnp.float32)).sum()))
"""


def test_entries_line_pairs_the_changed_program_the_same_in_text_and_json(tmp_path: Path) -> None:
    script = tmp_path / "three.py"
    script.write_text(THREE_PROGRAMS)
    argv = [sys.executable, str(script)]
    common = ["check", "--quiet", "--verify"]  # each in a fresh temporary cache
    text = cachedoctor(*common, "--", *argv, env=cli_env() | {"COLUMNS": "1000"})  # unwrapped
    assert text.returncode == 1, text.stdout + text.stderr
    doc_proc = cachedoctor(*common, "--format", "json", "--", *argv)
    doc = json.loads(doc_proc.stdout)
    (scan,) = [m for m in doc["unstable"] if m["module"] == "jit_scan"]
    (entries,) = [line for line in scan["explanation"] if line.startswith("entries: ")]
    old, new = scan["pair"]
    # the pair the verdict rests on takes f32[4] both sides: run 1's and run 2's
    assert "(f32[4]" in scan["pairing"] and old in entries and new in entries
    assert "different programs" in entries
    text_lines = [line.strip() for line in text.stdout.splitlines()]
    (text_entries,) = [line for line in text_lines if line.startswith("entries: jit_scan")]
    assert text.stdout.count("PROGRAM CHANGES jit_scan") == 1
    keys = re.compile(r"jit_scan-[0-9a-f]{64}")  # they differ between the two checks
    assert keys.sub("KEY", text_entries) == keys.sub("KEY", entries)
    # --verify: each shape's key is looked up; the changing one is not in the cache, never stale
    assert doc["verify"]["stale"] == [] and doc["verify"]["not_checked"] == []
