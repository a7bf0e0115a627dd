"""The words of every finding: each finding kind's cases (when, severity, evidence, advice).

The rules of scan, stats and the stats records make their findings from these cases
(``catalog.CORRUPT.finding(message, ...)``): the table holds the fixed words, the rule the data
(a message names the module or the file; ``{fields}`` of evidence and advice are filled in).

The catalog is split where its readers split: this module holds what the code raising findings
imports (every rule, the stats records' reader); ``core/catalog_entries.py`` holds the table of
kinds (one ``CatalogEntry`` each: summary, what, why, its cases from here, an example, what
raises it), which docs/findings.md is generated from and no rule reads.
"""

from __future__ import annotations

from cachedoctor.core.findings import Case, FindingKind, Severity
from cachedoctor.layout import STATS_DIRNAME

K = FindingKind

# --- keys --------------------------------------------------------------------------------------

UNSTABLE_KEY = Case(
    K.UNSTABLE_KEY,
    when="one program is stored under several keys, and its stored HLO shows a key input that "
    "changes from run to run",
    severity=Severity.WARNING,
    evidence="stored HLO of {entry}, {where}: {detail}; of the {count} entries: {by_manifest}",
    advice="{hooked}a run whose key hashes that input (plain JAX without "
    "jax_remove_custom_partitioning_ptr_from_cache_key) writes a new key each run and never hits "
    "it; `cachedoctor prune --duplicates` lists the copies that records show no run looks up "
    "again; run `cachedoctor diff --module {module}` to see the input, `cachedoctor enable` to "
    "give every run one key",
)
KERNEL_LOCATIONS = Case(
    K.KERNEL_LOCATIONS,
    when="a module's entries hold Pallas TPU kernels that are equal once their debug "
    "information is stripped, in modules equal but for those kernels",
    severity=Severity.WARNING,
    evidence="each entry's Mosaic body read with jaxlib's MLIR: equal with its debug "
    "information stripped (as jax 0.11 strips it before hashing; stripped sha256 {stripped}), "
    "and each module's program digest with the kernel bodies masked is the same; the bodies' "
    "debug locations: {where}",
    advice="JAX {jax} {hashes} a kernel's source path and line numbers into the key, so the same "
    "kernel run from another folder (a CI runner's workspace, another checkout), or a line lower, "
    "compiles again and writes another entry; `cachedoctor enable` strips them as jax 0.11 does "
    "(one key for all of these), `cachedoctor diff --module {module}` shows the move",
)
SAME_PROGRAM = Case(
    K.SAME_PROGRAM,
    when="one program is stored under several keys, and nothing stored shows a key input that "
    "changes between runs",
    severity=Severity.INFO,
    evidence="{how} (program digest); nothing stored shows a key input that changes between "
    "runs, so this is not evidence of an unstable key",
    advice="usually harmless: JAX hashes the module before optimisation, so inputs that optimise "
    "to one program (a result name, a no-op convert, a static argument) get keys of their own, "
    "each hit run after run; `cachedoctor diff --module {module}` shows what differs",
)
RELOCATED = Case(
    K.RELOCATED,
    when="entries store a sub-cache path that is not the one JAX builds from the cache dir as "
    "cachedoctor was given it, for an option JAX hashes into the key, and none of them can be "
    "re-keyed (no key manifest of the hook in observe mode, or a bucket)",
    severity=Severity.WARNING,
    evidence="compile options stored in each entry name {option} under {elsewhere}; judged for "
    "the cache dir spelled {spelled} (as cachedoctor was given it), for which JAX builds "
    "{builds}: JAX hashes the path as spelled, not the directory it names, so a relative, `..` "
    "or symbolic-link spelling of one directory is another key; {hashed}; no stable-key "
    "manifest (cachedoctor enable) covers these keys",
    advice="JAX hits them only in runs that spell the cache dir {stored}: if yours do, scan it "
    "so (`cachedoctor scan {stored}`); else run JAX with JAX_COMPILATION_CACHE_DIR={stored} to "
    "use them, or let JAX recompile and free the space with "
    "`cachedoctor prune --relocated --apply`; `cachedoctor enable` makes new entries "
    "independent of the cache's path",
)
# Only where `rekey --relocated` can move some of them: a local cache, entries with a manifest
# of the hook's observe mode (it records the stable key's components); none else is re-keyed.
RELOCATED_REKEYABLE = Case(
    K.RELOCATED,
    when="as above, but some of these entries carry a key manifest of the hook in observe mode, "
    "in a local cache",
    severity=Severity.WARNING,
    evidence=RELOCATED.evidence + "; {observed} of them carry a key manifest of the hook in "
    "observe mode",
    advice="JAX hits them only in runs that spell the cache dir {stored}: if yours do, scan it "
    "so (`cachedoctor scan {stored}`); else run JAX with JAX_COMPILATION_CACHE_DIR={stored} to "
    "use them, or let JAX recompile and free the space with "
    "`cachedoctor prune --relocated --apply`; the {observed} with an observe-mode manifest can "
    "instead move to their stable key, which does not hash the cache's path: "
    "`cachedoctor rekey --relocated --apply`, then `cachedoctor enable` (the others cannot be "
    "re-keyed: their key needs the module); `cachedoctor enable` makes new entries independent "
    "of the cache's path",
)

