"""Run commands in fresh subprocesses against a given cache directory.

Shared by ``demo``, ``check`` and the tests: each run is a new interpreter, as a real job's
restart would be, so nothing is cached in memory between runs. ``check``'s runs of the user's
command are teed to its log as they arrive, watching for JAX's own words about the cache
(a module it refuses to store).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from cachedoctor.cache import listdir
from cachedoctor.core.check.report import CommandFailedError
from cachedoctor.errors import path_error
from cachedoctor.programs import program_path
from cachedoctor.stablekeys.settings import HOOK_ENV  # the hook's activation variable
from cachedoctor.stablekeys.verify_run import VERIFY_FRESH_ENV


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def program_env(cache_dir: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a program run: this cache dir, 8 CPU devices, cache every compile."""
    env = dict(os.environ)
    env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    flags = env.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        env["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def run_command(argv: Sequence[str], env: Mapping[str, str], timeout: float | None = 600) -> Run:
    start = time.monotonic()
    proc = subprocess.run(
        list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )
    return Run(tuple(argv), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def run_program(
    name: str,
    cache_dir: str,
    extra_env: Mapping[str, str] | None = None,
    python: str | None = None,
) -> Run:
    """Run a bundled program (``seed``, ``plain``) once in a fresh interpreter."""
    argv = [python or sys.executable, str(program_path(name))]
    return run_command(argv, program_env(cache_dir, extra_env))


BOOT_DIR = Path(__file__).resolve().parents[2] / "_check_boot"


# JAX's own words (``jax_explain_cache_misses``) for a compile it does not store: its
# ``compiler._cache_write`` names the module, ``compilation_cache.put_executable_and_time`` the
# key (jax 0.4.38 .. 0.12; 0.11 and later store modules with host callbacks)
_NOT_WRITING = re.compile(
    rb"Not writing persistent cache entry (?:for '(?P<module>[^'\s]+)'|with key "
    rb"'(?P<key>[^'\s]+)') (?:because|since) (?P<why>[^\r\n]*)"
)
_WHY_KIND = (  # the start of JAX's reason -> reasons.ReasonKind value
    (b"it uses host callbacks", "host-callbacks"),
    (b"it took < ", "under-min-compile-time"),
    (b"its size ", "under-min-size"),
)
_MAX_LINE = 4096  # a partial line kept between reads (JAX's lines are far shorter)


@dataclass(frozen=True)
class LoggedRefusal:
    """One of JAX's "Not writing persistent cache entry" lines in CMD's output."""

    module: str
    kind: str  # a reasons.ReasonKind value
    why: str  # JAX's reason, after "because" / "since"
    line: str  # JAX's words from "Not writing" to the end of the line


def logged_refusals(data: bytes) -> list[LoggedRefusal]:
    """JAX's refusals in ``data`` (whole lines), in order; a line whose reason this does not
    know (the cache not initialised) is left out."""
    found = []
    for match in _NOT_WRITING.finditer(data):
        why = match.group("why")
        kind = next((k for start, k in _WHY_KIND if why.startswith(start)), None)
        if kind is None:
            continue
        named = match.group("module")
        if named is not None:
            module = named.decode(errors="replace")
        else:  # the size refusal names the key, <module>-<hash>
            parsed = listdir.parse_key(match.group("key").decode(errors="replace"))
            module = (parsed[1] if parsed else None) or "(unnamed)"
        text = match.group(0).decode(errors="replace").strip()
        found.append(LoggedRefusal(module, kind, why.decode(errors="replace").strip(), text))
    return found


def check_env(
    base: Mapping[str, str], cache_dir: str, *, observe: bool, verify_fresh: str | None = None
) -> dict[str, str]:
    """The command's environment: this cache, every compilation cached, optional layers on.

    ``verify_fresh``: the verify run's, which reads ``cache_dir`` and writes each fresh compile
    to that folder (``stablekeys/verify_run.py``); its hook keys as the runs' (stable or JAX's).
    """
    env = dict(base)
    env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("JAX_EXPLAIN_CACHE_MISSES", "1")  # JAX then says which modules it won't store
    if observe:
        env.setdefault(HOOK_ENV, "observe")  # a mode the user set (e.g. stable) is kept
    if observe or verify_fresh:
        paths = [str(BOOT_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(paths)
    if verify_fresh:
        env[VERIFY_FRESH_ENV] = verify_fresh
    return env


class _Tee:
    """Copies a child's stream to a sink and the log as it arrives; spots JAX's refusals."""

    def __init__(self, sink: IO[bytes] | None, log: IO[bytes], lock: threading.Lock) -> None:
        self.sink, self.log, self.lock = sink, log, lock
        self.refusals: list[LoggedRefusal] = []
        self._tail = b""  # the last, unfinished line

    def pump(self, fd: int) -> None:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            with self.lock:
                self.log.write(chunk)
                if self.sink is not None:
                    with contextlib.suppress(OSError, ValueError):
                        self.sink.write(chunk)
                        self.sink.flush()
            data = self._tail + chunk
            end = data.rfind(b"\n") + 1
            self.refusals += logged_refusals(data[:end])
            self._tail = data[end:][-_MAX_LINE:]
        self.refusals += logged_refusals(self._tail)
        os.close(fd)


def run_once(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdout: IO[bytes] | None,
    stderr: IO[bytes] | None,
    log: IO[bytes],
) -> tuple[int, list[LoggedRefusal]]:
    """Run the command once, teeing its output; (exit code, JAX's refusals in its output)."""
    lock = threading.Lock()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = subprocess.Popen(list(argv), env=dict(env), stdout=out_w, stderr=err_w)
    except OSError as exc:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        raise path_error(exc, argv[0], what="command", verb="run", cls=CommandFailedError) from None
    os.close(out_w)
    os.close(err_w)
    tees = (_Tee(stdout, log, lock), _Tee(stderr, log, lock))
    threads = [
        threading.Thread(target=tee.pump, args=(fd,), daemon=True)
        for tee, fd in zip(tees, (out_r, err_r), strict=True)
    ]
    for t in threads:
        t.start()
    try:
        code = proc.wait()
    except BaseException:  # Ctrl-C: stop the child before leaving
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()
        raise
    finally:
        for t in threads:
            t.join(timeout=30)
    return code, [*tees[0].refusals, *tees[1].refusals]


def entry_keys(cache_dir: str) -> list[str]:
    try:
        listing = listdir.list_cache(cache_dir)
    except FileNotFoundError:
        return []
    return [i.key for i in listing.entries if i.key]
