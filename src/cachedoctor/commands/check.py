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
3. ``cachedoctor.commands.diff``, when installed, for the verdict of ``cachedoctor diff``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from cachedoctor import layout
from cachedoctor.cache import listdir, model, reader
from cachedoctor.commands.scan import FindingKind, ScanReport, scan_directory
from cachedoctor.errors import CachedoctorError, ExitCode, count
from cachedoctor.stablekeys.manifest import Manifest, iter_manifests, key_mode_reason
from cachedoctor.stablekeys.settings import HOOK_ENV  # the hook's activation variable

VERIFY_OPTION = "jax_compilation_cache_check_contents"
BOOT_DIR = Path(__file__).parent.parent / "_check_boot"
# JAX raises CacheVerificationError with this text when a cached executable differs.
_MISMATCH = re.compile(rb"cache inconsistency for key ([\w.\-]+-[0-9a-f]{64})")
# JAX's own words (jax_explain_cache_misses) for a module it refuses to store
_NOT_STORED = re.compile(
    rb"Not writing persistent cache entry for '([^'\s]+)' because it uses host callbacks"
)

Progress = Callable[[str], None]


class CommandFailedError(CachedoctorError):
    slug = "command-failed"
    code = ExitCode.USAGE


@dataclass(frozen=True)
class RunResult:
    index: int  # 1-based
    returncode: int
    seconds: float
    new_keys: tuple[str, ...]  # entries that appeared during this run
    verify: bool = False


@dataclass(frozen=True)
class VolatileChange:
    """A key input that the hook saw change between runs (from key manifests)."""

    field: str
    values: tuple[str, ...]  # raw values, one per key, in run order
    canonical_same: bool  # the stable hasher's canonical value was the same for all


@dataclass(frozen=True)
class UnstableModule:
    module: str
    keys: tuple[str, ...]  # distinct keys, in the order the runs wrote them
    recompiled_in: tuple[int, ...]  # later runs that wrote a new entry for it
    verdict: str  # one line: why the key changed, from the best layer available
    source: str  # the data the verdict rests on: "entries", "manifests" or "diff"
    entry_verdict: str  # what the stored entries alone say
    changed_components: tuple[str, ...] = ()  # key components whose digest differed (manifests)
    volatile: tuple[VolatileChange, ...] = ()
    stable_would_hit: bool | None = None  # None: no manifests for these keys
    stable_keys: int | None = None
    diff_verdict: str | None = None
    key_mode: str | None = None  # how the hook keys this module, and why (from its manifest)

    @property
    def program_changes(self) -> bool:
        """The stored programs differ and the stable hasher misses too: the program itself
        changes between runs (an unseeded random constant, a timestamp), so a new key is right.
        """
        return self.entry_verdict.startswith("different programs") and (
            self.stable_would_hit is not True
        )

    def explanation_lines(self) -> list[str]:
        runs = ", ".join(str(r) for r in self.recompiled_in)
        lines = [
            f"{self.module}: {len(self.keys)} distinct keys; recompiled in run {runs} "
            "although run 1 had compiled it",
            f"verdict ({self.source}): {self.verdict}",
        ]
        if self.source != "entries":
            lines.append(f"entries: {self.entry_verdict}")
        for change in self.volatile:
            values = " → ".join(_short(v) for v in change.values)
            lines.append(f"volatile input {change.field}: {values}")
        if self.changed_components:
            lines.append("stable-key components that differ: " + ", ".join(self.changed_components))
        if self.stable_would_hit is True:
            lines.append(
                "stable hasher: one key for all runs, so it would have hit "
                "(`cachedoctor enable` fixes this)"
            )
        elif self.stable_would_hit is False:
            lines.append(
                f"stable hasher: {self.stable_keys} keys as well; it would not have hit "
                "(the program really changes between runs, or an input it cannot canonicalise)"
            )
        else:
            lines.append("stable hasher: unknown (no key manifests for these entries)")
        if self.key_mode:
            lines.append(f"stable key mode: {self.key_mode}")
        if self.diff_verdict and self.source != "diff":
            lines.append(f"diff: {self.diff_verdict}")
        return lines


