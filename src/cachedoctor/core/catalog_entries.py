"""The catalog's table: one CatalogEntry per finding kind (family, summary, what it does, why it
matters, its cases, an example, what raises it).

docs/findings.md is generated from ENTRIES by ``python tools/check_docs.py --write``. The cases
(the words each finding is made of) are in ``core/catalog.py``, which the rules import; this
table is read by the docs and by the tests that bind each kind to the code raising it
(tests/core/test_catalog.py, tests/core/scan/test_registry.py), never by a rule.
"""

from __future__ import annotations

from cachedoctor.core.catalog import (
    CORRUPT,
    CORRUPT_BY_JAX,
    INSECURE_DIRECTORY_MODE,
    INSECURE_DIRECTORY_OWNER,
    INSECURE_ENTRY_MODE,
    INSECURE_ENTRY_OWNER,
    INSECURE_SYMLINK,
    KERNEL_LOCATIONS,
    LRU_PASS_US_PER_ENTRY,
    LRU_WRITE_COST,
    LRU_WRITE_COST_FROM_US,
    MISSED_ENTRY_GONE,
    MISSED_KEY_CHANGED,
    MISSING_ATIME_EVICTED_FIRST,
    MISSING_ATIME_LOCKED,
    MISSING_ATIME_UNLOCKED,
    MIXED_PLATFORMS,
    MIXED_VERSIONS,
    MULTI_PROCESS_AUTOTUNE,
    MULTI_PROCESS_KEYS,
    NEVER_HIT,
    NOT_STORED,
    ORPHAN_ATIME,
    ORPHAN_TEMP,
    OTHER_JAXLIB,
    RELOCATED,
    RELOCATED_REKEYABLE,
    SAME_PROGRAM,
    STATS_RECORD_BROKEN,
    STATS_RECORD_FOREIGN,
    STATS_RECORD_NO_ACCESS,
    STATS_RECORD_UNREADABLE,
    SUBCACHE_AUTOTUNE,
    SUBCACHE_KERNEL,
    UNKNOWN_FILE,
    UNKNOWN_LAYOUT,
    UNREADABLE,
    UNSTABLE_KEY,
)
from cachedoctor.core.findings import CatalogEntry, Example, Family, FindingKind, Producer
from cachedoctor.layout import STATS_DIRNAME

K = FindingKind

_KEY = "jit_f-5a884addedb531961ab1f3ef2709805539e2ee92c3fbbec0483975a552e5c977"
_CACHE = "/data/jaxcache"
_LRU_LOW, _LRU_HIGH = LRU_PASS_US_PER_ENTRY
_LRU_INFO, _LRU_WARNING = LRU_WRITE_COST_FROM_US