# --- integrity ---------------------------------------------------------------------------------

MISSING_ATIME_LOCKED = Case(
    K.MISSING_ATIME,
    when="entries lack their -atime file and JAX's .lockfile is there",
    severity=Severity.ERROR,
    evidence="the listing: -cache files without -atime, and JAX's .lockfile",
    advice="run `cachedoctor prune --repair --apply` to recreate the -atime files",
)
MISSING_ATIME_UNLOCKED = Case(
    K.MISSING_ATIME,
    when="entries lack their -atime file, other entries have one, and there is no .lockfile",
    severity=Severity.WARNING,
    evidence="the listing: -atime files beside other entries, none beside these, no .lockfile",
    advice=MISSING_ATIME_LOCKED.advice,
)
MISSING_ATIME_EVICTED_FIRST = Case(
    K.MISSING_ATIME,
    when="entries lack their -atime file under JAX's LRU, and the installed JAX's eviction pass "
    "takes such an entry as the least recently used (0.12) instead of failing on it (0.10)",
    severity=Severity.WARNING,
    evidence="the listing: -cache files without -atime, and JAX's .lockfile or -atime files "
    "beside other entries; the installed JAX {jax}'s lru_cache.py checks that an -atime file "
    "exists before it reads one",
    advice="JAX evicts these first whatever their use; `cachedoctor prune --repair --apply` "
    "recreates the -atime files",
)
ORPHAN_ATIME = Case(
    K.ORPHAN,
    when="-atime files have no entry",
    severity=Severity.INFO,
    evidence="the directory listing: no -cache file of the same key",
    advice="harmless; `cachedoctor prune --orphans --apply` removes them",
)
ORPHAN_TEMP = Case(
    K.ORPHAN,
    when="temporary files of JAX's writers are left",
    severity=Severity.INFO,
    evidence="the directory listing: temporary file names of JAX's writers",
    advice="left by interrupted writers; `cachedoctor prune --orphans --apply`",
)
CORRUPT = Case(
    K.CORRUPT,
    when="an entry does not decode, where JAX's own load fails too: the zstd frame does not "
    "decode whole, or a message JAX parses does not parse",
    severity=Severity.ERROR,
    otherwise=((Severity.WARNING, "written under a minute ago: it may be a write in progress"),),
    evidence="decoding the file: {problem}",
    advice="JAX fails to load this entry and recompiles, and never replaces it (its write "
    "returns when the file exists), so every later run warns and compiles again; "
    "`cachedoctor prune --corrupt --apply` removes it",
)
CORRUPT_BY_JAX = Case(
    K.CORRUPT,
    when="JAX's own load of an entry failed (a stats record kept its error, one that damaged "
    "bytes give), on the very file that is there now, whole when read, and no run has hit it "
    "since: damage only JAX's parser sees",
    severity=Severity.ERROR,
    evidence="{problem}",
    advice="JAX fails to load this entry and recompiles, and never replaces it (its write "
    "returns when the file exists), so every later run warns and compiles again; "
    "`cachedoctor prune --corrupt --apply` removes it",
)
UNKNOWN_LAYOUT = Case(
    K.UNKNOWN_LAYOUT,
    when="an entry decompresses whole and opens with JAX's pjrt_ifrt header, but what follows "
    "is in a layout cachedoctor does not know (a newer libtpu or jaxlib, another PJRT plugin)",
    severity=Severity.INFO,
    evidence="decoding the file: {problem}",
    advice="no verdict: cachedoctor cannot tell whether JAX loads it, so no command removes, "
    "rewrites or leaves it out; JAX's own log says whether it hits "
    "(JAX_EXPLAIN_CACHE_MISSES=1)",
)
UNREADABLE = Case(
    K.UNREADABLE,
    when="cachedoctor cannot read an entry whole (its permissions or owner; over the decode cap)",
    severity=Severity.WARNING,
    evidence="the reader could not read the bytes ({problem})",
    advice="cachedoctor could not read its bytes, so it says nothing about them and never removes "
    "it; fix its permissions (or owner) to have it checked",
)

