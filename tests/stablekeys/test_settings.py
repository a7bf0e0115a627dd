"""The config file: each wrong value named with its line; `status` and a fresh interpreter agree.

JAX is the oracle for what a fresh interpreter runs with: its own config values, read back in
the process (``jax.config``), not what cachedoctor says it applied.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cachedoctor.stablekeys import settings
from tests.support.caches import SCRIPT, cli_env

# A JAX process that reports the settings in force and whether the hook and recording run.
_PROGRAM = r"""
import json, jax
from jax._src import config
from cachedoctor.stablekeys import _startup, hook, stats_record
names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
         "jax_compilation_cache_max_size")
print("IN-FORCE " + json.dumps({
    "jax": {n: config.config._value_holders[n].value for n in names},
    "hook": hook.installed_mode(), "stats": stats_record.recording() is not None,
    "errors": (_startup.STATE or {}).get("errors"),
}))
"""


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert SCRIPT, "the cachedoctor console script is not installed in this environment"
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120)


def in_force(env: dict[str, str]) -> tuple[dict[str, object], str]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROGRAM],
        capture_output=True,
        text=True,
        env={**env, "JAX_PLATFORMS": "cpu"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("IN-FORCE "))
    return json.loads(line.removeprefix("IN-FORCE ")), proc.stderr


def _env(config: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in cli_env().items() if not k.startswith(("JAX_", "CACHEDOCTOR_"))}
    return {**env, "CACHEDOCTOR_CONFIG": str(config), **extra}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "named"),
    [
        ('cache_dir = 5\nhook = ["x"]', ["line 2: cache_dir = 5", 'line 3: hook = ["x"]']),
        ('cache_dir = "/c"\nmax_size = "10GB"', ['line 3: max_size = "10GB"']),
        ('cache_dir = "/c"\nrecord_ir = "no"', ['line 3: record_ir = "no"']),
        ('cache_dir = "/c"\nmin_compile_time_secs = true', ["line 3: min_compile_time_secs"]),
        ('cache_dir = "/c"\nmin_entry_size_bytes = -4', ["line 3: min_entry_size_bytes = -4"]),
        ('cache_dir = "relative/cache"', ['line 2: cache_dir = "relative/cache"']),
        ('cache_dir = "/c"\nxla_caches = "most"', ['line 3: xla_caches = "most"']),
        ('cache_dir = "/c"\n"cache-dir" = "/d"', ["line 3: cache-dir", "not a setting"]),
    ],
)
def test_each_wrong_value_is_named_with_its_line(
    tmp_path: Path, body: str, named: list[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f"[cachedoctor]\n{body}\n")
    with pytest.raises(settings.ConfigError) as err:
        settings.load(config)
    for needle in named:
        assert needle in str(err.value), err.value

    status = run("status", env=_env(config))
    assert status.returncode == 2, status  # a broken config file, as for bad TOML
    (line,) = status.stderr.strip().splitlines()
    assert line.startswith(f"cachedoctor: config: config file {config}: "), line
    assert all(needle in line for needle in named), line


@pytest.mark.slow
def test_a_wrong_value_activates_nothing_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """Not half a config: a good cache_dir before a bad max_size is not applied either."""
    config = tmp_path / "config.toml"
    config.write_text(f'[cachedoctor]\ncache_dir = "{tmp_path}/c"\nmax_size = "10GB"\n')
    plain, _ = in_force(_env(tmp_path / "absent.toml"))
    got, stderr = in_force(_env(config))
    assert got["jax"] == plain["jax"]  # JAX's own defaults, every one
    assert got["hook"] is None and got["stats"] is False
    said = [x for x in stderr.splitlines() if "activation failed" in x]
    assert len(said) == 1 and 'line 3: max_size = "10GB"' in said[0], stderr


@pytest.mark.slow
def test_an_empty_config_file_shows_what_a_fresh_interpreter_does(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("")
    got, _ = in_force(_env(config))
    proc = run("status", env=_env(config))
    assert proc.returncode == 0, proc.stderr
    shown = next(x.split() for x in proc.stdout.splitlines() if x.strip().startswith("hook "))
    assert shown[1] == got["hook"] == "stable"
    assert "hook active: stable" in proc.stdout


@pytest.mark.slow
def test_an_unknown_hook_mode_activates_nothing_and_names_all_four(tmp_path: Path) -> None:
    env = _env(tmp_path / "absent.toml", CACHEDOCTOR_HOOK="bogus")
    got, stderr = in_force(env)
    assert got["hook"] is None and got["stats"] is False
    assert "CACHEDOCTOR_HOOK='bogus': expected stable, observe, stats or off" in stderr
    status = run("status", env=env)
    assert status.returncode == 1, status
    assert "stats recording: no" in status.stdout
    assert "expected stable, observe, stats or off" in status.stdout


@pytest.mark.slow
def test_status_exits_1_when_the_fresh_interpreter_cannot_import_jax(tmp_path: Path) -> None:
    env = _env(tmp_path / "absent.toml", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="abc")
    for args in (["status"], ["status", "--json"]):
        proc = run(*args, env=env)
        assert proc.returncode == 1, proc
    doc = json.loads(proc.stdout)
    assert any("cannot import jax" in p and "abc" in p for p in doc["problems"]), doc["problems"]


@pytest.mark.slow
def test_disable_cleans_up_after_a_wrong_typed_file(tmp_path: Path) -> None:
    config = tmp_path / "etc" / "config.toml"
    cache = tmp_path / "made" / "cache"
    env = _env(config)
    assert run("enable", "--dir", str(cache), env=env).returncode == 0
    config.write_text(config.read_text().replace('hook = "stable"', "hook = 3"))
    assert run("status", env=env).returncode == 2
    assert run("disable", env=env).returncode == 0
    assert not config.exists() and not (tmp_path / "made").exists()


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('[other]\nhook = "x"\n\n[cachedoctor]\nhook = "bogus"\n', 5),  # same key, other table
        ('title = "t"\ncachedoctor.hook = "bogus"\n', 2),  # a dotted key at the top
        ('[cachedoctor]\n"hook" = "bogus"\n', 2),  # a quoted key
        ("[ 'cachedoctor' ]\nhook = 'bogus'\n", 2),  # a quoted, spaced table name
    ],
)
def test_a_wrong_value_is_named_with_its_own_line(tmp_path: Path, text: str, line: int) -> None:
    """In process: the line is the one in [cachedoctor], never an earlier table's same key."""
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(settings.ConfigError, match=rf"[:;] line {line}: hook = \"bogus\": "):
        settings.load(path)


