"""A pytest plugin that records what each test cost (issue 55): ``benchmarks/loop.py --by-module``.

Loaded by name through ``PYTEST_PLUGINS=testcost`` with this folder on ``PYTHONPATH`` (so it
reaches pytest under nox and ``.ci/run`` too), it writes one JSON file per test-running process
(each xdist worker, or the only process) into ``$CACHEDOCTOR_TESTCOST_DIR``: per test, the wall
time, the process's own CPU and the CPU of the children it waited for (``getrusage`` deltas
around setup, call and teardown; an xdist worker is a process of its own, so they are that
worker's), and the processes it started (``subprocess``, a fork, ``multiprocessing``'s
spawn). A session fixture counts in the test that set it up first and in the one whose
teardown ends it; a child reaped by a later test counts there.

The process that runs tests takes the plugin's variables out of its environment: a test that
starts pytest itself must not record into the same folder.
"""

from __future__ import annotations

import json
import multiprocessing.util
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DIR_ENV = "CACHEDOCTOR_TESTCOST_DIR"
HERE = str(Path(__file__).resolve().parent)

_folder_key = pytest.StashKey[str | None]()
_records: list[dict[str, Any]] = []
_started = [0]  # processes started by this process so far
_in_popen = [False]  # a Popen with preexec_fn forks through os.fork's hooks: count it once


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _forget_plugin_env() -> None:
    """Leave the tests' own processes the environment they would have had without the plugin."""
    os.environ.pop(DIR_ENV, None)
    plugins = [p for p in os.environ.pop("PYTEST_PLUGINS", "").split(",") if p and p != "testcost"]
    if plugins:
        os.environ["PYTEST_PLUGINS"] = ",".join(plugins)
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != HERE]
    if path:
        os.environ["PYTHONPATH"] = os.pathsep.join(path)
    else:
        os.environ.pop("PYTHONPATH", None)


def _runs_tests(config: pytest.Config) -> bool:
    """False only for an xdist controller, whose workers start later with its environment."""
    return hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


def pytest_configure(config: pytest.Config) -> None:
    folder = os.environ.get(DIR_ENV)
    config.stash[_folder_key] = folder
    if folder and _runs_tests(config):
        _forget_plugin_env()
        real = subprocess.Popen._execute_child  # type: ignore[attr-defined]

        def counted(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> Any:
            _started[0] += 1
            _in_popen[0] = True
            try:
                return real(self, *args, **kwargs)
            finally:
                _in_popen[0] = False

        subprocess.Popen._execute_child = counted  # type: ignore[attr-defined]
        os.register_at_fork(after_in_parent=_forked)
        spawn = multiprocessing.util.spawnv_passfds  # type: ignore[attr-defined]

        def spawned(*args: Any, **kwargs: Any) -> Any:
            _started[0] += 1
            return spawn(*args, **kwargs)

        multiprocessing.util.spawnv_passfds = spawned  # type: ignore[attr-defined]


def _forked() -> None:
    if not _in_popen[0]:
        _started[0] += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    wall, own = time.monotonic(), _cpu(resource.RUSAGE_SELF)
    children, started = _cpu(resource.RUSAGE_CHILDREN), _started[0]
    yield
    _records.append(
        {
            "nodeid": item.nodeid,
            "wall_s": round(time.monotonic() - wall, 4),
            "own_cpu_s": round(_cpu(resource.RUSAGE_SELF) - own, 4),
            "children_cpu_s": round(_cpu(resource.RUSAGE_CHILDREN) - children, 4),
            "processes": _started[0] - started,
        }
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_folder_key, None)
    if not folder or not _runs_tests(config):
        return
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    document = {
        "process": f"{socket.gethostname()}-{os.getpid()}",
        "worker": worker,
        "python": sys.prefix,
        "own_cpu_s": round(_cpu(resource.RUSAGE_SELF), 3),
        "children_cpu_s": round(_cpu(resource.RUSAGE_CHILDREN), 3),
        "tests": _records,
    }
    path = Path(folder) / f"{document['process']}.json"
    path.write_text(json.dumps(document) + "\n")