# --- security ----------------------------------------------------------------------------------

INSECURE_DIRECTORY_MODE = Case(
    K.INSECURE,
    when="the cache directory is writable by group or others (and not sticky)",
    severity=Severity.ERROR,
    evidence="the directory's mode {mode}",
    advice="whoever can write the cache can run code in your JAX processes; `chmod go-w {root}`",
)
INSECURE_DIRECTORY_OWNER = Case(
    K.INSECURE,
    when="the cache directory is owned by another user",
    severity=Severity.ERROR,
    evidence="the directory's owner (lstat)",
    advice="use a cache directory you own, or make sure its owner is trusted",
)
INSECURE_ENTRY_MODE = Case(
    K.INSECURE,
    when="entries are writable by group or others",
    severity=Severity.ERROR,
    evidence="the entries' modes (lstat)",
    advice="`cachedoctor prune --repair --apply` removes group/other write bits",
)
INSECURE_ENTRY_OWNER = Case(
    K.INSECURE,
    when="entries are owned by another user",
    severity=Severity.ERROR,
    evidence="the entries' owners (lstat)",
    advice="another user's entries run in your process: remove them or trust that user",
)
INSECURE_SYMLINK = Case(
    K.INSECURE,
    when="the cache directory holds symbolic links",
    severity=Severity.WARNING,
    evidence="the directory listing (lstat)",
    advice="a link can make JAX load or overwrite a file outside the cache; remove it",
)

# --- inventory ---------------------------------------------------------------------------------

MIXED_VERSIONS = Case(
    K.MIXED_VERSIONS,
    when="sound entries are in more than one JAX format",
    severity=Severity.INFO,
    evidence="each entry's payload layout (decoded)",
    advice="entries from other JAX versions never hit after an upgrade; "
    "`cachedoctor prune --stale-jax` lists them",
)
OTHER_JAXLIB = Case(
    K.MIXED_VERSIONS,
    when="entries written for a cache at another path set DebugOptions fields the installed "
    "jaxlib does not define: another jaxlib wrote them, which is why JAX misses them (not "
    "relocated)",
    severity=Severity.INFO,
    evidence="the compile options stored in each entry: JAX stores every DebugOptions default "
    "of the jaxlib that compiled it, and {jaxlib} defines none of fields {fields}; XLA never "
    "reuses a removed field's number",
    advice="they hit only under the jaxlib that wrote them, whatever the cache's path; "
    "`cachedoctor prune --stale-jax --apply` removes them",
)
MIXED_PLATFORMS = Case(
    K.MIXED_PLATFORMS,
    when="sound entries are for more than one platform",
    severity=Severity.INFO,
    evidence="each entry's executable (decoded)",
    advice="fine for a shared cache; size budgets count all of them",
)
UNKNOWN_FILE = Case(
    K.UNKNOWN_FILE,
    when="files are named as JAX never names its files",
    severity=Severity.INFO,
    evidence="the directory listing: names JAX never writes",
    advice="cachedoctor never touches them; move them out if they do not belong here",
)
SUBCACHE_AUTOTUNE = Case(
    K.SUBCACHE,
    when="the autotune sub-cache has problems (files that do not parse, several GPU models, "
    "leftovers in tmp/, files XLA does not name so)",
    severity=Severity.WARNING,
    evidence="the autotune sub-cache's files, read and parsed",
    advice="{what_clears_it}",
)
SUBCACHE_KERNEL = Case(
    K.SUBCACHE,
    when="the kernel cache file does not parse",
    severity=Severity.ERROR,
    otherwise=(
        (
            Severity.WARNING,
            "the kernel cache file parses but is empty, repeats a kernel name or holds more "
            "entries than are read",
        ),
    ),
    evidence="the kernel cache file, read and parsed",
    advice="XLA cannot reuse a damaged kernel cache; "
    "`cachedoctor prune --xla-subcaches --apply` removes it",
)
NOT_STORED = Case(
    K.NOT_STORED,
    when="key manifests of modules have no entry beside them; one finding per reason",
    severity=Severity.INFO,
    evidence="key manifests (cachedoctor enable) without an entry of the same key; "
    "{each_modules_evidence}",
    advice="{the_reasons_advice}",
)