ENTRIES: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        K.KERNEL_LOCATIONS,
        Family.KEYS,
        summary="Pallas TPU kernels whose keys differ in their source paths and lines only",
        what="Groups a module's TPU entries by their program with the Pallas kernels' bodies "
        "masked, and where the bodies differ reads them with jaxlib's MLIR: kernels equal once "
        "their debug information is stripped (as jax 0.11 strips it) differ only in where their "
        "source was, and the finding lists each entry's paths and lines.",
        why="Up to jax 0.10 the Mosaic body's debug locations are hashed into the key: the same "
        "program run from another checkout folder, or with a line added above a kernel, "
        "compiles every Pallas kernel again (measured on a TPU v5e: 3 folders, 3 entries each "
        "of jit_matmul and jit_add).",
        cases=(KERNEL_LOCATIONS,),
        example=Example(
            KERNEL_LOCATIONS,
            "jit_add: 3 entries differ only in the debug locations of Mosaic kernel `add_kernel` "
            "(/ci/run-1/ops.py:32, /ci/run-2/ops.py:32, /ci/run-2/ops.py:33)",
            (
                ("stripped", "8364a5865789"),
                (
                    "where",
                    "/ci/run-1/ops.py:32 (jit_add-85f0…), /ci/run-2/ops.py:32 (jit_add-6a7c…), "
                    "/ci/run-2/ops.py:33 (jit_add-5a69…)",
                ),
                ("jax", "0.10.2"),
                ("hashes", "hashes"),
            ),
            module="jit_add",
        ),
    ),
    CatalogEntry(
        K.UNSTABLE_KEY,
        Family.KEYS,
        summary="one program under several keys, with evidence that a key input changes per run",
        what="Groups the entries by their program (the stored HLO, modulo volatile fields) and "
        "flags a group when the stored HLO itself shows an input of the key that changes from "
        "process to process: a `backend_config` holding an address, or the output of a "
        "`custom_partitioning` op (its `CustomSPMDPartitioning` config is a Python object "
        "address that JAX hashes).",
        why="JAX computes another key in every process, misses, recompiles and writes one more "
        "entry each run: the cache costs disk and saves no compile time.",
        cases=(UNSTABLE_KEY,),
        example=Example(
            UNSTABLE_KEY,
            "jit_f: 3 entries hold identical executables under different keys, and a key input "
            "changes from run to run",
            (
                ("entry", _KEY),
                ("where", "wrapped_add_computation/add.0"),
                (
                    "detail",
                    "source metadata names a custom_partitioning op, whose "
                    "CustomSPMDPartitioning backend_config (a Python object address) JAX hashes "
                    "into the key",
                ),
                ("count", "3"),
                ("by_manifest", "3 without a manifest (plain JAX's keys)"),
                ("hooked", ""),
            ),
            module="jit_f",
        ),
    ),
    CatalogEntry(
        K.SAME_PROGRAM,
        Family.KEYS,
        summary="one program under several keys, with no evidence of an unstable key",
        what="The same grouping as `unstable-key`, for groups whose stored HLO shows no key input "
        "that changes between runs.",
        why="JAX hashes the module before optimisation: inputs that optimise to one program (a "
        "result name, a no-op convert, a static argument) each keep a stable key that JAX hits. "
        "It is information, not a fault; `prune --duplicates` keeps them.",
        cases=(SAME_PROGRAM,),
        example=Example(
            SAME_PROGRAM,
            "jit_step: the same program under 2 keys",
            (("how", "identical executables"),),
            module="jit_step",
        ),
    ),
    CatalogEntry(
        K.RELOCATED,
        Family.KEYS,
        summary="entries written for a cache dir spelled otherwise, which JAX never hits here",
        what="Compares the sub-cache path each entry's compile options store "
        "(`<cache dir>/xla_gpu_per_fusion_autotune_cache_dir` up to jax 0.10, the kernel-cache "
        "file when on) with the string JAX builds from the cache dir *as you spelled it* to "
        "cachedoctor (DIR, else `$JAX_COMPILATION_CACHE_DIR`, else `enable`'s dir). JAX compares "
        "spellings, not directories: it drops a doubled or trailing slash and `.` parts and "
        "nothing else, so a copy, a remount, a symbolic link, `..`, or a relative spelling of an "
        "absolute one (or the reverse) is relocated. Not raised for a path JAX did not build "
        "from the cache dir (set in `XLA_FLAGS`), with JAX's sub-caches off "
        "(`JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=none`: no path is stored), or for entries "
        "under cachedoctor's stable keys (their manifests say so).",
        why="The installed JAX hashes that path into the key: a run that spells the cache dir "
        "this way never hits these entries, and recompiles them.",
        cases=(RELOCATED, RELOCATED_REKEYABLE),
        example=Example(
            RELOCATED,
            "7 entries (4 modules) were written for a cache spelled /old/jaxcache; their keys "
            "hash xla_gpu_per_fusion_autotune_cache_dir and JAX 0.10.2 will never hit them with "
            f"the cache dir spelled {_CACHE}",
            (
                ("option", "xla_gpu_per_fusion_autotune_cache_dir"),
                ("elsewhere", "/old/jaxcache"),
                ("stored", "/old/jaxcache"),
                ("spelled", _CACHE),
                ("builds", f"{_CACHE}/xla_gpu_per_fusion_autotune_cache_dir"),
                ("hashed", "JAX 0.10.2 hashes that option into the key"),
            ),
        ),
    ),
    CatalogEntry(
        K.MISSING_ATIME,
        Family.INTEGRITY,
        summary="entries without their -atime file while JAX's LRU eviction is on",
        what="Looks for entries without a `-atime` file when the listing shows LRU eviction in "
        "use: JAX's `.lockfile`, or `-atime` files beside other entries (JAX writes them only "
        "with eviction on). `-atime` files of no entry are no evidence (`orphan`); the summary's "
        "`LRU eviction` line counts the same evidence.",
        why="JAX up to 0.10 fails its eviction pass on an entry without its `-atime` file, and "
        "that stops all cache writes; JAX 0.12 takes such an entry as the least recently used "
        "and evicts it first.",
        cases=(MISSING_ATIME_LOCKED, MISSING_ATIME_UNLOCKED, MISSING_ATIME_EVICTED_FIRST),
        example=Example(
            MISSING_ATIME_LOCKED,
            "8 entries have no -atime file while LRU eviction is in use (.lockfile present); "
            "JAX up to 0.10 fails its eviction pass on them, which stops all cache writes (0.12 "
            "evicts them first)",
        ),
    ),
    CatalogEntry(
        K.CORRUPT,
        Family.INTEGRITY,
        summary="an entry that does not decode",
        what="Decodes every entry (compression, serialized executable, compile options, HLO; "
        "on a TPU libtpu's six messages) and flags one that fails where JAX's load fails too: "
        "cut short, a byte zstd rejects, a message that does not parse, bytes after the last "
        "message. A byte changed in debug text (a source path, a folder name) loads, and is "
        "not flagged.",
        why="JAX fails to load the entry and recompiles, and never replaces it: every later run "
        "warns and compiles again. Where the bytes look whole to cachedoctor but JAX's own "
        "parser refused them, a stats record of that failure (`CACHEDOCTOR_HOOK=stats`) is the "
        "evidence, as long as the file is unchanged since.",
        cases=(CORRUPT, CORRUPT_BY_JAX),
        example=Example(
            CORRUPT,
            f"{_KEY}: zstd frame declares 17046 bytes but holds 0 (file cut short, or a forged "
            "size)",
            (("problem", "truncated"),),
            module="jit_f",
        ),
    ),
    CatalogEntry(
        K.UNKNOWN_LAYOUT,
        Family.INTEGRITY,
        summary="an entry in a layout cachedoctor does not know: no verdict, kept",
        what="An entry whose zstd frame decodes whole and which opens with JAX's pjrt_ifrt "
        "header, followed by bytes in no layout the reader knows (CPU and GPU executables, "
        "libtpu's six messages): a newer libtpu or jaxlib, another PJRT plugin, a new platform.",
        why="cachedoctor cannot tell whether JAX loads it, so it says so instead of a verdict: "
        "`prune --corrupt` never removes it, `pack` never leaves it out, `lint` never fails on "
        "it.",
        cases=(UNKNOWN_LAYOUT,),
        example=Example(
            UNKNOWN_LAYOUT,
            f"{_KEY}: after its pjrt_ifrt header the payload is in a layout cachedoctor does not "
            "know (not libtpu's six messages (1 framed, then claims 7561 bytes but 12 remain), "
            "and no TPU program first; starts 7f 46 55 54 55 52 45 00): no verdict on it",
            (("problem", "unknown-layout"),),
            module="jit_f",
        ),
    ),
    CatalogEntry(
        K.UNREADABLE,
        Family.INTEGRITY,
        summary="an entry cachedoctor cannot read, so cannot judge",
        what="An entry cachedoctor could not read whole (its permissions or owner, or "
        "decompressed over the decode cap): it says unknown instead of a verdict, and never "
        "calls it corrupt.",
        why="Nothing is known about it, so no command removes it; JAX may not read it either.",
        cases=(UNREADABLE,),
        example=Example(
            UNREADABLE,
            f"{_KEY}: not checked: unreadable: permission denied",
            (("problem", "unreadable"),),
            module="jit_f",
        ),
    ),
    CatalogEntry(
        K.ORPHAN,
        Family.INTEGRITY,
        summary="-atime files without an entry, leftover temporary files",
        what="Lists `-atime` files whose entry is gone and temporary files JAX's writers leave "
        "when interrupted.",
        why="Harmless to JAX; they take space and an inode each.",
        cases=(ORPHAN_ATIME, ORPHAN_TEMP),
        example=Example(ORPHAN_ATIME, "1 -atime file has no entry"),
    ),
    CatalogEntry(
        K.INSECURE,
        Family.SECURITY,
        summary="a cache others can write, entries of another user, symbolic links",
        what="Reads the modes and owners (lstat, links not followed) of the cache directory and "
        "its entries. Not raised for a bucket: who may write it is its access policy's business.",
        why="An entry is code JAX loads and runs: whoever can write the cache can run code in "
        "your JAX processes.",
        cases=(
            INSECURE_DIRECTORY_MODE,
            INSECURE_DIRECTORY_OWNER,
            INSECURE_ENTRY_MODE,
            INSECURE_ENTRY_OWNER,
            INSECURE_SYMLINK,
        ),
        example=Example(
            INSECURE_DIRECTORY_MODE,
            "the cache directory is writable by group and others",
            (("mode", "drwxrwxrwx"), ("root", _CACHE)),
        ),
    ),
    CatalogEntry(
        K.MIXED_VERSIONS,
        Family.INVENTORY,
        summary="entries in several JAX formats, or of another jaxlib",
        what="Counts the sound entries by payload layout, which changes with JAX's version. "
        "Entries written for a cache at another path are told apart from a relocated copy by "
        "their compile options: an entry that sets DebugOptions fields the installed jaxlib "
        "does not define was written by another jaxlib (jaxlib 0.12.0.1's entries set 49 fields "
        "0.10.2 lacks, and 0.10.2's set 14 that 0.12.0.1 dropped), and is this finding, never "
        "`relocated`.",
        why="Entries of another JAX version never hit after an upgrade; they only take space.",
        cases=(MIXED_VERSIONS, OTHER_JAXLIB),
        example=Example(MIXED_VERSIONS, "entries in several JAX formats: 12× ifrt-v3, 3× pjrt"),
    ),
    CatalogEntry(
        K.MIXED_PLATFORMS,
        Family.INVENTORY,
        summary="entries for several platforms (CPU and GPU) side by side",
        what="Counts the sound entries by the platform of their executable.",
        why="Fine for a shared cache; size budgets count all of them.",
        cases=(MIXED_PLATFORMS,),
        example=Example(MIXED_PLATFORMS, "entries for several platforms: 10× gpu, 4× cpu"),
    ),
    CatalogEntry(
        K.UNKNOWN_FILE,
        Family.INVENTORY,
        summary="files that are not part of a JAX cache",
        what="Lists the files named as JAX never names its files, and FIFOs, sockets and "
        "devices (never opened).",
        why="They may not belong here; cachedoctor never touches them.",
        cases=(UNKNOWN_FILE,),
        example=Example(UNKNOWN_FILE, "1 file that is not part of a JAX cache"),
    ),
    CatalogEntry(
        K.SUBCACHE,
        Family.INVENTORY,
        summary="an XLA sub-cache with problems (kernel cache, autotune files)",
        what="Reads and parses XLA's sub-caches in the cache dir: the kernel cache file and the "
        "autotune sub-cache (its per-fusion files, `tmp/` leftovers, several GPU models).",
        why="XLA cannot reuse a damaged sub-cache; it rebuilds it, so clearing it is safe.",
        cases=(SUBCACHE_KERNEL, SUBCACHE_AUTOTUNE),
        example=Example(
            SUBCACHE_KERNEL,
            "kernel cache: does not parse as CompilationCacheProto: unsupported wire type 7 at "
            "byte 0",
        ),
    ),
    CatalogEntry(
        K.NOT_STORED,
        Family.INVENTORY,
        summary="modules compiled with this cache that have no entry, and why",
        what="Key manifests (`cachedoctor enable`, observe or stable) of modules with no entry "
        "beside them, one finding per reason, each module's evidence quoted: JAX refused it "
        "(host callbacks: `pure_callback`, `io_callback`, `jax.debug.print`, equinox checks in "
        "diffrax, refused up to JAX 0.10 and stored by 0.12; under its minimum compile time or "
        "entry size; not process 0), its write "
        "failed, its LRU evicted it, something removed it, or `unknown` when no stats record "
        "says. The reasons are those of docs/stats.md, the same as `stats` and `lint` give; "
        "`cachedoctor check -- CMD` names the modules JAX would not store in its runs with "
        "the same reasons, from its processes' stats records or JAX's own log line.",
        why="Such a module recompiles in every run although the cache is on.",
        cases=(NOT_STORED,),
        example=Example(
            NOT_STORED,
            "3 modules compiled with this cache without an entry (host-callbacks: this JAX does "
            "not store a module with host callbacks (jax.debug.print, pure_callback, "
            "io_callback)): "
            "jit_io, jit_printing, jit_pure",
            (
                (
                    "each_modules_evidence",
                    "jit_io: stats records: 1 of 1 misses compiled with host callbacks",
                ),
                (
                    "the_reasons_advice",
                    "each module recompiles every run: move the jax.debug.print / pure_callback "
                    "/ io_callback out of the jitted function, or accept it",
                ),
            ),
        ),
    ),
    CatalogEntry(
        K.LRU_WRITE_COST,
        Family.INVENTORY,
        summary="so many entries that JAX's LRU eviction pass slows every cache write",
        what="Counts the `-cache` names when the listing shows JAX's LRU eviction in use (the "
        "same evidence as `missing-atime`: a `.lockfile`, or `-atime` files beside entries) and "
        "prices the pass JAX runs before every write by a model measured with "
        f"`benchmarks/bench_lru_write.py`: {_LRU_LOW}–{_LRU_HIGH} µs per entry held "
        f"(docs/performance.md). Raised from {_LRU_INFO / 1e6:g} s per write at the low end "
        f"({_LRU_INFO // _LRU_LOW:,} entries), a tenth of the 1 s compile JAX needs by default "
        f"before it stores an entry; a warning from {_LRU_WARNING / 1e6:g} s "
        f"({_LRU_WARNING // _LRU_LOW:,} entries) with the `.lockfile` there. The numbers are the "
        "model's, never a measurement of the machine scanned.",
        why="With `jax_compilation_cache_max_size` set, every write globs, stats and reads the "
        "`-atime` file of every entry (JAX 0.4.38 to 0.12; jax-ml/jax#18751 is open), holding "
        "the `.lockfile` that other processes' hits wait on (JAX's lock timeout is 10 s): "
        "uwplasma/vmex measured 304 ms per write at 10,880 entries. Hits pay only the lock and "
        "one `-atime` write. A scheduled `prune --max-size` keeps the count down; with it in "
        "place JAX's own limit can even be off (-1) so that writes pay no pass at all, though "
        "JAX then writes no `-atime` files and prune dates each entry's use by its access time "
        "and the stats records instead (docs/maintenance.md).",
        cases=(LRU_WRITE_COST,),
        example=Example(
            LRU_WRITE_COST,
            "12000 entries under JAX's LRU eviction: each write JAX makes to this cache first "
            "stats them all, about 240 ms–480 ms per write by the measured model (not measured "
            "here)",
            (
                ("held", "12000"),
                (
                    "lru",
                    "JAX's .lockfile (eviction ran here), -atime files beside 12000 of "
                    "12000 entries",
                ),
                ("size", "258MiB"),
                ("target", "5000"),
                ("mean", "53KiB"),
                ("target_cost", "100 ms"),
            ),
        ),
    ),
    CatalogEntry(
        K.MULTI_PROCESS,
        Family.PROCESSES,
        summary="the processes of a jax.distributed job: autotune roles, per-process keys",
        what="Reads the key manifests of a `jax.distributed` job (each names its process). Their "
        "manifests without an entry are not called `not-stored`: JAX stores only from process 0.",
        why="A process other than 0 that updates the autotune sub-cache races process 0 for it "
        "(JAX gives the others READ); keys that differ per process are recompiled by those "
        "processes every run, with or without cachedoctor.",
        cases=(MULTI_PROCESS_AUTOTUNE, MULTI_PROCESS_KEYS),
        example=Example(
            MULTI_PROCESS_KEYS,
            "1 module has keys in process(es) 1 that differ from process 0's only in "
            "accelerator_config: jit_plain",
            (
                (
                    "what_jax_hashes_per_process",
                    "JAX hashes the topology of this process's own devices, on CPU their ids "
                    "and process index",
                ),
            ),
        ),
    ),
    CatalogEntry(
        K.NEVER_HIT,
        Family.USAGE,
        summary="a module that asked the cache in several processes and never hit",
        what="From the stats records the hook writes (`cachedoctor enable`): a module that "
        "compiled in three or more processes and never hit, with the reason `stats` gives.",
        why="Each of those processes paid the compile time the cache should have saved.",
        cases=(NEVER_HIT,),
        raised_by=Producer.STATS_RECORDS,
        example=Example(
            NEVER_HIT,
            "jit_f asked the cache in 3 processes and never hit (0.36 s compiling): unstable key",
            (
                ("processes", "3"),
                ("reason", "unstable-key"),
                ("reason_evidence", "scan finding unstable-key"),
                (
                    "the_reasons_advice",
                    "run `cachedoctor diff --module jit_f` to see what changes its key, "
                    "`cachedoctor enable` for stable keys",
                ),
            ),
            module="jit_f",
        ),
    ),
    CatalogEntry(
        K.MISSED,
        Family.USAGE,
        summary="a module's recorded misses, and what changed in JAX's key",
        what="From the stats records: each miss whose key's components the recorder kept, set "
        "against the nearest earlier key of the module (`cachedoctor why`), grouped by cause, "
        "with the compile time the module's misses cost. Modules already reported as "
        "`never-hit` are left out.",
        why="A cache that misses after a change (a jaxlib upgrade, an XLA flag, fewer devices) "
        "costs every process the compile time, and nothing else says which change it was.",
        cases=(MISSED_KEY_CHANGED, MISSED_ENTRY_GONE),
        raised_by=Producer.STATS_RECORDS,
        example=Example(
            MISSED_KEY_CHANGED,
            "jit_step: 2 misses because jaxlib 0.8.3 → 0.10.2 (its 3 misses cost 3.10 s compiling)",
            (("components", "jax_lib version, computation"),),
            module="jit_step",
        ),
    ),
    CatalogEntry(
        K.STATS_RECORD,
        Family.USAGE,
        summary=f"a torn, unreadable, foreign or rule-breaking file in {STATS_DIRNAME}/",
        what=f"Checks each file in {STATS_DIRNAME}/: a record that does not parse (torn or not "
        "cachedoctor's), one that cannot be opened or read (permissions, I/O: its bytes are "
        "unknown, so it is not called torn), one that breaks a rule its recorder keeps, a file "
        "named neither as a record nor as an archive. Each is left out of the totals.",
        why="The totals of `stats` and the reasons of `scan` and `lint` rest on the records: a "
        "bad one is left out, and said so, rather than counted.",
        cases=(
            STATS_RECORD_UNREADABLE,
            STATS_RECORD_NO_ACCESS,
            STATS_RECORD_BROKEN,
            STATS_RECORD_FOREIGN,
        ),
        raised_by=Producer.STATS_RECORDS,
        example=Example(
            STATS_RECORD_UNREADABLE,
            f"{STATS_DIRNAME}/20261202T015949-vm-5323-00424558.json is not a readable stats "
            "record (Expecting property name enclosed in double quotes: line 1 column 2 (char "
            "1)); it is left out",
        ),
    ),
)

BY_KIND = {entry.kind: entry for entry in ENTRIES}
