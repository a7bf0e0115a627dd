"""What ``check`` found: each run, the modules whose key is unstable, --verify's mismatches."""

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
    # processes > 0 of a jax.distributed job whose keys differ from process 0's only in what
    # JAX hashes per process (the manifests' components): (module, process, fields)
    per_process: tuple[tuple[str, int, tuple[str, ...]], ...] = ()

    @property
    def compiled_in_run1(self) -> tuple[str, ...]:
        """Modules run 1 wrote entries for: the only ones this check can vouch for."""
        return tuple(sorted({module_of_key(k) for k in self.runs[0].new_keys})) if self.runs else ()

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
                f"{count(len(self.verify.not_checked), 'module')} "
                f"{'was' if len(self.verify.not_checked) == 1 else 'were'} not checked: "
                + ", ".join(self.verify.not_checked)
                + " (run without --verify, or with more --runs, to check them)"
            )
        if self.not_stored:
            head += (
                f"; {count(len(self.not_stored), 'module')} recompile every run because JAX never "
                f"stores modules with host callbacks: {', '.join(self.not_stored)}"
            )
        if self.per_process:
            modules = sorted({m for m, _, _ in self.per_process})
            fields = sorted({f for _, _, fs in self.per_process for f in fs})
            head += (
                f"; {count(len(modules), 'module')} recompile every run in processes > 0 of a "
                f"jax.distributed job, whose keys differ from process 0's only in "
                f"{', '.join(fields)} (JAX hashes it per process and writes only from process "
                f"0): {', '.join(modules)}"
            )
        if self.verify and self.verify.stale:
            head += f"; {len(self.verify.stale)} stale entries (--verify)"
        elif self.verify and self.verify.mismatches:
            head += "; --verify could not check every module (nondeterministic compilation)"
        return f"cachedoctor check: {head}"


def module_of_key(key: str) -> str:
    parsed = listdir.parse_key(key)
    return (parsed[1] if parsed else None) or "(unnamed)"


def _short(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[: limit - 1] + "…")