@dataclass(frozen=True)
class ObserveStatus:
    requested: bool
    manifests: int  # manifests in the cache after the runs
    detail: str


@dataclass(frozen=True)
class Mismatch:
    """A key whose cached executable JAX found different from a fresh compile (--verify)."""

    key: str
    module: str
    stale: bool | None  # True: another program; False: same program, other bytes; None: unknown
    detail: str


@dataclass(frozen=True)
class VerifyResult:
    run: int
    entries_before: int  # entries present before the verified run
    hit_modules: tuple[str, ...]  # modules of run 1 that got no new entry in the verified run
    mismatches: tuple[Mismatch, ...]
    complete: bool  # False: JAX stopped the command at the first mismatch
    # modules of run 1 that an aborted verified run may never have reached: neither hit nor miss
    not_checked: tuple[str, ...] = ()

    @property
    def stale(self) -> tuple[Mismatch, ...]:
        """Mismatches that are (or may be) stale entries: they fail the check."""
        return tuple(m for m in self.mismatches if m.stale is not False)


@dataclass(frozen=True)
class CheckReport:
    argv: tuple[str, ...]
    cache_dir: str
    temporary: bool  # the cache is a temp dir (removed unless --keep)
    kept: bool
    log_path: str | None
    runs: tuple[RunResult, ...]
    modules: tuple[str, ...]  # modules with entries after run 1
    unstable: tuple[UnstableModule, ...]
    observe: ObserveStatus
    verify: VerifyResult | None
    scan: ScanReport | None = field(default=None, repr=False)
    # modules JAX compiled but refused to store ("uses host callbacks"): they recompile each run
    not_stored: tuple[str, ...] = ()

    @property
    def compiled_in_run1(self) -> tuple[str, ...]:
        """Modules run 1 wrote entries for: the only ones this check can vouch for."""
        return tuple(sorted({_module(k) for k in self.runs[0].new_keys})) if self.runs else ()

    @property
    def nothing_checked(self) -> bool:
        """Run 1 wrote no entry and no later run recompiled: there is no evidence either way."""
        return not self.compiled_in_run1 and not self.unstable and self.verify is None

    @property
    def failed(self) -> bool:
        """Unstable keys, stale entries, nothing checked, or modules --verify left unchecked."""
        verify = self.verify
        stale_or_unchecked = bool(verify and (verify.stale or verify.not_checked))
        return bool(self.unstable) or stale_or_unchecked or self.nothing_checked

    def summary_line(self) -> str:
        n = len(self.runs)
        if self.nothing_checked:
            why = "the command compiled nothing with JAX's persistent cache on"
            if not self.temporary:
                why += f", or only hit entries already in {self.cache_dir} (use a fresh --dir)"
            return f"cachedoctor check: nothing was checked: run 1 wrote no cache entry: {why}"
        checked_runs = n - 1 if self.verify and self.verify.not_checked else n
        compiled = count(len(self.compiled_in_run1), "module")
        if self.unstable:
            head = f"{len(self.unstable)} of {len(self.modules)} modules recompiled in a later run"
            unstable = [m.module for m in self.unstable if not m.program_changes]
            changing = [m.module for m in self.unstable if m.program_changes]
            if unstable:
                head += f" (unstable cache key): {', '.join(unstable)}"
            if changing:
                head += (
                    f"{';' if unstable else ''} (the program itself changes between runs, so a "
                    f"new key is right; make it deterministic): {', '.join(changing)}"
                )
        elif checked_runs >= 2:
            head = f"all {compiled} compiled in run 1 hit in runs 2..{checked_runs}"
        elif n >= 2:
            head = f"{compiled} compiled in run 1"
        else:
            head = f"{compiled} compiled; one run cannot show instability"
        if self.verify and self.verify.not_checked:
            head += (
                f"; run {self.verify.run} (--verify) stopped at the first mismatch, so "
                f"{count(len(self.verify.not_checked), 'module')} were not checked: "
                + ", ".join(self.verify.not_checked)
                + " (run without --verify, or with more --runs, to check them)"
            )
        if self.not_stored:
            head += (
                f"; {count(len(self.not_stored), 'module')} recompile every run because JAX never "
                f"stores modules with host callbacks: {', '.join(self.not_stored)}"
            )
        if self.verify and self.verify.stale:
            head += f"; {len(self.verify.stale)} stale entries (--verify)"
        elif self.verify and self.verify.mismatches:
            head += "; --verify could not check every module (nondeterministic compilation)"
        return f"cachedoctor check: {head}"


