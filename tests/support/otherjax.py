"""The second JAX of the cross-version tests, installed by the test setup itself.

A cache written by an older JAX next to one of the installed JAX is what the "different JAX
versions" diff verdict, the mixed-versions finding, ``prune --stale-jax``, the hook under an
older JAX and the prune matrix's second population are tested on. Those tests used to skip on a
fresh machine unless ``nox -s crossver`` had built that JAX; now the suite builds it: a venv
with jax/jaxlib :data:`OTHER_JAX`, pytest, and this checkout installed editable (so it never
goes stale), kept in ``.test-venvs/`` of the checkout (``CACHEDOCTOR_TEST_VENVS`` elsewhere) and
reused while the stamp (the release, the interpreter, the checkout's dependencies) is the same.

The pytest controller starts the build in the background as the session begins
(:func:`start`), so the download overlaps the tests that need no second JAX; a test that needs
it waits for it (:func:`wait`). The build runs under a file lock, so two workers or two
sessions build it once. ``CACHEDOCTOR_OTHER_JAX_PYTHON`` set by hand (or by ``nox -s
crossver``) wins; ``CACHEDOCTOR_OTHER_JAX=0`` turns the build off, and the tests then skip
saying so. A build that fails (no network) makes them skip with pip's last line.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import filelock

OTHER_JAX = "0.8.3"  # writes the pre-0.9.1 layout (no pjrt_ifrt header): the oldest that differs
OTHER_JAX_ENV = "CACHEDOCTOR_OTHER_JAX_PYTHON"
COMPAT_ENV = "CACHEDOCTOR_COMPAT_PYTHONS"
OFF_ENV = "CACHEDOCTOR_OTHER_JAX"  # "0": do not build it
VENVS_ENV = "CACHEDOCTOR_TEST_VENVS"
REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1200


def venv_dir() -> Path:
    root = Path(os.environ.get(VENVS_ENV) or REPO / ".test-venvs")
    return root.resolve() / f"jax-{OTHER_JAX}-py{sys.version_info[0]}.{sys.version_info[1]}"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project


def pinned_test_deps() -> list[str]:
    """The test extra's pins of JAX's own dependencies (ml_dtypes: the cost of each JAX process,
    pyproject.toml), which the second JAX's venv takes too."""
    extra = _project().get("optional-dependencies", {}).get("test-core", [])
    return [r for r in extra if r.replace("-", "_").startswith("ml_dtypes")]


def stamp() -> str:
    """What the venv was built from: a change rebuilds it (a new dependency of the checkout)."""
    deps = [*_project().get("dependencies", []), *pinned_test_deps()]
    parts = [OTHER_JAX, sys.version, json.dumps(deps)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _state(venv: Path) -> tuple[str, str]:
    """("ready", "") / ("failed", why) / ("missing", "") for this stamp."""
    for name in ("ready", "failed"):
        marker = venv.parent / f"{venv.name}.{name}"
        try:
            text = marker.read_text()
        except OSError:
            continue
        first, _, rest = text.partition("\n")
        if first == stamp():
            return name, rest.strip()
    return "missing", ""


def _uv() -> str | None:
    """uv's binary when the test extra brought it (a cold install of this venv: 22 s against
    pip's 88 s, docs/development.md), else None."""
    try:
        import uv
    except ImportError:
        return None
    try:
        return str(uv.find_uv_bin())
    except FileNotFoundError:
        return None


def _install_steps(venv: Path) -> list[list[list[str]]]:
    """Ways to build the venv, tried in turn: with uv when it is installed (it reads no pip
    configuration, so pip is the way left when uv cannot reach an index pip can), then pip."""
    wants = ["-e", str(REPO), f"jax=={OTHER_JAX}", f"jaxlib=={OTHER_JAX}", "pytest"]
    wants += pinned_test_deps()
    python = str(python_of(venv))
    ways = []
    uv = _uv()
    if uv:
        ways.append(
            [
                [uv, "venv", "-q", "--clear", "--python", sys.executable, str(venv)],
                [uv, "pip", "install", "-q", "--compile-bytecode", "--python", python, *wants],
            ]
        )
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *wants]
    ways.append([[sys.executable, "-m", "venv", "--clear", str(venv)], pip])
    return ways


def _run_steps(steps: list[list[str]]) -> str:
    """Run each step; why the first that failed did, or ''."""
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
            return f"`{' '.join(argv[:4])} ...` exited {done.returncode}: {lines[-1]}"
    return ""


def build(venv: Path) -> tuple[str, str]:
    """Build the venv unless it is ready (under the lock); returns :func:`_state` after."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(venv.parent / f"{venv.name}.lock"), timeout=BUILD_TIMEOUT_S):
        state = _state(venv)
        if state[0] != "missing":
            return state
        for name in ("ready", "failed"):
            (venv.parent / f"{venv.name}.{name}").unlink(missing_ok=True)
        why = ""
        for steps in _install_steps(venv):
            if why:  # the log says why the next way is tried
                print(f"{why}; trying pip", flush=True)
            why = _run_steps(steps)
            if not why:
                break
        if why:
            (venv.parent / f"{venv.name}.failed").write_text(f"{stamp()}\n{why}\n")
            return "failed", why
        (venv.parent / f"{venv.name}.ready").write_text(f"{stamp()}\n")
        return "ready", ""


def start(background: bool = True) -> None:
    """In the pytest controller: name the second JAX's interpreter for every worker, and start
    building it in the background (unless it is ready, set by hand, or ``background`` is False:
    the fast loop, whose tests start no process, would only pay for it)."""
    if os.environ.get(OTHER_JAX_ENV) or os.environ.get(OFF_ENV) == "0":
        return
    venv = venv_dir()
    python = str(python_of(venv))
    os.environ[OTHER_JAX_ENV] = python
    os.environ.setdefault(COMPAT_ENV, python)
    if background and _state(venv)[0] == "missing":
        log = venv.parent / f"{venv.name}.log"
        venv.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            subprocess.Popen(
                [sys.executable, "-m", "tests.support.otherjax", str(venv)],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


def managed(python: str) -> bool:
    """Whether ``python`` is the interpreter this module builds (a test must :func:`wait`)."""
    return os.path.abspath(python) == str(python_of(venv_dir()))


def wait(python: str) -> str | None:
    """Block until the managed venv is built; the reason it could not be, or None."""
    if not managed(python):
        return None
    state, why = build(venv_dir())
    return None if state == "ready" else f"the test setup could not install jax {OTHER_JAX}: {why}"


if __name__ == "__main__":
    build(Path(sys.argv[1]))
