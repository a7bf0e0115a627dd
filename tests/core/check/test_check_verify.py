"""``check --verify`` after JAX stops the verified run at its first mismatch (issue 17, item 4).

JAX's content check raises at the first cached executable that differs from a fresh compile;
the modules after it are never reached. They are "not checked": neither hits nor misses.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cachedoctor.core.check.check import jax_has_verify_option, run_check
from cachedoctor.core.check.runner import check_env, run_command

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess

# jit_first runs before jit_second; both take and return one f32[4]
TWO_MODULES = """
import jax, jax.numpy as jnp
def jit_first(x):
    return x + 1.0
def jit_second(x):
    return x * 2.0
print("result:", jax.jit(jit_first)(jnp.ones(4)).sum(), jax.jit(jit_second)(jnp.ones(4)).sum())
"""


@pytest.mark.skipif(
    not jax_has_verify_option(), reason="installed JAX lacks jax_compilation_cache_check_contents"
)
def test_modules_an_aborted_verify_run_never_reached_are_not_checked(tmp_path: Path) -> None:
    script = tmp_path / "two.py"
    script.write_text(TWO_MODULES)
    cache = tmp_path / "cache"
    cache.mkdir()
    argv = [sys.executable, str(script)]
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    first_run = check_env(env, str(cache), observe=False, verify=False)
    assert run_command(argv, first_run).returncode == 0
    (first,) = cache.glob("jit_jit_first-*-cache")
    (second,) = cache.glob("jit_jit_second-*-cache")
    first.write_bytes(second.read_bytes())  # jit_first's key now serves another executable
    report = run_check(argv, cache_dir=str(cache), verify=True, base_env=env)
    verify = report.verify
    assert verify is not None and not verify.complete
    assert [m.module for m in verify.mismatches] == ["jit_jit_first"]
    # the run stopped before jit_second; what hit before the stop left no trace either
    assert "jit_jit_second" in verify.not_checked and "jit_jit_first" not in verify.not_checked
    assert verify.hit_modules == ()
    assert report.failed
    line = report.summary_line()
    assert "hit in runs 2..2" not in line and "modules were not checked" in line


# a closed-over constant from an unseeded generator: each run traces another program
UNSEEDED_CONSTANT = """
import numpy as np
import jax, jax.numpy as jnp
c = np.random.rand(4).astype(np.float32)
@jax.jit
def f(x):
    return x * c + 1.0
print("result:", float(f(jnp.ones(4, jnp.float32)).sum()))
"""


@pytest.mark.skipif(
    not jax_has_verify_option(), reason="installed JAX lacks jax_compilation_cache_check_contents"
)
def test_unseeded_constant_is_a_changing_program_not_a_stale_entry(tmp_path: Path) -> None:
    """JAX misses jit_f in every run, rightly: its program differs. No entry is stale."""
    script = tmp_path / "unseeded.py"
    script.write_text(UNSEEDED_CONSTANT)
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    report = run_check([sys.executable, str(script)], verify=True, base_env=env)
    verify = report.verify
    assert verify is not None and verify.complete
    assert verify.mismatches == () and verify.stale == ()  # JAX's content check agrees
    (changing,) = report.unstable
    assert changing.module == "jit_f" and changing.recompiled_in == (2,)
    assert "the traced program changes between runs" in changing.entry_verdict
    assert changing.stable_would_hit is False
    assert "STALE" not in "\n".join(changing.explanation_lines())
    assert changing.program_changes  # said as such, not as an unstable key
    line = report.summary_line()
    assert "stale" not in line and "unstable cache key" not in line
    assert "the program itself changes between runs" in line
