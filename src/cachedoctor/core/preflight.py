"""Will this cache hit here: each entry's recorded key set against what JAX would hash in this
environment, before the program runs.

Six components of JAX's key do not depend on the program (``stablekeys/here.py`` computes them
here with JAX's own code), and part of a seventh does: the compile options' debug options (from
XLA_FLAGS and the cache directory's spelling) and effort levels. An entry whose recorded key
(a stats record's missed key that was then written, or a key manifest) differs from this
environment in one of them will miss, whatever the program: that is the evidence a "miss"
names. Where they all agree, the same program hits ("hit"), unless a JAX setting that changes
the program JAX lowers differs: then it is "unknown", since whether the program changes depends
on the program (x64 left a float32 program as it was and changed no key; matmul precision
changes every key with a dot). An entry without a recorded key is "unknown", save where its
own bytes prove a miss: another platform, another jaxlib's compile options, more devices than
this machine has, or the cache directory spelled otherwise in options this JAX hashes.
"""

from __future__ import annotations

import base64
import functools
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.recorded_keys import (
    WRITTEN_IN,
    Evidence,
    evidence_from_manifests,
    evidence_from_records,
)
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.core.why import ENABLE_HINT, short, value_words
from cachedoctor.core.why import Change as Difference  # one thing that differs, in words
from cachedoctor.layout import CACHE_SUFFIX
from cachedoctor.stablekeys import here as here_mod
from cachedoctor.stablekeys import settings as hook_settings
from cachedoctor.stablekeys.keys import CACHE_DIR_PLACEHOLDER
from cachedoctor.storage.location import Location

# The components of JAX's key that do not depend on the program (jax/_src/cache_key.py), the
# likelier root cause first (as `why` orders them)
ENVIRONMENT = (
    "jax_lib version",
    "backend version",
    "XLA flags",
    "accelerator_config",
    "compression",
    "custom_hook",
)
# Compile options that JAX sets from the environment, not from the program (compiler.py's
# get_compile_options): every debug option but xla_detailed_logging (set by the program's size)
_DEBUG = "executable_build_options.debug_options."
_ENV_OPTIONS = frozenset(
    {
        "profile_version",
        "executable_build_options.use_shardy_partitioner",
        "executable_build_options.exec_time_optimization_effort",
        "executable_build_options.memory_fitting_effort",
        "executable_build_options.optimization_level",
        "executable_build_options.memory_fitting_level",
    }
)
_PROGRAM_DEBUG_OPTIONS = frozenset({_DEBUG + "xla_detailed_logging"})
# debug options derived from the cache directory: the stable hook keys them by their last part
_CACHE_PATH_OPTIONS = frozenset(
    {
        _DEBUG + "xla_gpu_per_fusion_autotune_cache_dir",
        _DEBUG + "xla_gpu_kernel_cache_file",
        _DEBUG + "xla_gpu_experimental_autotuner_cache_dir",
    }
)
VERDICTS = ("hit", "miss", "unknown")
# with this JAX setting on, the computation JAX hashes keeps its source locations
METADATA_IN_KEY = "jax_compilation_cache_include_metadata_in_key"
# JAX lowers dots and convolutions under it; a program without them is the same program
PRECISION = "jax_default_matmul_precision"


