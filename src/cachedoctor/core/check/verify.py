"""``check --verify``: compare what the cache serves with what CMD compiles now, by program.

After the runs, CMD runs once more against the same cache with ``CACHEDOCTOR_VERIFY_FRESH`` set
(``stablekeys/verify_run.py``): every lookup notes its key and misses, so JAX compiles each module
afresh under the very key a cached run looks up, and the fresh entry goes to a folder of its own;
the cache is only read. Then each key is judged by the program it holds (the program digest:
the optimised HLO and compile options modulo volatile fields, ``cache/reader``), not by bytes:

- the cache holds the key and the same program: verified (XLA's CPU backend does not always
  emit the same object code for one program, which is not a stale entry);
- the cache holds the key and another program: **stale**, a cached run loads other code;
- the cache does not hold the key: a cached run compiles it afresh, nothing stale to serve;
- a module with an entry after run 1 that the verify run compiled under no key: **not checked**
  (never reached, or the run failed first), never stale.

This replaces JAX's ``jax_compilation_cache_check_contents``, which compares executable bytes and
raises at the first difference: on CPU it stopped most runs at a module that merely recompiled
to other bytes, leaving the rest unchecked, and it exists only in jax 0.10.2 and later.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

from cachedoctor import layout
from cachedoctor.cache import listdir, model, reader
from cachedoctor.core.check.report import KeyCheck, Outcome, Progress, VerifyResult, module_of_key
from cachedoctor.core.check.runner import check_env, entry_keys, run_once
from cachedoctor.core.scan.report import ScanReport
from cachedoctor.stablekeys.verify_run import REQUESTED_PREFIX


@dataclass(frozen=True)
class FreshRun:
    """What the verify run left: its exit, the keys it looked up, its fresh compiles."""

    run: int
    returncode: int
    seconds: float
    entries_before: int
    requested: dict[str, bool] = field(default_factory=dict)  # key -> the cache held it
    # key -> (program digest, executable digest) of the fresh compile (None: undecodable)
    fresh: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)


def verify_run(
    argv: Sequence[str],
    base: Mapping[str, str],
    cache: str,
    workdir: str,
    log: IO[bytes],
    note: Progress,
    run: int,
    observe: bool,
    spelling: str | None = None,
) -> FreshRun:
    """Run CMD once, reading ``cache`` without trusting it; its output goes to the log only.

    ``spelling``: the cache folder as CMD's runs were given it (JAX hashes that into the keys)."""
    folder = os.path.join(workdir, "verify-fresh")
    os.makedirs(folder, exist_ok=True)
    before = len(entry_keys(cache))
    note(f"run {run} (--verify): every module compiled afresh and compared with the cache")
    log.write(f"=== cachedoctor check run {run} (--verify): cache read, not trusted\n".encode())
    log.flush()
    start = time.monotonic()
    env = check_env(base, spelling or cache, observe=observe, verify_fresh=folder)
    code, _ = run_once(argv, env, None, None, log)
    seconds = time.monotonic() - start
    log.write(f"=== run {run} (--verify) exited with {code} after {seconds:.1f} s\n".encode())
    return FreshRun(run, code, seconds, before, _requested(folder), _fresh_programs(folder))


def _requested(folder: str) -> dict[str, bool]:
    out: dict[str, bool] = {}
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(folder)):
            if not name.startswith(REQUESTED_PREFIX):
                continue
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                for line in f:
                    key, _, held = line.strip().partition(" ")
                    if key:
                        out[key] = out.get(key, False) or held == "1"
    return out


def _fresh_programs(folder: str) -> dict[str, tuple[str | None, str | None]]:
    out: dict[str, tuple[str | None, str | None]] = {}
    with contextlib.suppress(OSError):
        listing = listdir.list_cache(folder)
        for item in listing.entries:
            if not item.key:
                continue
            info = reader.decode_entry(listing.path(item), key=item.key)
            if isinstance(info, model.EntryInfo):
                out[item.key] = (info.program_digest, info.executable_digest)
            else:
                out[item.key] = (None, None)
    return out


def verify_result(
    fresh: FreshRun, cache: str, scan: ScanReport | None, after_first: set[str]
) -> VerifyResult:
    """Each fresh compile against the cached entry under its key; the modules left unchecked."""
    cached = {e.key: e for e in (scan.loaded_entries()[0] if scan else ())}
    checks = tuple(
        _check(key, program, executable, cached.get(key), _held(cache, key, fresh))
        for key, (program, executable) in sorted(fresh.fresh.items())
    )
    reached = {c.module for c in checks}
    not_checked = tuple(sorted(m for m in after_first if m not in reached))
    if fresh.returncode != 0:
        reason = f"the verify run exited with {fresh.returncode} before compiling them"
    elif not fresh.requested:
        reason = (
            "the verify run looked up nothing: cachedoctor's start-up shim did not load in "
            "CMD's Python (is cachedoctor installed in it?), or this JAX has no "
            "compilation_cache._get_cache"
        )
    else:
        reason = "the verify run did not compile them: CMD did not ask for them this time"
    return VerifyResult(
        run=fresh.run,
        returncode=fresh.returncode,
        seconds=fresh.seconds,
        entries_before=fresh.entries_before,
        checks=checks,
        not_checked=not_checked,
        reason=reason if not_checked else "",
    )


def _held(cache: str, key: str, fresh: FreshRun) -> bool:
    """The cache holds ``key``: the verify run saw it there, or its file is there now."""
    return fresh.requested.get(key, False) or os.path.exists(
        os.path.join(cache, f"{key}{layout.CACHE_SUFFIX}")
    )


def _check(
    key: str,
    fresh_program: str | None,
    fresh_executable: str | None,
    entry: model.EntryInfo | None,
    held: bool,
) -> KeyCheck:
    module = module_of_key(key)
    fp = _short(fresh_program)
    if entry is None and not held:
        return KeyCheck(
            key, module, Outcome.NOT_CACHED, None, fresh_program, None,
            f"no cached entry {key}; fresh compile: program {fp}",
            "the cache does not hold this key: a cached run compiles the module afresh",
        )  # fmt: skip
    cp = entry.program_digest if entry is not None else None
    pair = f"cached entry {key} (program {_short(cp)}) vs its fresh compile (program {fp})"
    if cp is None or fresh_program is None:
        which = "cached entry" if cp is None else "fresh compile"
        return KeyCheck(
            key, module, Outcome.UNKNOWN, cp, fresh_program, None, pair,
            f"the {which} could not be decoded: whether the entry is stale is unknown",
        )  # fmt: skip
    same_bytes = entry is not None and entry.executable_digest == fresh_executable
    if cp == fresh_program:
        how = (
            "the same executable bytes"
            if same_bytes
            else ("other executable bytes (XLA did not emit the same object code for one program)")
        )
        return KeyCheck(
            key, module, Outcome.SAME, cp, fresh_program, same_bytes, pair,
            f"the cached entry holds the program a fresh compile gives, with {how}",
        )  # fmt: skip
    return KeyCheck(
        key, module, Outcome.STALE, cp, fresh_program, same_bytes, pair,
        "a cached run loads another program than CMD compiles now under this key: the key "
        "misses a change, so the entry is stale",
    )  # fmt: skip


def _short(digest: str | None) -> str:
    return digest[:12] if digest else "undecodable"
