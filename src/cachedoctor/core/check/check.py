"""`check -- CMD`: run a command several times against one cache and find unstable keys.

Each run is a fresh process, as a restarted job would be. After run 1 every module it compiled
is in the cache; a module that gets a *new* entry on a later run recompiled although nothing in
the command changed: its cache key is unstable, and every restart pays the compile again.

The explanation comes in layers, each naming the data it rests on:
1. the entries themselves (always): the scan's duplicate groups tell whether the new entry holds
   the same executable as run 1's (a key input that never reaches the compiled code changed);
2. key manifests, when cachedoctor's hook can run in the command's interpreter: it is activated
   in ``observe`` mode, which keeps JAX's keys and records per key the hashed components, the
   volatile inputs with their raw values, and the stable key cachedoctor would have used;
3. ``cachedoctor.core.diff``, when installed, for the verdict of ``cachedoctor diff``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import IO

from cachedoctor.core.check.analysis import analyse
from cachedoctor.core.check.report import CheckReport, CommandFailedError, Progress, RunResult
from cachedoctor.core.check.runner import check_env, entry_keys, run_once
from cachedoctor.core.check.verify import FreshRun, verify_run
from cachedoctor.errors import CachedoctorError, path_error


def run_check(
    argv: Sequence[str],
    *,
    runs: int = 2,
    cache_dir: str | None = None,
    verify: bool = False,
    observe: bool = True,
    log_path: str | None = None,
    keep: bool = False,
    stdout: IO[bytes] | None = None,
    stderr: IO[bytes] | None = None,
    progress: Progress | None = None,
    base_env: Mapping[str, str] | None = None,
) -> CheckReport:
    """Run ``argv`` ``runs`` times against one cache and report modules whose key is unstable.

    With ``verify``, CMD runs once more after them, reading the cache without trusting it
    (``check/verify.py``). The command's output goes to ``stdout``/``stderr`` (None: only to the
    log) and the verify run's only to the log. Raises :class:`CommandFailedError` (exit 2) when
    one of the ``runs`` fails; a failed verify run leaves the modules it did not reach unchecked.
    """
    if not argv:
        raise CachedoctorError("no command given: cachedoctor check -- CMD [ARGS...]", slug="usage")
    if runs < 1:
        raise CachedoctorError("--runs must be at least 1", slug="usage")
    note = progress or (lambda _msg: None)
    workdir = tempfile.mkdtemp(prefix="cachedoctor-check-")
    temporary = cache_dir is None
    cache = os.path.join(workdir, "cache") if cache_dir is None else os.path.abspath(cache_dir)
    log_file = log_path or os.path.join(workdir, "check.log")
    base = base_env if base_env is not None else os.environ
    results: list[RunResult] = []
    fresh: FreshRun | None = None
    not_stored: set[str] = set()
    keep_files = keep
    try:
        os.makedirs(cache, exist_ok=True)
        seen = entry_keys(cache)
        with open(log_file, "ab") as log:
            for index in range(1, runs + 1):
                env = check_env(base, cache, observe=observe)
                label = f"run {index}/{runs}"
                note(f"{label}: {shlex.join(argv)}")
                code, refused, seconds = _logged_run(argv, label, env, stdout, stderr, log)
                not_stored.update(refused)
                known = set(seen)
                new = tuple(k for k in entry_keys(cache) if k not in known)
                seen += new
                results.append(RunResult(index, code, seconds, new))
                if code != 0:
                    quiet_log = stdout is None and log_path is None
                    if quiet_log and not keep:  # its output is only there: keep the log alone
                        shutil.rmtree(os.path.join(workdir, "cache"), ignore_errors=True)
                        keep_files = True
                    raise _run_failed(label, argv, code, log_file, quiet_log=quiet_log, keep=keep)
            if verify:
                run = runs + 1
                fresh = verify_run(argv, base, cache, workdir, log, note, run, observe)
        report = analyse(argv, cache, results, fresh, observe)
    except OSError as exc:
        raise _io_error(exc, cache, log_file) from None
    finally:
        if not keep_files:
            shutil.rmtree(workdir, ignore_errors=True)  # temp cache and default log
    return replace(
        report,
        not_stored=tuple(sorted(not_stored)),
        temporary=temporary,
        kept=keep_files,
        log_path=log_file if os.path.exists(log_file) else None,
    )


def _logged_run(
    argv: Sequence[str],
    label: str,
    env: Mapping[str, str],
    stdout: IO[bytes] | None,
    stderr: IO[bytes] | None,
    log: IO[bytes],
) -> tuple[int, list[str], float]:
    """One run, between its two lines in the log: (exit code, modules not stored, seconds)."""
    log.write(f"=== cachedoctor check {label}: {shlex.join(argv)}\n".encode())
    log.flush()
    start = time.monotonic()
    code, refused = run_once(argv, env, stdout, stderr, log)
    seconds = time.monotonic() - start
    log.write(f"=== {label} exited with {code} after {seconds:.1f} s\n".encode())
    return code, refused, seconds


def _run_failed(
    label: str, argv: Sequence[str], code: int, log_file: str, *, quiet_log: bool, keep: bool
) -> CommandFailedError:
    """The error of a run that exited non-zero, saying where its output is."""
    where = (
        f"output only in the log: {log_file}"
        if quiet_log
        else "output above" + ("" if keep else "; --keep keeps cache and log")
    )
    return CommandFailedError(f"{label} failed: `{shlex.join(argv)}` exited with {code} ({where})")


def _io_error(exc: OSError, cache: str, log_file: str) -> CachedoctorError:
    """The one-line error of an ``OSError`` on check's own files: writing the log (a missing
    folder is ``no-such-dir``), or making and listing the cache."""
    name = exc.filename if isinstance(exc.filename, str) else None
    if name is not None and os.path.abspath(name) == os.path.abspath(log_file):
        return path_error(exc, log_file, what="file", verb="write")
    return path_error(exc, name or cache, verb="use")