# What JAX's LRU eviction pass costs per entry the cache holds, in µs: the low and the high end
# of what benchmarks/bench_lru_write.py measured (benchmarks/results/lru-write-*.json,
# docs/performance.md) on a 2-core ext4 machine with a warm page cache. Least-squares slopes over
# 1k, 10k and 50k entries: 21 µs (jax 0.4.38), 23 µs (0.10.2 with the standard pathlib), 28 µs
# (0.12.0.1), 41 µs (0.10.2 with etils installed: its stat looks up each file's owner and group).
# A model of the cost, quoted as such: never a measurement of the machine being scanned.
LRU_PASS_US_PER_ENTRY = (20, 40)
# When `lru-write-cost` is raised, by the model's low end, in µs per write: info from 0.1 s
# (5,000 entries at 20 µs), a tenth of JAX's default jax_persistent_cache_min_compile_time_secs
# (1 s), the cheapest compile JAX stores by default: from there the pass adds 10 % or more to
# each write, and holds the .lockfile that long, which other processes' hits wait on. The
# benchmark put 1,000 entries at 19 to 51 ms per write and 10,000 at 179 to 359 ms;
# uwplasma/vmex (PR #254) measured 304 ms at 10,880 entries and capped its cache for it. A
# warning from 1 s (50,000 entries): the pass alone then costs as much as that cheapest compile,
# and a tenth of the 10 s JAX's lock waits before it gives up.
LRU_WRITE_COST_FROM_US = (100_000, 1_000_000)

LRU_WRITE_COST = Case(
    K.LRU_WRITE_COST,
    when="JAX's LRU eviction is in use (its .lockfile, or -atime files beside entries) and the "
    f"entry count makes each write pay {LRU_WRITE_COST_FROM_US[0] / 1e6:g} s or more by the "
    "measured model",
    severity=Severity.INFO,
    otherwise=(
        (
            Severity.WARNING,
            f"the model gives {LRU_WRITE_COST_FROM_US[1] / 1e6:g} s or more per write and "
            "JAX's .lockfile shows eviction ran in this folder",
        ),
    ),
    evidence="the listing: {held} -cache names, {lru}; the model, not a measurement of "
    "this machine: every JAX write with jax_compilation_cache_max_size set first runs its "
    "eviction pass (lru_cache.py `_evict_if_needed`: glob every -cache file, stat it, read its "
    "-atime file) under the .lockfile, measured at "
    f"{LRU_PASS_US_PER_ENTRY[0]}–{LRU_PASS_US_PER_ENTRY[1]} µs per entry held by "
    "benchmarks/bench_lru_write.py on a 2-core ext4 machine with a warm page cache (jax 0.4.38 "
    f"to 0.12.0.1; {LRU_PASS_US_PER_ENTRY[1]} µs is jax 0.10.2 with etils installed); a cold "
    "page cache, a slower disk or a network filesystem pays more",
    advice="run `cachedoctor prune --max-size {size} --apply` in a scheduled job (cron, a CI "
    "schedule) to hold about {target} entries of this cache's mean size ({mean}), where a write "
    "pays about {target_cost}; what it removes recompiles when next used, so size it by what "
    "your runs use (`cachedoctor stats`)",
)