@dataclass(frozen=True)
class EntryForecast:
    key: str
    module: str
    verdict: str  # VERDICTS
    words: str
    evidence: str | None  # what the verdict rests on
    differences: tuple[Difference, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["differences"] = [asdict(d) for d in self.differences]
        return doc


@dataclass(frozen=True)
class ModuleForecast:
    module: str
    verdict: str
    entries: int
    hits: int
    words: str


@dataclass
class PreflightReport:
    where: str
    cache_dir: str  # the spelling JAX will be given here
    here: dict[str, Any] | None
    hook: str  # the hook mode a process of this environment runs in ("off": none)
    entries: list[EntryForecast] = field(default_factory=list)
    modules: list[ModuleForecast] = field(default_factory=list)
    problem: str | None = None  # why nothing could be predicted (JAX missing or unknown)
    strict: bool = False  # "cannot tell" fails too

    def counts(self) -> dict[str, int]:
        return {v: sum(1 for m in self.modules if m.verdict == v) for v in VERDICTS}

    def failing(self) -> int:
        """The modules that fail a CI gate: those that will miss (and, strict, unknown ones)."""
        counts = self.counts()
        return counts["miss"] + (counts["unknown"] if self.strict else 0)

    def needs_records(self) -> bool:
        """Whether recording would tell more: a module it cannot tell holds an entry of no
        recorded key (one it cannot tell for a reason a record gave needs no more records)."""
        unknown = {m.module for m in self.modules if m.verdict == "unknown"}
        return any(
            e.verdict == "unknown" and e.evidence is None and e.module in unknown
            for e in self.entries
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "where": self.where,
            "cache_dir": self.cache_dir,
            "here": self.here,
            "hook": self.hook,
            "counts": self.counts(),
            "modules": [asdict(m) for m in self.modules],
            "entries": [e.to_dict() for e in self.entries],
            "problem": self.problem,
            "strict": self.strict,
            "hint": ENABLE_HINT if self.needs_records() else None,
        }


def _text(values: Iterable[str] | None) -> str | None:
    return None if values is None else " ".join(values)


def _devices_of(ev: Evidence) -> int | None:
    count = (ev.devices or {}).get("count")
    return count if isinstance(count, int) and count > 0 else None


def _component_words(name: str, before: tuple[str, ...] | None, after: list[str] | None) -> str:
    said = value_words(name, before, after)
    if said is not None:
        return said
    if name == "accelerator_config":
        return "the accelerator topology differs"
    return f"{name} differs"


def _option_differences(
    before: tuple[str, ...] | None,
    after: list[str] | None,
    kind: str,
    rekeyable: bool = False,
    written_in: str | None = None,
) -> list[str] | None:
    """The environment's compile options that differ (``path a → b``); None: not comparable.
    ``rekeyable``: the entry has an observe-mode manifest in a local cache, so ``rekey
    --relocated`` can move it to its stable key (no other entry can be re-keyed offline)."""
    from cachedoctor.formats import wire
    from cachedoctor.xla import optiondiff, optionschema

    if (
        not before
        or not after
        or not before[0].startswith("b64:")
        or not after[0].startswith("b64:")
    ):
        return None
    try:
        diffs = optiondiff.diff_messages(
            base64.b64decode(before[0][4:]),
            base64.b64decode(after[0][4:]),
            optionschema.COMPILE_OPTIONS,
        )
    except (ValueError, wire.WireError):
        return None
    said = []
    for d in diffs:
        environmental = d.path in _ENV_OPTIONS or (
            d.path.startswith(_DEBUG) and d.path not in _PROGRAM_DEBUG_OPTIONS
        )
        if not environmental or (kind == "stable" and d.path in _CACHE_PATH_OPTIONS):
            continue
        name = d.path.removeprefix(_DEBUG)
        if d.path in _CACHE_PATH_OPTIONS and d.a and d.b:
            was = _as_written(_unquoted(d.a), written_in)
            if was is None or was == _unquoted(d.b):
                continue  # spelled as JAX spells it here, or no spelling kept to compare
            then, now = os.path.dirname(was), os.path.dirname(_unquoted(d.b))
            rekey = (
                "; its observe-mode manifest lets `cachedoctor rekey --relocated --apply` move it"
                " to its stable key, which the hook in stable mode (`cachedoctor enable`) hits"
                " wherever the cache is"
                if rekeyable
                else ""
            )
            said.append(
                f"the cache dir is spelled {now} here, {then} when written (JAX hashes `{name}`"
                f" under it{rekey})"
            )
            continue
        said.append(f"`{name}` {short(d.a)} → {short(d.b)}")
    return said


def _as_written(value: str, written_in: str | None) -> str | None:
    """A recorded path option as JAX spelled it when the entry was written: an observe-mode
    manifest keeps the stable hasher's form, the cache dir as :data:`CACHE_DIR_PLACEHOLDER`,
    and beside it the cache dir's spelling then (``written_in``). None: no spelling kept."""
    if CACHE_DIR_PLACEHOLDER not in value:
        return value
    if not written_in:
        return None
    return value.replace(CACHE_DIR_PLACEHOLDER, written_in.rstrip("/"), 1)


def _unquoted(value: str) -> str:
    return value[1:-1] if len(value) > 1 and value[0] == value[-1] == '"' else value


def _settings_differences(ev: Evidence, here: here_mod.Here) -> list[Difference]:
    if ev.settings is None:
        return []
    out = []
    for name, value in ev.settings.items():
        if name in here.settings and here.settings[name] != value:
            words = f"`{name}` {value!r} → {here.settings[name]!r}: JAX lowers the program under it"
            out.append(Difference("computation", words, repr(value), repr(here.settings[name])))
    return out


def _devices_difference(ev: Evidence, here: here_mod.Here) -> Difference | None:
    count, kinds = _devices_of(ev), (ev.devices or {}).get("kinds")
    if count is None:
        return None
    said_kinds = "/".join(kinds or ())
    if count > here.device_count:
        words = (
            f"written for {count} {said_kinds} devices; JAX sees {here.device_count} here"
            " (XLA_FLAGS --xla_force_host_platform_device_count on CPU)"
        )
        return Difference("accelerator_config", words, str(count), str(here.device_count))
    if kinds and sorted(kinds) != here.device_kinds:
        words = f"written for {said_kinds} devices; here {'/'.join(here.device_kinds)}"
        return Difference("accelerator_config", words, said_kinds, "/".join(here.device_kinds))
    return None


def _read_instead(
    key: str, module: str, ev: Evidence, hook: str, held: set[str]
) -> EntryForecast | None:
    """An entry JAX stored under its own key, judged for the hook in stable mode, whose stable
    key the cache also holds: the hook looks up that key, finds it, and never reads this one
    (it re-keys JAX's entry only where its stable key holds none). None when that is not so."""
    if hook != "stable" or ev.kind != "jax" or ev.stable_key is None:
        return None
    if ev.stable_key not in held:
        return None
    words = (
        f"the hook in stable mode looks up this program's stable key {ev.stable_key[:16]}…,"
        " which the cache holds: it reads that entry, never this one"
    )
    evidence = f"{ev.source} ({ev.kind} key, stable key {ev.stable_key})"
    return EntryForecast(key, module, "miss", words, evidence, (Difference("hook", words),))


def _forecast(
    key: str,
    module: str,
    ev: Evidence,
    here: here_mod.Here,
    hook: str,
    program: Callable[[], str | None] = lambda: None,
    rekeyable: bool = False,
) -> EntryForecast:
    """An entry with a recorded key: each component of this environment against it.
    ``program``: why the entry's stored program shows no op the matmul precision changes, or
    None (then a precision that differs is "cannot tell"); ``rekeyable``: ``rekey
    --relocated`` can move it (``_option_differences``)."""
    evidence = f"{ev.source} ({ev.kind} key)"
    if ev.kind == "stable" and hook != "stable":
        words = (
            "stored under the stable hook's key, and processes here run "
            + ("no hook" if hook == "off" else f"the hook in {hook} mode")
            + ": JAX looks up its own key (`cachedoctor enable`)"
        )
        return EntryForecast(key, module, "miss", words, evidence, (Difference("hook", words),))
    found = _devices_difference(ev, here)
    if found is not None:
        return EntryForecast(key, module, "miss", found.words, evidence, (found,))
    count = _devices_of(ev)
    candidates = [here.keys[count]] if count in here.keys else list(here.keys.values())
    mine = next(
        (
            k
            for k in candidates
            if k.components.get("accelerator_config") == ev.components.get("accelerator_config")
        ),
        candidates[0] if candidates else None,
    )
    if mine is None:
        return EntryForecast(key, module, "unknown", "no device here to compare", evidence)
    differences, options = _environment_differences(ev, mine, rekeyable)
    if differences:
        return EntryForecast(
            key,
            module,
            "miss",
            "; ".join(d.words for d in differences),
            evidence,
            tuple(differences),
        )
    settings, moot = _settings_differences(ev, here), None
    if settings and all(d.words.startswith(f"`{PRECISION}`") for d in settings):
        moot = program()  # why the precision that differs cannot change this program, or None
        settings = settings if moot is None else []
    if settings:
        words = "cannot tell: " + "; ".join(d.words for d in settings)
        words += ": a miss if that changes the program (float64 defaults, dot precision)"
        return EntryForecast(key, module, "unknown", words, evidence, tuple(settings))
    if options is None:
        words = (
            "the environment's components match, but the record kept no compile options to compare"
        )
        return EntryForecast(key, module, "unknown", words, evidence)
    metadata = METADATA_IN_KEY
    if here.settings.get(metadata) or (ev.settings or {}).get(metadata):
        words = (
            f"cannot tell: `{metadata}` is on, so the key holds the program's source lines and"
            " paths, which a preflight does not see (a moved line is a miss)"
        )
        return EntryForecast(key, module, "unknown", words, evidence)
    words = (
        f"every component JAX takes from the environment is as the {ev.source} shows"
        " (for the same program)"
    )
    if moot is not None:
        words += f"; `{PRECISION}` differs, but {moot}"
    return EntryForecast(key, module, "hit", words, evidence)


def _environment_differences(
    ev: Evidence, mine: here_mod.HereKey, rekeyable: bool
) -> tuple[list[Difference], list[str] | None]:
    """The components JAX takes from the environment that differ between the recorded key and
    this environment's, and the compile options that differ (None: the record kept none)."""
    differences = []
    for name in ENVIRONMENT:
        theirs, ours = ev.components.get(name), mine.components.get(name)
        if theirs is not None and ours is not None and theirs != ours:
            before, after = ev.values.get(name), mine.values.get(name)
            differences.append(
                Difference(name, _component_words(name, before, after), _text(before), _text(after))
            )
    written_in = ev.values.get(WRITTEN_IN, (None,))[0]
    options = _option_differences(
        ev.values.get("compile_options"),
        mine.values.get("compile_options"),
        ev.kind,
        rekeyable,
        written_in,
    )
    if options:
        words = "; ".join(("compile option " + o if o.startswith("`") else o) for o in options[:4])
        differences.append(
            Difference(
                "compile_options",
                words + (f" (and {len(options) - 4} more)" if len(options) > 4 else ""),
            )
        )
    return differences, options


def _precision_free(where: Location, entry: EntryInfo) -> str | None:
    """Why the matmul precision cannot change ``entry``'s program, in words, or None: its
    stored program (libtpu's module before optimisation where the entry keeps it) has no op
    the precision reaches (``xla/hlo.precision_op``). None too when it cannot be read."""
    from cachedoctor.cache import reader
    from cachedoctor.cache.model import EntryDetail
    from cachedoctor.formats import wire
    from cachedoctor.xla.hlo import precision_op

    name = entry.key + CACHE_SUFFIX
    try:
        store = where.store()
        with store.open_read(name) as fh:
            detail = reader.decode_entry(
                store.url_of(name), key=entry.key, detail=True, fileobj=fh, size=entry.size
            )
        assert isinstance(detail, EntryDetail)
        module = detail.original_module or detail.hlo_module
        if detail.info.problems or module is None or precision_op(module) is not None:
            return None
    except (OSError, ValueError, wire.WireError):
        return None
    return (
        "its stored program has no dot, convolution or custom call, and no instruction JAX "
        "named for one (XLA keeps the name on what it rewrites them into): the precision "
        "changes none of it"
    )


def _module(entry: EntryInfo) -> str:
    return entry.module or entry.key.rsplit("-", 1)[0]


def _miss(entry: EntryInfo, evidence: str, difference: Difference) -> EntryForecast:
    """A miss its own bytes prove, with the one difference that proves it."""
    words = difference.words
    return EntryForecast(entry.key, _module(entry), "miss", words, evidence, (difference,))


def _from_bytes(
    entry: EntryInfo, here: here_mod.Here, hashes: Mapping[str, bool | None]
) -> EntryForecast:
    """An entry without a recorded key: a miss only where its own bytes prove one."""
    from cachedoctor.xla.optionschema import undefined_debug_fields

    said = "its own bytes"
    if entry.platform not in ("unknown", here.platform):
        words = f"an executable for {entry.platform}; JAX runs on {here.platform} here"
        return _miss(
            entry, said, Difference("backend version", words, entry.platform, here.platform)
        )
    other = undefined_debug_fields(entry.debug_fields)
    if other and other[0]:
        words = (
            f"written by another jaxlib: its compile options set {len(other[0])} DebugOptions"
            f" field{'s' if len(other[0]) != 1 else ''} jaxlib {here.jaxlib} does not define"
        )
        return _miss(entry, said, Difference("jax_lib version", words, None, here.jaxlib))
    used = (entry.num_replicas or 1) * (entry.num_partitions or 1)
    if entry.num_partitions is not None and used > here.device_count:
        words = f"compiled for {used} devices; JAX sees {here.device_count} here"
        return _miss(
            entry, said, Difference("compile_options", words, str(used), str(here.device_count))
        )
    for name, value, hashed in (
        ("xla_gpu_per_fusion_autotune_cache_dir", entry.autotune_dir, hashes.get("autotune")),
        ("xla_gpu_kernel_cache_file", entry.kernel_cache_file, hashes.get("kernel")),
    ):
        expected = hashes.get(name)
        if hashed and value and isinstance(expected, str) and value != expected:
            words = f"compile option `{name}` {value} → {expected}"
            words += ": the cache dir is spelled otherwise here"
            return _miss(entry, said, Difference("compile_options", words, value, expected))
    words = "no record of its key's components: cannot tell"
    return EntryForecast(entry.key, _module(entry), "unknown", words, None)


def _here_paths(here: here_mod.Here) -> dict[str, str]:
    """The cache-dir-derived debug options JAX would set here (decoded from its options)."""
    from cachedoctor.formats import wire
    from cachedoctor.xla.compile_options import decode_compile_options

    for k in here.keys.values():
        values = k.values.get("compile_options")
        if values and values[0].startswith("b64:"):
            try:
                decoded = decode_compile_options(memoryview(base64.b64decode(values[0][4:])))
            except (ValueError, wire.WireError):
                return {}
            return {
                "xla_gpu_per_fusion_autotune_cache_dir": str(decoded.get("autotune_dir") or ""),
                "xla_gpu_kernel_cache_file": str(decoded.get("kernel_cache_file") or ""),
            }
    return {}


def _module_forecasts(entries: list[EntryForecast]) -> list[ModuleForecast]:
    by_module: dict[str, list[EntryForecast]] = {}
    for e in entries:
        by_module.setdefault(e.module, []).append(e)
    out = []
    for module, group in sorted(by_module.items()):
        verdicts = {e.verdict for e in group}
        hits = sum(1 for e in group if e.verdict == "hit")
        verdict = next(v for v in ("hit", "unknown", "miss") if v in verdicts)
        said = list(dict.fromkeys(e.words for e in group if e.verdict == verdict))
        words = " | ".join(said[:2]) + (f" (and {len(said) - 2} more)" if len(said) > 2 else "")
        if len(group) > 1 and verdict == "hit":
            words = f"{hits} of {len(group)} entries: {words}"
        out.append(ModuleForecast(module, verdict, len(group), hits, words))
    return out


def hook_here() -> str:
    """The hook mode a process of this environment runs in, "off" when none is enabled."""
    if not hook_settings.activates():
        return "off"
    try:
        return hook_settings.hook_mode(hook_settings.load(check=False))
    except Exception:
        return "off"


def predict(
    where: Location,
    *,
    cache_dir: str | None = None,
    here: here_mod.Here | None = None,
    module: str | None = None,
) -> PreflightReport:
    """Per entry and per module of ``where``: will JAX here hit it. ``cache_dir``: the spelling
    the job will give JAX (default: ``where`` as spelled). Raises OSError when ``where`` cannot
    be listed; JAX missing or unknown here is the report's ``problem``."""
    import fnmatch

    spelling = cache_dir or where.spelling
    manifests = evidence_from_manifests(where)
    evidence = {**manifests, **evidence_from_records(where)}  # as recorded_evidence
    # rekey --relocated moves an entry with an observe-mode manifest, in a local cache only
    observed = {k for k, ev in manifests.items() if ev.kind == "jax"}
    rekeyable = observed if where.can_rename else set()
    hook = hook_here()
    report = PreflightReport(where.spelling, spelling, None, hook)
    counts = {c for ev in evidence.values() if (c := _devices_of(ev))}
    try:  # first: JAX must read the job's XLA_FLAGS before anything else starts XLA
        if here is None:
            here = here_mod.probe(spelling, counts | {1})
    except here_mod.ProbeError as exc:
        report.problem = str(exc)
        return report
    report.here = here.to_dict()
    scan = scan_directory(where, all_tiers=False)
    entries = [
        e
        for e in scan.loaded_entries()[0]
        if module is None or fnmatch.fnmatchcase(e.module or "", module)
    ]
    hashes: dict[str, Any] = {
        "autotune": scan.jax.hashes_autotune_dir,
        "kernel": scan.jax.hashes_kernel_cache_file,
        **_here_paths(here),
    }
    held = {e.key for e in scan.loaded_entries()[0]}
    for entry in sorted(entries, key=lambda e: (e.module or "", e.key)):
        ev = evidence.get(entry.key)
        mod = _module(entry)
        if ev is None:
            report.entries.append(_from_bytes(entry, here, hashes))
        elif (unread := _read_instead(entry.key, mod, ev, hook, held)) is not None:
            report.entries.append(unread)
        else:
            program = functools.partial(_precision_free, where, entry)
            moves = entry.key in rekeyable
            report.entries.append(_forecast(entry.key, mod, ev, here, hook, program, moves))
    report.modules = _module_forecasts(report.entries)
    return report