def check_env(
    base: Mapping[str, str], cache_dir: str, *, observe: bool, verify: bool
) -> dict[str, str]:
    """The command's environment: this cache, every compilation cached, optional layers on."""
    env = dict(base)
    env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("JAX_EXPLAIN_CACHE_MISSES", "1")  # JAX then says which modules it won't store
    if observe:
        env.setdefault(HOOK_ENV, "observe")  # a mode the user set (e.g. stable) is kept
        paths = [str(BOOT_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(paths)
    if verify:
        env[VERIFY_OPTION.upper()] = "1"
    return env


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


class _Tee:
    """Copies a child's stream to a sink and the log as it arrives; spots verify mismatches."""

    def __init__(self, sink: IO[bytes] | None, log: IO[bytes], lock: threading.Lock) -> None:
        self.sink, self.log, self.lock = sink, log, lock
        self.mismatches: list[str] = []
        self.not_stored: list[str] = []
        self._tail = b""

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
            for match in _MISMATCH.finditer(data):
                key = match.group(1).decode()
                if key not in self.mismatches:
                    self.mismatches.append(key)
            for match in _NOT_STORED.finditer(data):
                module = match.group(1).decode()
                if module not in self.not_stored:
                    self.not_stored.append(module)
            self._tail = data[-200:]
        os.close(fd)


def _run_once(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdout: IO[bytes] | None,
    stderr: IO[bytes] | None,
    log: IO[bytes],
) -> tuple[int, list[str], list[str]]:
    """Run the command once, teeing its output; (exit code, mismatch keys, modules not stored)."""
    lock = threading.Lock()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = subprocess.Popen(list(argv), env=dict(env), stdout=out_w, stderr=err_w)
    except OSError as exc:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        raise CommandFailedError(
            f"cannot run {argv[0]!r}: {exc.strerror or exc}", slug="command-not-found"
        ) from None
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
    found = tees[0].mismatches + [k for k in tees[1].mismatches if k not in tees[0].mismatches]
    not_stored = sorted({*tees[0].not_stored, *tees[1].not_stored})
    return code, found, not_stored


def _keys(cache_dir: str) -> list[str]:
    try:
        listing = listdir.list_cache(cache_dir)
    except FileNotFoundError:
        return []
    return [i.key for i in listing.entries if i.key]


def _module(key: str) -> str:
    parsed = listdir.parse_key(key)
    return (parsed[1] if parsed else None) or "(unnamed)"


def _short(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[: limit - 1] + "…")


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
        seen = _keys(cache)
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
                code, found, refused = _run_once(argv, env, stdout, stderr, log)
                not_stored.update(refused)
                seconds = time.monotonic() - start
                log.write(f"=== {label} exited with {code} after {seconds:.1f} s\n".encode())
                known = set(seen)
                new = tuple(k for k in _keys(cache) if k not in known)
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
            cold = _cold_programs(argv, base, workdir, log, note) if verify else None
        report = _analyse(argv, cache, results, mismatches, cold, before_verify, observe)
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


def _analyse(
    argv: Sequence[str],
    cache: str,
    results: list[RunResult],
    jax_mismatches: Sequence[str],
    cold: tuple[int, dict[str, set[str]]] | None,
    before_verify: int,
    observe_requested: bool,
) -> CheckReport:
    first = results[0]
    all_keys = [k for r in results for k in r.new_keys]
    pre_existing = [k for k in _keys(cache) if k not in set(all_keys)]
    after_first = {_module(k) for k in [*pre_existing, *first.new_keys]}
    by_module: dict[str, list[str]] = {}
    for k in [*pre_existing, *all_keys]:
        by_module.setdefault(_module(k), []).append(k)
    later: dict[str, list[int]] = {}
    for r in results[1:]:
        for k in r.new_keys:
            if _module(k) in after_first and r.index not in later.get(_module(k), []):
                later.setdefault(_module(k), []).append(r.index)
    try:
        scan: ScanReport | None = scan_directory(cache)
    except OSError:
        scan = None
    manifests = _load_manifests(cache)
    unstable = tuple(
        _explain(module, by_module[module], sorted(later[module]), results, scan, manifests, cache)
        for module in sorted(later)
    )
    observe = _observe_status(observe_requested, manifests)
    verify_result = None
    if cold is not None:
        last = results[-1]
        missed = {_module(k) for k in last.new_keys}
        mismatches = _verify_findings(jax_mismatches, cold, scan, set(later))
        complete = last.returncode == 0
        # an aborted run proves nothing about the modules it produced no trace for: they may
        # have hit, or never been reached
        reached = missed | {m.module for m in mismatches}
        silent = tuple(sorted(m for m in after_first if m not in reached))
        verify_result = VerifyResult(
            run=last.index,
            entries_before=before_verify,
            hit_modules=silent if complete else (),
            mismatches=mismatches,
            complete=complete,
            not_checked=() if complete else silent,
        )
    return CheckReport(
        argv=tuple(argv),
        cache_dir=cache,
        temporary=False,
        kept=False,
        log_path=None,
        runs=tuple(results),
        modules=tuple(sorted(after_first)),
        unstable=unstable,
        observe=observe,
        verify=verify_result,
        scan=scan,
    )


def _cold_programs(
    argv: Sequence[str], base: Mapping[str, str], workdir: str, log: IO[bytes], note: Progress
) -> tuple[int, dict[str, set[str]]]:
    """Run the command once against an empty cache: the programs it compiles now, by module."""
    fresh = os.path.join(workdir, "verify-cold")
    os.makedirs(fresh, exist_ok=True)
    note("--verify: one more run against an empty cache, to compare programs")
    log.write(b"=== cachedoctor check --verify: cold run against an empty cache\n")
    log.flush()
    code, _, _ = _run_once(
        argv, check_env(base, fresh, observe=False, verify=False), None, None, log
    )
    log.write(f"=== cold run exited with {code}\n".encode())
    programs: dict[str, set[str]] = {}
    with contextlib.suppress(OSError):
        listing = listdir.list_cache(fresh)
        for item in listing.entries:
            info = reader.decode_entry(listing.path(item), key=item.key)
            if isinstance(info, model.EntryInfo) and info.program_digest:
                programs.setdefault(_module(item.key or ""), set()).add(info.program_digest)
    return code, programs


def _verify_findings(
    jax_keys: Sequence[str],
    cold: tuple[int, dict[str, set[str]]],
    scan: ScanReport | None,
    unstable: set[str],
) -> tuple[Mismatch, ...]:
    """Stale entries, from JAX's byte comparison and from comparing programs with a cold compile.

    JAX compares executable bytes and stops the command at the first difference, but XLA's CPU
    backend does not always emit identical object files for one program (seen for sharded
    modules), so each JAX mismatch is classified by program (modulo volatile fields). And a
    module that hit the cache (no new entry after run 1) although a cold compile gives a
    program that no entry of that module holds was served another program: a stale entry.
    """
    code, fresh = cold
    cached: dict[str, dict[str, str]] = {}  # module -> program digest -> key
    digest_of: dict[str, str | None] = {}
    for e in scan.entries if scan else ():
        digest_of[e.key] = e.program_digest
        if e.program_digest:
            cached.setdefault(_module(e.key), {})[e.program_digest] = e.key
    out: list[Mismatch] = []
    for key in jax_keys:
        module = _module(key)
        digest = digest_of.get(key)
        if code != 0:
            out.append(Mismatch(key, module, None, f"the cold run failed (exit {code})"))
        elif digest is None:
            out.append(Mismatch(key, module, None, "the cached entry could not be decoded"))
        elif digest in fresh.get(module, set()):
            out.append(
                Mismatch(
                    key,
                    module,
                    False,
                    "same program as a cold compile but other executable bytes: XLA's "
                    "compilation of this module is not deterministic, so JAX's check cannot "
                    "verify it and stops the command there",
                )
            )
        else:
            out.append(
                Mismatch(
                    key,
                    module,
                    True,
                    "JAX found the cached executable different from a fresh "
                    "compile, and it holds another program than a cold compile gives",
                )
            )
    if code == 0:
        flagged = {m.module for m in out}
        for module, digests in sorted(fresh.items()):
            if module in unstable or module in flagged or module not in cached:
                continue
            missing = digests - set(cached[module])
            if missing:
                keys = ", ".join(sorted(cached[module].values()))
                out.append(
                    Mismatch(
                        keys,
                        module,
                        True,
                        f"{module} hit the cache, but a cold compile gives a program "
                        "that no cached entry of it holds (the key missed a change)",
                    )
                )
    return tuple(out)


def _observe_status(requested: bool, manifests: Mapping[str, Manifest]) -> ObserveStatus:
    modes = sorted({m.mode for m in manifests.values()})
    if manifests:
        detail = f"hook in {'/'.join(modes)} mode: key manifests for {len(manifests)} entries"
        return ObserveStatus(requested, len(manifests), detail)
    if not requested:
        return ObserveStatus(False, 0, "off (--no-observe)")
    return ObserveStatus(
        True,
        0,
        "no key manifests were written: the command's Python could not load cachedoctor's "
        "hook (is cachedoctor installed in it?), CACHEDOCTOR_HOOK=off, or it compiled nothing",
    )


def _load_manifests(cache: str) -> dict[str, Manifest]:
    """Key manifests by stored key (unreadable ones are skipped by ``iter_manifests``)."""
    return {m.key: m for m in iter_manifests(cache)}


def _entry_verdict(module: str, keys: Sequence[str], scan: ScanReport | None) -> str:
    """What the stored entries say: the scan's unstable-key finding, or how the programs differ."""
    if scan is None:
        return "the cache could not be scanned"
    for f in scan.findings:
        if (
            f.kind is FindingKind.UNSTABLE_KEY
            and f.module == module
            and set(keys) <= set(f.entries)
        ):
            return f.message.split(": ", 1)[-1]
    entries = [e for e in scan.entries if e.key in set(keys)]
    if len(entries) < 2 or any(e.program_digest is None for e in entries):
        return "the entries could not be compared (undecodable or missing)"
    params = {e.hlo.parameters if e.hlo else None for e in entries}
    if len(params) > 1:
        shown = " vs ".join("(" + ", ".join(p or ()) + ")" for p in params)
        return (
            f"different programs: the entry parameters differ {shown}; "
            "the traced program changes between runs"
        )
    sizes = {e.hlo.instructions if e.hlo else None for e in entries}
    if len(sizes) > 1:
        shown = " vs ".join(str(s) for s in sorted(s for s in sizes if s is not None))
        return f"different programs: {shown} instructions; the traced program changes between runs"
    if len({e.program_digest for e in entries}) > 1:
        return "different programs (same shapes and size): the traced program changes between runs"
    return "same program in every entry, but not the same executable"


def _explain(
    module: str,
    keys: Sequence[str],
    recompiled_in: Sequence[int],
    results: Sequence[RunResult],
    scan: ScanReport | None,
    manifests: Mapping[str, Manifest],
    cache: str,
) -> UnstableModule:
    ordered = [k for r in results for k in r.new_keys if k in set(keys)]
    ordered = [k for k in keys if k not in set(ordered)] + ordered
    entry_verdict = _entry_verdict(module, ordered, scan)
    found = [manifests[k] for k in ordered if k in manifests]
    verdict, source = entry_verdict, "entries"
    volatile: list[VolatileChange] = []
    components: list[str] = []
    stable_hit: bool | None = None
    stable_keys: int | None = None
    if len(found) >= 2:
        volatile = _volatile_changes(found)
        components = _changed_components(found)
        stable = {m.stable_key for m in found}
        stable_keys = len(stable)
        stable_hit = stable_keys == 1
        if volatile:
            names = ", ".join(v.field for v in volatile)
            verdict = f"the key input {names} changed between runs"
            if stable_hit:
                verdict += "; its canonical form did not (a volatile value, not a real change)"
        elif components:
            verdict = "key components differ: " + ", ".join(components)
        source = "manifests"
    diff_verdict = _diff_verdict(cache, ordered[0], ordered[-1])
    if diff_verdict and source == "entries":
        verdict, source = diff_verdict, "diff"
    return UnstableModule(
        module=module,
        keys=tuple(ordered),
        recompiled_in=tuple(recompiled_in),
        verdict=verdict,
        source=source,
        entry_verdict=entry_verdict,
        changed_components=tuple(components),
        volatile=tuple(volatile),
        stable_would_hit=stable_hit,
        stable_keys=stable_keys,
        diff_verdict=diff_verdict,
        key_mode=_key_mode(found[-1]) if found else None,
    )


def _key_mode(found: Manifest) -> str | None:
    """``replay (3 recorded partitioner calls ...)``, ``static (...)`` or ``fallback (why)``."""
    mode = getattr(found, "key_mode", None)
    if mode is None:
        return None
    return f"{mode} ({key_mode_reason(found)})"


def _volatile_changes(found: Sequence[Manifest]) -> list[VolatileChange]:
    """Volatile fields whose raw value differed between the manifests (hook's ``volatile``)."""
    by_field: dict[str, list[tuple[str, str]]] = {}
    for m in found:
        for v in m.volatile:
            name = str(v.get("field", "?"))
            by_field.setdefault(name, []).append(
                (str(v.get("raw", "")), str(v.get("canonical", "")))
            )
    changes = []
    for name, pairs in by_field.items():
        raws = [raw for raw, _ in pairs]
        if len(set(raws)) > 1:
            changes.append(
                VolatileChange(
                    field=name,
                    values=tuple(raws),
                    canonical_same=len({c for _, c in pairs}) == 1,
                )
            )
    return changes


def _changed_components(found: Sequence[Manifest]) -> list[str]:
    digests: dict[str, set[str]] = {}
    for m in found:
        for comp in m.components:
            digests.setdefault(str(comp.get("name")), set()).add(str(comp.get("digest")))
    return [name for name, values in digests.items() if len(values) > 1]


def _diff_verdict(cache: str, key_a: str, key_b: str) -> str | None:
    """The verdict line of ``cachedoctor diff`` for two entries; None when one is unreadable."""
    from cachedoctor.commands.diff import diff_entries

    try:
        result = diff_entries(
            Path(cache) / f"{key_a}{layout.CACHE_SUFFIX}",
            Path(cache) / f"{key_b}{layout.CACHE_SUFFIX}",
        )
    except (OSError, CachedoctorError):  # the entries' own verdict stands
        return None
    return result.verdict.line.strip() or None
