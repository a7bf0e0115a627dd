"""What ``check`` found: each run, the modules whose key is unstable, what --verify compared."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cachedoctor.cache import listdir
from cachedoctor.core.scan.report import ScanReport
from cachedoctor.errors import CachedoctorError, ExitCode, count

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
    # the two entries the verdicts rest on: an earlier entry and the first new one, and what
    # pairs them (a module name can hold several programs)
    pair: tuple[str, str] = ("", "")
    pairing: str = ""

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
        lines.append(
            f"entries: {self.pair[0]} vs {self.pair[1]} ({self.pairing}): {self.entry_verdict}"
        )
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


class Outcome:
    """What the verify run found for one key it looked up (``KeyCheck.outcome``)."""

    SAME = "same-program"  # the cached entry holds the program a fresh compile gives
    STALE = "stale"  # the cached entry holds another program: a cached run loads the wrong code
    UNKNOWN = "unknown"  # one of the two could not be decoded: no evidence either way
    NOT_CACHED = "not-in-cache"  # the key is not in the cache: a cached run compiles it afresh


@dataclass(frozen=True)
class KeyCheck:
    """One key the verify run looked up: the cached entry vs the fresh compile under that key."""

    key: str
    module: str
    outcome: str  # an Outcome value
    cached_program: str | None  # program digest of the cached entry (None: absent/undecodable)
    fresh_program: str | None  # program digest of the fresh compile
    same_bytes: bool | None  # the two entries' executables byte for byte (None: not both there)
    entries: str  # the pair the outcome rests on, one line (the same in text and JSON)
    detail: str

    @property
    def stale(self) -> bool | None:
        """True: stale; None: unknown; False: not stale."""
        if self.outcome == Outcome.STALE:
            return True
        return None if self.outcome == Outcome.UNKNOWN else False


@dataclass(frozen=True)
class VerifyResult:
    """The verify run: CMD once more, reading the cache without trusting it (see check.py)."""

    run: int  # its number, after the --runs runs
    returncode: int
    seconds: float
    entries_before: int  # entries in the cache when it started
    checks: tuple[KeyCheck, ...]  # every key it looked up and had compiled, by key
    # modules with an entry after run 1 that it compiled under no key: never reached (or it
    # failed before), never STALE; the reason says which
    not_checked: tuple[str, ...] = ()
    reason: str = ""  # why not_checked modules were not checked

    @property
    def complete(self) -> bool:
        return self.returncode == 0

    @property
    def stale(self) -> tuple[KeyCheck, ...]:
        """Keys whose cached entry is (or may be) stale: they fail the check."""
        return tuple(c for c in self.checks if c.stale is not False)

    @property
    def verified_modules(self) -> tuple[str, ...]:
        """Modules with a key whose cached entry holds the fresh compile's program."""
        return tuple(sorted({c.module for c in self.checks if c.outcome == Outcome.SAME}))


@dataclass(frozen=True)
class NotStored:
    """A module JAX compiled and would not store, with JAX's reason: it recompiles every run.

    ``kind``: a ``reasons.ReasonKind`` value (``host-callbacks``, ``under-min-compile-time``,
    ``under-min-size``, ``write-failed``); ``source``: what the reason rests on, ``stats
    records`` (the hook in CMD's processes saw JAX's ``_cache_write`` decide; pytest's log
    capture cannot hide that) or ``JAX's log`` (only its line in CMD's output); ``jax_log``:
    JAX's own line for it, when that reached CMD's output (``JAX_EXPLAIN_CACHE_MISSES``)."""

    module: str
    kind: str
    summary: str
    evidence: str
    advice: str
    source: str
    jax_log: str | None = None


