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
from dataclasses import dataclass, field, replace
from typing import IO

from cachedoctor.core.check.analysis import analyse
from cachedoctor.core.check.notstored import read_records, record_names, refused
from cachedoctor.core.check.report import (
    CheckReport,
    CommandFailedError,
    CommandFailure,
    ObserveStatus,
    Progress,
    RunResult,
)
from cachedoctor.core.check.runner import LoggedRefusal, check_env, entry_keys, run_once
from cachedoctor.core.check.verify import verify_run
from cachedoctor.core.usage.model import Record
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
    log) and the verify run's only to the log. CMD gets ``cache_dir`` spelt as given (JAX hashes
    the spelling into its keys). A run that fails (or cannot start) stops the check: the report
    then has ``command_failed`` and judges nothing; a failed verify run leaves the modules it
    did not reach unchecked.
    """
    if not argv:
        raise CachedoctorError("no command given: cachedoctor check -- CMD [ARGS...]", slug="usage")
    if runs < 1:
        raise CachedoctorError("--runs must be at least 1", slug="usage")
    workdir = tempfile.mkdtemp(prefix="cachedoctor-check-")
    spelling = os.path.join(workdir, "cache") if cache_dir is None else cache_dir
    state = _State(
        cache=os.path.abspath(spelling),
        spelling=spelling,
        log_file=log_path or os.path.join(workdir, "check.log"),
        base=base_env if base_env is not None else os.environ,
        note=progress or (lambda _msg: None),
        observe=observe,
    )
    keep_files = keep
    try:
        os.makedirs(state.cache, exist_ok=True)
        with open(state.log_file, "ab") as log:
            stopped = _runs(argv, runs, state, stdout, stderr, log)
            if stopped is not None:
                quiet_log = stdout is None and log_path is None
                if quiet_log and not keep and stopped.returncode is not None:
                    # its output is only in the log: keep the log alone
                    shutil.rmtree(os.path.join(workdir, "cache"), ignore_errors=True)
                    keep_files = True
                failure = _failure(stopped, state.log_file, quiet_log=quiet_log, keep=keep)
                report = _failed_report(argv, state, failure)
            else:
                fresh = None
                if verify:
                    fresh = verify_run(
                        argv, state.base, state.cache, workdir, log, state.note, runs + 1,
                        observe, spelling=state.spelling,
                    )  # fmt: skip
                report = analyse(argv, state.cache, state.results, fresh, observe)
        report = replace(report, refused=refused(state.records, state.logged))
    except OSError as exc:
        raise _io_error(exc, state.cache, state.log_file) from None
    finally:
        if not keep_files:
            shutil.rmtree(workdir, ignore_errors=True)  # temp cache and default log
    return replace(
        report,
        temporary=cache_dir is None,
        kept=keep_files,
        log_path=state.log_file if os.path.exists(state.log_file) else None,
    )


@dataclass
class _State:
    """What the runs share and gather: the cache (as CMD gets it, and as a path here), the
    log, and what each run left."""

    cache: str
    spelling: str
    log_file: str
    base: Mapping[str, str]
    note: Progress
    observe: bool
    results: list[RunResult] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)  # the runs' stats records
    logged: list[LoggedRefusal] = field(default_factory=list)  # JAX's refusals in the output


def _runs(
    argv: Sequence[str],
    runs: int,
    state: _State,
    stdout: IO[bytes] | None,
    stderr: IO[bytes] | None,
    log: IO[bytes],
) -> CommandFailure | None:
    """Run CMD ``runs`` times; None, or the run that failed (its message says only how: the
    caller adds where its output is)."""
    seen = entry_keys(state.cache)
    for index in range(1, runs + 1):
        env = check_env(state.base, state.spelling, observe=state.observe)
        label = f"run {index}/{runs}"
        state.note(f"{label}: {shlex.join(argv)}")
        before = record_names(state.cache)
        try:
            code, logged, seconds = _logged_run(argv, label, env, stdout, stderr, log)
        except CommandFailedError as exc:  # it could not start
            return CommandFailure(index, None, str(exc), exc.slug)
        state.logged += logged
        state.records += read_records(state.cache, record_names(state.cache) - before)
        known = set(seen)
        new = tuple(k for k in entry_keys(state.cache) if k not in known)
        seen += new
        state.results.append(RunResult(index, code, seconds, new))
        if code != 0:
            shown = shlex.join(argv)
            return CommandFailure(index, code, f"{label} failed: `{shown}` exited with {code}")
    return None


def _logged_run(
    argv: Sequence[str],
    label: str,
    env: Mapping[str, str],
    stdout: IO[bytes] | None,
    stderr: IO[bytes] | None,
    log: IO[bytes],
) -> tuple[int, list[LoggedRefusal], float]:
    """One run, between its two lines in the log: (exit code, JAX's refusals, seconds)."""
    log.write(f"=== cachedoctor check {label}: {shlex.join(argv)}\n".encode())
    log.flush()
    start = time.monotonic()
    code, refusals = run_once(argv, env, stdout, stderr, log)
    seconds = time.monotonic() - start
    log.write(f"=== {label} exited with {code} after {seconds:.1f} s\n".encode())
    return code, refusals, seconds


def _failure(
    stopped: CommandFailure, log_file: str, *, quiet_log: bool, keep: bool
) -> CommandFailure:
    """The failed run, its message saying where its output is."""
    if stopped.returncode is None:
        return stopped
    where = (
        f"output only in the log: {log_file}"
        if quiet_log
        else "output above" + ("" if keep else "; --keep keeps cache and log")
    )
    return replace(stopped, message=f"{stopped.message} ({where})")


def _failed_report(argv: Sequence[str], state: _State, failure: CommandFailure) -> CheckReport:
    """The report of a check a failed run stopped: the runs so far, nothing judged."""
    return CheckReport(
        argv=tuple(argv),
        cache_dir=state.cache,
        temporary=False,
        kept=False,
        log_path=None,
        runs=tuple(state.results),
        modules=(),
        unstable=(),
        observe=ObserveStatus(state.observe, 0, "not looked at: a run of the command failed"),
        verify=None,
        command_failed=failure,
    )


def _io_error(exc: OSError, cache: str, log_file: str) -> CachedoctorError:
    """The one-line error of an ``OSError`` on check's own files: writing the log (a missing
    folder is ``no-such-dir``), or making and listing the cache."""
    name = exc.filename if isinstance(exc.filename, str) else None
    if name is not None and os.path.abspath(name) == os.path.abspath(log_file):
        return path_error(exc, log_file, what="file", verb="write")
    return path_error(exc, name or cache, verb="use")
