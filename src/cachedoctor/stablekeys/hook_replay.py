"""The hook's replay half and the state the hook keeps: a module with custom_partitioning calls
keyed by replaying recorded partitioner calls, and the manifests that record them.

Apart from ``hook.py`` (the wrapper of JAX's ``get_cache_key``, its install and the key of a
module without such calls) because replay is a job of its own: finding the recorded variants
of a module, checking each against the current callbacks, and writing the calls XLA makes into
the manifest of a new variant when JAX stores its entry. The state both use lives here, so that
``hook.py`` imports this module and nothing here imports the hook (no import cycle). It loads
nothing the hook did not load before the split: the standard library modules below, and
``replay``, ``keys``, ``manifest`` and ``manifest_index`` only when a compile asks.

The cache dir is JAX's setting as one ``Location`` (``hook._cache_location``): a folder where
an entry can be looked for with one ``stat``, or a bucket, where that would be a request.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cachedoctor.storage.location import Location

logger = logging.getLogger("cachedoctor.stablekeys.hook")

_MAX_CANDIDATES = 16  # replay at most this many recorded variants of one module per lookup
_MAX_PENDING = 64  # compiles JAX did not store (too fast, process_id != 0) are forgotten


class _State:
    """What the hook knows in this process: its settings, counters and pending manifests.

    (A plain class: ``@dataclass`` costs ~0.4 ms at import, in every hooked process's start.)
    """

    def __init__(self) -> None:
        self.mode: str | None = None
        self.record_ir = False
        self.manifests = True
        self.migrate = True
        # JAX's lookup is wrapped: a key with a manifest leaves its entry to it (hook._wrap_get)
        self.await_lookups = False
        self.warned = False
        self.stats: dict[str, int] = {
            "keys": 0,
            "migrated": 0,
            "fallbacks": 0,
            "unsound": 0,
            "manifest_errors": 0,
            "replayed": 0,  # hits decided by replaying recorded partitioner calls
            "replay_misses": 0,  # candidates whose calls did not reproduce
            "recorded": 0,  # replay manifests written after a compile
            "per_process_keys": 0,  # keys found to differ from process 0's only per process
            "entry_checks": 0,  # entries the hook looked for itself (a warm key: JAX's lookup)
        }
        self.last_error: str | None = None
        self.last_replay_miss: str | None = None
        self.warned_jax_flag = False
        self.said: set[str] = set()  # topics already said on stderr
        self.process_checks = 0  # lookups compared with process 0's manifests (bounded)
        # JAX's cache-dir setting and its Location (None: not one the hook writes manifests in)
        self.location: tuple[object, Location | None] | None = None
        # key -> (hasher result, replay digest, pointers, backend, autotune mode, whether JAX's
        # key holds the pointer) until JAX stores the entry
        self.pending: dict[
            str, tuple[Any, str | None, list[bytes], Any, str | None, bool | None]
        ] = {}


_state = _State()
_lock = threading.Lock()
_said_lock = threading.Lock()
_MAX_PROCESS_CHECKS = 8  # lookups of a process > 0 compared with process 0's manifests


def _say_once(topic: str, text: str) -> None:
    """One line on stderr per topic and process: why something will not hit (never raises).

    A plain write, not ``warnings.warn``: a program running with ``-W error`` must not see
    an exception come out of its compile.
    """
    with _said_lock:
        if topic in _state.said:
            return
        _state.said.add(topic)
    with contextlib.suppress(Exception):
        sys.stderr.write(f"cachedoctor: {text}\n")


def _shown(where: Location | None) -> str:
    """The cache dir as the hook's messages name it: a folder as ``Path`` spells it, a bucket
    by its URL."""
    if where is None:
        return "None"
    folder = where.local_path
    return where.spelling if folder is None else str(Path(folder))


def _has_entry(where: Location, key: str) -> bool:
    """Whether the entry ``key`` is in the folder (one ``stat``); a bucket: False, no request."""
    folder = where.local_path
    if folder is None:
        return False
    _state.stats["entry_checks"] += 1
    return os.path.exists(os.path.join(folder, f"{key}-cache"))


def _warn_about_jax_flag() -> None:
    from jax._src import config

    flag = getattr(config, "remove_custom_partitioning_ptr_from_cache_key", None)
    if not _state.warned_jax_flag and flag is not None and flag.value:
        _state.warned_jax_flag = True
        _say_once(
            "jax-flag",
            "jax_remove_custom_partitioning_ptr_from_cache_key is set; the hook replaces it"
            " with verified reuse (an entry is reused only when its recorded partitioner calls"
            " reproduce), so it has no effect while the hook is on",
        )


def _replayed_key(
    cache_dir: Location | None,
    result: Any,
    backend: Any,
    options: Any = None,
    devices: Any = None,
) -> str | None:
    """The key of a module with custom_partitioning calls, decided by replay.

    A recorded variant of this module (same base key) whose partitioner calls all reproduce
    against the current callbacks gives its key (a hit). Otherwise, after one fresh listing
    (variants other processes recorded since this one started), a new key, and the calls XLA
    makes while compiling are recorded into its manifest (:func:`_write_replay_manifest`).
    """
    from cachedoctor.stablekeys import keys, misskeys, replay

    _warn_about_jax_flag()
    if cache_dir is None:  # JAX does not use its cache: its own key, never looked up
        return None
    if not replay.installed():
        _state.stats["unsound"] += 1
        _say_once(
            "no-replay",
            f"{result.module_name}: custom_partitioning replay is unavailable"
            f" ({_state.last_error or 'no recorder'}): the key keeps the raw pointer and the"
            " module recompiles on every run (a miss, never a stale hit)",
        )
        return None
    index = _index_for(cache_dir)
    tried: list[Any] = []
    found = _reproducing(result, _replay_candidates(cache_dir, result, index.module), tried)
    if found is None:
        found = _reproducing(result, _replay_candidates(cache_dir, result, index.refresh), tried)
    if found is not None:
        _state.stats["replayed"] += 1
        variant = found.digest(keys.REPLAY_COMPONENT)
        if variant is not None:  # a recorded miss of it (an evicted entry) names its variant
            said = f"the partitioner calls recorded with {found.key} reproduce"
            misskeys.note_stable(found.key, result, devices, (variant, [said]))
        return str(found.key)
    if index.error:
        _say_once(
            f"manifests {_shown(cache_dir)}",
            f"cannot list the key manifests of {_shown(cache_dir)} ({index.error}): modules with"
            " custom_partitioning compile under a new key (a miss, never a stale hit)",
        )
    digest = hashlib.sha256(uuid.uuid4().bytes).hexdigest()  # a fresh variant
    key = keys.replayed_key(result, digest)
    misskeys.note_stable(key, result, devices, (digest, _why_new_variant(tried)))
    _expect_calls(key, result, digest, backend, options)
    return key


def _why_new_variant(tried: list[tuple[Any, str]]) -> list[str]:
    """Why the hook compiles a new variant, in words: each recorded variant of the module and
    the first partitioner call that did not reproduce (``why`` shows this for the miss)."""
    if not tried:
        return ["no recorded variant of this module with the same base key (and an entry)"]
    return [f"{candidate.key}: {differs}" for candidate, differs in tried]


def _reproducing(result: Any, candidates: list[Any], tried: list[tuple[Any, str]]) -> Any | None:
    """The first candidate manifest whose recorded partitioner calls all reproduce; each one
    that does not goes into ``tried`` with the first call that differs."""
    from cachedoctor.stablekeys import replay

    pointers = [pointer for _, pointer in result.to_replay]
    indices = [i for i, _ in result.to_replay]
    for candidate in candidates:
        replay_ops = candidate.replay or []
        if [op["index"] for op in replay_ops] != indices:
            tried.append((candidate, "it replays other custom calls"))
            continue
        differs = replay.reproduces([op["calls"] for op in replay_ops], pointers)
        if differs is None:
            return candidate
        if all(c.key != candidate.key for c, _ in tried):
            tried.append((candidate, differs))
        _state.stats["replay_misses"] += 1
        _state.last_replay_miss = f"{candidate.key}: {differs}"
        logger.info("%s does not reproduce: %s", candidate.key, differs)
    return None


def _expect_calls(
    key: str,
    result: Any,
    digest: str | None,
    backend: Any,
    options: Any = None,
    *,
    jax_key_pointer: bool | None = None,
) -> None:
    """Record the partitioner calls of the compile that follows, for ``key``'s manifest.

    ``digest`` None (observe mode): the digest of the recorded calls themselves, so that runs
    whose calls are the same get the same would-be stable key.
    """
    from cachedoctor.stablekeys import replay

    pointers = [pointer for _, pointer in result.to_replay]
    replay.expect(pointers)
    with _lock:
        _state.pending[key] = (
            result,
            digest,
            pointers,
            backend,
            _autotune_mode(options),
            jax_key_pointer,
        )
        while len(_state.pending) > _MAX_PENDING:
            stale = next(iter(_state.pending))
            replay.take(_state.pending.pop(stale)[2])


def _replay_candidates(
    cache_dir: Location, result: Any, source: Callable[[str], list[Any]]
) -> list[Any]:
    """Replay manifests of this module with the same base key, newest first, from ``source``
    (the index's manifests of the module, or the ones a fresh listing found).

    In a local dir only variants whose entry exists (one ``stat`` each); on a bucket that would
    be a request per candidate, and a variant whose entry was evicted only makes JAX compile
    once more under the key its calls reproduce.
    """
    found = [m for m in source(result.module_name) if m.base_key == result.key and m.replay]
    if cache_dir.local_path is not None:
        found = [m for m in found if _has_entry(cache_dir, m.key)]
    found.sort(key=lambda m: m.created, reverse=True)
    return found[:_MAX_CANDIDATES]


def _write_replay_manifest(key: str, cache_dir: Location | None) -> None:
    """The manifest of the variant ``key`` JAX is about to store, with the partitioner calls
    XLA made compiling it (``cache_dir``: JAX's, as the hook reads it now)."""
    from cachedoctor.stablekeys import replay

    with _lock:
        pending = _state.pending.pop(key, None)
    if pending is None:
        return
    result, digest, pointers, backend, autotune, jax_key_pointer = pending
    calls = replay.take(pointers)
    if cache_dir is None or not _state.manifests:
        return
    if calls is None:  # without the calls the entry is never reused: a miss, never a wrong hit
        _say_once(
            "not-recorded",
            f"{result.module_name}: its partitioner calls could not be recorded (more than"
            f" {replay._MAX_CALLS_PER_OP} calls for one op, or a call failed): this variant is"
            " never reused, the module recompiles on the next run",
        )
        return
    from cachedoctor.stablekeys import manifest, processes

    observed = digest is None
    m = manifest.from_key_result(
        result,
        mode="observe" if observed else "stable",
        stored_under=key,
        jax_key=key if observed else None,
        backend=backend,
        replay_digest=replay.calls_digest(calls) if digest is None else digest,
        replay_calls=calls,
        process=processes.current_process(),
        autotune_mode=autotune,
        jax_key_pointer=jax_key_pointer,
    )
    _write(cache_dir, m, result.canonical_ir, create=True)
    _state.stats["recorded"] += 1


def _write(cache_dir: Location, m: Any, ir_text: str | None, *, create: bool) -> None:
    """Write a manifest (create-only unless it replaces one) and add it to the index.

    A manifest another process wrote first is fine: same key, same components."""
    from cachedoctor.stablekeys import manifest

    with contextlib.suppress(FileExistsError):
        manifest.write_manifest(cache_dir, m, ir_text=ir_text, create=create)
    _index_for(cache_dir).add(m)


def _autotune_mode(options: Any) -> str | None:
    from cachedoctor.stablekeys.subcache_roles import autotune_mode

    return autotune_mode(options)


def _index_for(cache_dir: Location) -> Any:
    from cachedoctor.stablekeys.manifest_index import index_for

    return index_for(cache_dir)