@dataclass(frozen=True)
class CommandFailure:
    """A run of CMD that failed: the check stopped there and judged nothing (exit 2)."""

    run: int
    returncode: int | None  # None: it could not be started
    message: str  # the one line: which run, how it failed, where its output is
    slug: str = "command-failed"  # the error's slug: command-failed, command-not-found, ...


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
    # modules JAX compiled but refused to store, with its reason: they recompile each run
    refused: tuple[NotStored, ...] = ()
    # processes > 0 of a jax.distributed job whose keys differ from process 0's only in what
    # JAX hashes per process (the manifests' components): (module, process, fields)
    per_process: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
    command_failed: CommandFailure | None = None  # a run of CMD failed: nothing was judged

    @property
    def not_stored(self) -> tuple[str, ...]:
        """The modules JAX refused to store (``refused``), by name."""
        return tuple(n.module for n in self.refused)

    @property
    def compiled_in_run1(self) -> tuple[str, ...]:
        """Modules run 1 wrote entries for: the only ones this check can vouch for."""
        return tuple(sorted({module_of_key(k) for k in self.runs[0].new_keys})) if self.runs else ()

    @property
    def nothing_checked(self) -> bool:
        """Run 1 wrote no entry and no later run recompiled: there is no evidence either way
        (a failed CMD is its own outcome: ``command_failed``)."""
        if self.command_failed is not None:
            return False
        return not self.compiled_in_run1 and not self.unstable and self.verify is None

    @property
    def failed(self) -> bool:
        """CMD failed, unstable keys, stale entries, nothing checked, or modules --verify left
        unchecked."""
        verify = self.verify
        stale_or_unchecked = bool(verify and (verify.stale or verify.not_checked))
        failed_cmd = self.command_failed is not None
        return failed_cmd or bool(self.unstable) or stale_or_unchecked or self.nothing_checked

    def summary_line(self) -> str:
        if self.command_failed is not None:
            return (
                f"cachedoctor check: nothing was judged: {self.command_failed.message}"
                + self._not_stored_clause()
            )
        if self.nothing_checked:
            why = "the command compiled nothing with JAX's persistent cache on"
            if self.refused:
                why = "JAX refused to store what the command compiled (NOT STORED)"
            if not self.temporary:
                why += f", or only hit entries already in {self.cache_dir} (use a fresh --dir)"
            return (
                f"cachedoctor check: nothing was checked: run 1 wrote no cache entry: {why}"
                + self._not_stored_clause()
            )
        return f"cachedoctor check: {self._head()}"

    def _head(self) -> str:
        n = len(self.runs)
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
        elif n >= 2:
            head = f"all {compiled} compiled in run 1 hit in runs 2..{n}"
        else:
            head = f"{compiled} compiled; one run cannot show instability"
        if self.verify and self.verify.not_checked:
            head += (
                f"; {count(len(self.verify.not_checked), 'module')} "
                f"{'was' if len(self.verify.not_checked) == 1 else 'were'} not checked by "
                f"--verify ({self.verify.reason}): " + ", ".join(self.verify.not_checked)
            )
        head += self._not_stored_clause()
        if self.per_process:
            modules = sorted({m for m, _, _ in self.per_process})
            fields = sorted({f for _, _, fs in self.per_process for f in fs})
            head += (
                f"; {count(len(modules), 'module')} {_recompile(len(modules))} every run in "
                "processes > 0 of a "
                f"jax.distributed job, whose keys differ from process 0's only in "
                f"{', '.join(fields)} (JAX hashes it per process and writes only from process "
                f"0): {', '.join(modules)}"
            )
        if self.verify and self.verify.stale:
            stale = len(self.verify.stale)
            head += f"; {count(stale, 'stale entry', 'stale entries')} (--verify)"
        elif self.verify and self.verify.checks:
            same = self.verify.verified_modules
            head += (
                f"; --verify: no stale entry ({count(len(same), 'module')} hold the program a "
                "fresh compile gives)"
            )
        return head

    def _not_stored_clause(self) -> str:
        """``; not stored by JAX, so compiled afresh every run: jit_f (JAX's reason)`` for
        each reason, or nothing."""
        by_summary: dict[str, list[str]] = {}
        for n in self.refused:
            by_summary.setdefault(n.summary, []).append(n.module)
        return "".join(
            f"; not stored by JAX, so compiled afresh every run: {', '.join(modules)} ({summary})"
            for summary, modules in by_summary.items()
        )


def _recompile(n: int) -> str:
    return "recompiles" if n == 1 else "recompile"


def module_of_key(key: str) -> str:
    parsed = listdir.parse_key(key)
    return (parsed[1] if parsed else None) or "(unnamed)"


def _short(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[: limit - 1] + "…")