# --- every key read as written ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "named"),
    [
        # the file: keys at the top, before any table, reach nothing
        ('cache_dir = "/c"\nhook = "stats"\n', ['line 1: cache_dir = "/c": outside', "line 2"]),
        ('[cachedoctor]\ncache_dir = "/c"\n[tool.x]\na = 1\n', ["line 3: [tool]: outside"]),
        ('[cachedoctor]\ncache_dir = "/c"\n[[runs]]\nn = 1\n', ["line 3: [[runs]]: outside"]),
        ('[cachedoctor]\ncache_dir = "~/jaxcache"\n', ["line 2: cache_dir", "does not expand ~"]),
        ('[cachedoctor]\ncache_dir = "/c"\nmax_size = 0\n', ["line 3: max_size = 0", "stores"]),
        ('[cachedoctor]\ncache_dir = "/c"\nmax_size = -2\n', ["line 3: max_size = -2"]),
        ('[cachedoctor]\ncache_dir = "jaxcache"\n', ["line 2: cache_dir", "a relative path"]),
        # a key = inside a string or an array is not a key; a header in a string is not one
        (
            'note = """\nhook = 1\n[cachedoctor]\n"""\n[cachedoctor]\nmax_size = 0\n',
            ['line 1: note = "hook = 1\\n[cachedoctor]\\n": outside', "line 6: max_size = 0"],
        ),
        (
            "[cachedoctor]\nxs = [\n  'max_size = 0', # hook = 2\n  [1, 2],\n]\nmax_size = 0\n",
            ["line 2: xs = ", "line 6: max_size = 0"],
        ),
        ("[cachedoctor]\ns = '''it''s'''\n'max_size' = 0\n", ["line 2: s = ", "line 3: max_size"]),
        ('[cachedoctor]\nt = {a = "}", b = [1]}\nmax_size = 0\n', ["line 2: t = ", "line 3: max"]),
    ],
)
def test_every_key_is_used_or_named_with_its_line(
    tmp_path: Path, text: str, named: list[str]
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(settings.ConfigError) as err:
        settings.load(path)
    message = str(err.value)
    assert "\n" not in message, message
    for needle in named:
        assert needle in message, message


def test_the_lines_are_checked_against_what_tomllib_parsed() -> None:
    """Where the scan of the text and the parser disagree, no line rather than a wrong one."""
    import tomllib

    text = '[cachedoctor]\nhook = "x"\n'
    assert settings.key_lines(text, tomllib.loads(text)) == {
        ("cachedoctor",): 1,
        ("cachedoctor", "hook"): 2,
    }
    assert settings.key_lines(text, {"cachedoctor": {"other": 1}}) == {}


def test_a_good_file_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        "# written by hand\n[cachedoctor]  # the one table\n"
        'cache_dir = "/data/jax"\nmax_size = -1\nmin_compile_time_secs = 0.5\n'
        "xla_caches = 'none'\nhook = \"stats\"\nrecord_ir = true\n"
    )
    assert settings.load(path) == {
        "cache_dir": "/data/jax",
        "max_size": -1,
        "min_compile_time_secs": 0.5,
        "xla_caches": "none",
        "hook": "stats",
        "record_ir": True,
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "body",
    [
        'cache_dir = "/c"\n',  # before the table: nothing reads it
        '[cachedoctor]\ncache_dir = "~/jaxcache"\n',
        '[cachedoctor]\ncache_dir = "/c"\nmax_size = 0\n',
    ],
    ids=["outside", "tilde", "max-size-0"],
)
def test_status_refuses_and_the_hook_falls_back_to_jax(tmp_path: Path, body: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(body)
    status = run("status", env=_env(config))
    assert status.returncode == 2, status
    (line,) = status.stderr.strip().splitlines()
    assert line.startswith(f"cachedoctor: config: config file {config}: line "), line
    plain, _ = in_force(_env(tmp_path / "absent.toml"))
    got, stderr = in_force(_env(config))
    assert got["jax"] == plain["jax"] and got["hook"] is None, got
    said = [x for x in stderr.splitlines() if "cachedoctor" in x]
    assert len(said) == 1 and "activation failed" in said[0], stderr


@pytest.mark.slow
def test_jax_writes_a_folder_named_tilde_and_stores_nothing_at_max_size_0(tmp_path: Path) -> None:
    """The oracle for two refusals: what JAX itself does with these values."""
    program = (
        "import jax, jax.numpy as jnp; jax.jit(lambda x: x * 2 + 1)(jnp.arange(4.0))"
        ".block_until_ready()"
    )
    home, work, absolute = tmp_path / "home", tmp_path / "work", tmp_path / "absolute"
    for folder in (home, work):
        folder.mkdir()
    env = {
        **_env(tmp_path / "absent.toml"),
        "HOME": str(home),
        "JAX_PLATFORMS": "cpu",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    for extra in (
        {"JAX_COMPILATION_CACHE_DIR": "~/jaxcache"},
        {"JAX_COMPILATION_CACHE_DIR": str(absolute), "JAX_COMPILATION_CACHE_MAX_SIZE": "0"},
    ):
        proc = subprocess.run(
            [sys.executable, "-c", program],
            env={**env, **extra},
            cwd=work,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
    assert list((work / "~" / "jaxcache").glob("*-cache")), sorted(work.rglob("*"))
    assert not (home / "jaxcache").exists()
    assert not list(absolute.glob("*-cache")) if absolute.exists() else True


@pytest.mark.slow
def test_asking_whether_jax_is_installed_does_not_disarm_activation(tmp_path: Path) -> None:
    """A program (or a library probing what is installed, as cachedoctor's own scan does) calls
    ``importlib.util.find_spec("jax")`` before ``import jax``: the hook still activates."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.util; importlib.util.find_spec('jax'); " + _PROGRAM.strip(),
        ],
        capture_output=True,
        text=True,
        env={**_env(tmp_path / "none.toml", CACHEDOCTOR_HOOK="stats"), "JAX_PLATFORMS": "cpu"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("IN-FORCE "))
    assert json.loads(line.removeprefix("IN-FORCE "))["stats"] is True


_WARM = r"""
import json, sys, jax, jax.numpy as jnp
from cachedoctor.stablekeys import hook
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.jit(lambda v: jnp.sin(v) * 2)(jnp.arange(4.0)).block_until_ready()
print("HOOK", hook.installed_mode(), hook.stats()["keys"])
print("IMPORTED " + json.dumps(sorted(m for m in sys.modules if m.startswith("cachedoctor."))))
"""


@pytest.mark.slow
def test_a_hooked_start_on_a_local_cache_imports_only_what_a_lookup_needs(tmp_path: Path) -> None:
    """A warm start with the hook pays for each module it imports (docs/performance.md,
    Performance IV): on a local cache dir in a single process, the bucket registry is never
    imported, and the module that compares a job's processes (a miss's manifest names the
    process) not on a warm start; nor, on a warm start, the manifests' module (the index lists
    a local cache without it: a warm start writes no manifest) or the file identities a prune
    plan checks (``storage.fileid``)."""
    env = {
        **_env(tmp_path / "none.toml", CACHEDOCTOR_HOOK="stable"),
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"),
    }
    seen = {}
    for start in ("cold", "warm"):
        proc = subprocess.run(
            [sys.executable, "-c", _WARM], capture_output=True, text=True, env=env, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        assert "HOOK stable 2" in proc.stdout, proc.stdout + proc.stderr  # two lookups each
        line = next(x for x in proc.stdout.splitlines() if x.startswith("IMPORTED "))
        seen[start] = set(json.loads(line.removeprefix("IMPORTED ")))
    assert "cachedoctor.stablekeys.processes" in seen["cold"]  # the misses' manifests
    assert "cachedoctor.stablekeys.manifest" in seen["cold"]  # ... written
    assert "cachedoctor.stablekeys.keys" in seen["warm"]  # the hook made the keys
    assert "cachedoctor.stablekeys.manifest_index" in seen["warm"]  # and asked the index
    unneeded = {
        "cachedoctor.storage.backends",
        "cachedoctor.stablekeys.processes",
        "cachedoctor.stablekeys.manifest",
        "cachedoctor.storage.fileid",
    }
    assert unneeded.isdisjoint(seen["warm"])
    assert "cachedoctor.storage.backends" not in seen["cold"]


@pytest.mark.slow
def test_an_activated_environment_s_python_starts_without_typing(tmp_path: Path) -> None:
    """The ``.pth`` line runs in every Python process of an activated environment (pip, a
    script, a tool): until ``jax`` is imported it adds only the start-up module and its
    packages, not ``typing``, ``re``, ``enum``, ``contextlib``... (~10 ms a process)."""
    code = "import sys; print(' '.join(sorted(sys.modules)))"

    def started(**extra: str) -> set[str]:
        env = {**_env(tmp_path / "none.toml"), **extra}
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        return set(proc.stdout.split())

    plain, activated = started(), started(CACHEDOCTOR_HOOK="stable")
    assert "cachedoctor.stablekeys._startup" in activated  # the watcher waits for jax
    assert activated - plain <= {
        "__future__",
        "cachedoctor",
        "cachedoctor._version",
        "cachedoctor.stablekeys",
        "cachedoctor.stablekeys._startup",
    }