# --- processes ---------------------------------------------------------------------------------

MULTI_PROCESS_AUTOTUNE = Case(
    K.MULTI_PROCESS,
    when="a process other than 0 compiled with the autotune sub-cache in UPDATE mode",
    severity=Severity.WARNING,
    evidence="key manifests naming their process (process_index) and the autotune mode their "
    "compile options carried (autotune_mode)",
    advice="let `cachedoctor enable` set up the cache dir (it keeps JAX's roles when the "
    "sub-cache is moved off a bucket), or give processes > 0 "
    "--xla_gpu_experimental_autotune_cache_mode=read",
)
MULTI_PROCESS_KEYS = Case(
    K.MULTI_PROCESS,
    when="keys of processes > 0 differ from process 0's only in what JAX hashes per process",
    severity=Severity.INFO,
    evidence="key manifests of process 0 and of the other processes: every key component equal "
    "but those",
    advice="{what_jax_hashes_per_process}, and writes entries only from process 0: those "
    "processes recompile these modules on every run, with or without cachedoctor; nothing in "
    "the cache to fix",
)

# --- usage: the stats records ------------------------------------------------------------------

NEVER_HIT = Case(
    K.NEVER_HIT,
    when="a module asked the cache in several processes and never hit",
    severity=Severity.WARNING,
    evidence="stats records of {processes} processes: requests and no hit; {reason}: "
    "{reason_evidence}",
    advice="{the_reasons_advice}",
)
MISSED_KEY_CHANGED = Case(
    K.MISSED,
    when="a module missed with a key whose components differ from an earlier key of it",
    severity=Severity.INFO,
    evidence="stats records of the processes that missed: JAX's key components of each miss "
    "against the nearest earlier key ({components} differ)",
    advice="`cachedoctor why --module {module}` shows each miss; keep what changed the same "
    "across the runs that share this cache, or expect these compiles after it changes",
)
MISSED_ENTRY_GONE = Case(
    K.MISSED,
    when="a module missed a key an earlier process had written",
    severity=Severity.INFO,
    evidence="stats records: the key was written by an earlier process and missing when looked up",
    advice="removed since (JAX's LRU eviction with `jax_compilation_cache_max_size`, a prune): "
    "`cachedoctor stats` and `prune --dry-run` show what is evicted; raise the size limit if "
    "entries are evicted while still used",
)
STATS_RECORD_UNREADABLE = Case(
    K.STATS_RECORD,
    when="a record does not parse",
    severity=Severity.WARNING,
    evidence="the file does not parse as a stats record",
    advice="a torn file from a killed process or a file that is not cachedoctor's: inspect it; "
    "`cachedoctor stats --zero --apply` archives it with the records and removes it (a "
    "symbolic link it never follows: it leaves it where it is)",
)
STATS_RECORD_NO_ACCESS = Case(
    K.STATS_RECORD,
    when="a record cannot be opened or read (permissions, an I/O error): not torn, unread",
    severity=Severity.WARNING,
    evidence="the system's answer when cachedoctor opened or read it: {reason}",
    advice="{fix}; `stats --zero` cannot archive a record it cannot read",
)
STATS_RECORD_BROKEN = Case(
    K.STATS_RECORD,
    when="a record breaks a rule its recorder keeps",
    severity=Severity.WARNING,
    evidence="the record's numbers, checked against how the recorder counts them (docs/stats.md: "
    "hits plus misses at most requests; no negative count or time)",
    advice="the recorder never writes such a record: it was edited or written by another tool; "
    "inspect it; `cachedoctor stats --zero --apply` archives it with the records and removes it",
)
STATS_RECORD_FOREIGN = Case(
    K.STATS_RECORD,
    when="a file or folder is named neither as a record nor as an archive",
    severity=Severity.WARNING,
    evidence="the folder's listing: only records and the archives of `stats --zero` belong",
    advice="cachedoctor never reads it and `stats --zero` leaves it; move it out of "
    f"{STATS_DIRNAME}/ (prune's size bound on the folder may remove it)",
)
