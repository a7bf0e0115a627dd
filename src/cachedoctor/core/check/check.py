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

from cachedoctor.core.check.analysis import analyse, cold_programs
from cachedoctor.core.check.report import CheckReport, CommandFailedError, Progress, RunResult
from cachedoctor.core.check.runner import VERIFY_OPTION, check_env, entry_keys, run_once
from cachedoctor.errors import CachedoctorError


def jax_has_verify_option() -> bool | None:
    """Whether the installed JAX defines ``jax_compilation_cache_check_contents`` (None: no JAX)."""
    from cachedoctor.cache.jaxenv import _jax_src_file

    config = _jax_src_file("_src/config.py")
    if config is None:
        return None
    try:
        return f"'{VERIFY_OPTION}'" in config.read_text(encoding="utf-8")
    except OSError:
        return None


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

    The command's output goes to ``stdout``/``stderr`` (None: only to the log). Raises
    :class:`CommandFailedError` (exit 2) when a run fails for another reason than ``--verify``
    finding a stale entry.
    """
    if not argv:
        raise CachedoctorError("no command given: cachedoctor check -- CMD [ARGS...]", slug="usage")
    if runs < 1:
        raise CachedoctorError("--runs must be at least 1", slug="usage")
    if verify:
        has = jax_has_verify_option()
        if has is False:
            from cachedoctor.cache.jaxenv import installed_jax

            raise CachedoctorError(
                f"--verify needs JAX's {VERIFY_OPTION} option, which the installed JAX "
                f"{installed_jax().jax_version} does not have (it is in jax 0.10.2 and later)",
                slug="usage",
            )
    note = progress or (lambda _msg: None)
    workdir = tempfile.mkdtemp(prefix="cachedoctor-check-")
    temporary = cache_dir is None
    cache = os.path.join(workdir, "cache") if cache_dir is None else os.path.abspath(cache_dir)
    log_file = log_path or os.path.join(workdir, "check.log")
    base = base_env if base_env is not None else os.environ
    results: list[RunResult] = []
    mismatches: list[str] = []
    before_verify = 0
    not_stored: set[str] = set()
    keep_files = keep
    try:
        os.makedirs(cache, exist_ok=True)
        seen = entry_keys(cache)
        with open(log_file, "ab") as log:
            for index in range(1, runs + 1):
                last_verify = verify and index == runs
                env = check_env(base, cache, observe=observe, verify=last_verify)
                if last_verify:
                    before_verify = len(seen)
                label = f"run {index}/{runs}" + (" (--verify)" if last_verify else "")
                note(f"{label}: {shlex.join(argv)}")
                log.write(f"=== cachedoctor check {label}: {shlex.join(argv)}\n".encode())
                log.flush()
                start = time.monotonic()
                code, found, refused = run_once(argv, env, stdout, stderr, log)
                not_stored.update(refused)
                seconds = time.monotonic() - start
                log.write(f"=== {label} exited with {code} after {seconds:.1f} s\n".encode())
                known = set(seen)
                new = tuple(k for k in entry_keys(cache) if k not in known)
                seen += new
                results.append(RunResult(index, code, seconds, new, last_verify))
                if last_verify and found:
                    mismatches = found  # JAX raised CacheVerificationError: that is the finding
                    break
                if code != 0:
                    quiet_log = stdout is None and log_path is None
                    if quiet_log and not keep:  # its output is only there: keep the log alone
                        shutil.rmtree(os.path.join(workdir, "cache"), ignore_errors=True)
                        keep_files = True
                    where = (
                        f"output only in the log: {log_file}"
                        if quiet_log
                        else "output above" + ("" if keep else "; --keep keeps cache and log")
                    )
                    raise CommandFailedError(
                        f"{label} failed: `{shlex.join(argv)}` exited with {code} ({where})"
                    )
            cold = cold_programs(argv, base, workdir, log, note) if verify else None
        report = analyse(argv, cache, results, mismatches, cold, before_verify, observe)
    except OSError as exc:
        raise CachedoctorError(f"check: {exc.strerror or exc}: {exc.filename}", slug="io") from None
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
