"""The runtime hook: make JAX's persistent cache use the stable key (:mod:`.keys`).

It wraps one JAX function, ``jax._src.compilation_cache.get_cache_key``, which ``jax._src.compiler``
calls through the module attribute. The wrapper keeps the original (``__cachedoctor_original__``),
swallows its own errors and then calls the original, so JAX never sees a failure of ours. If the
internals are not what we expect, :func:`install` warns once and leaves JAX untouched.

Modes:
- ``stable``: JAX stores and looks up entries under the stable key. On a miss, when the entry under
  JAX's own key exists (a cache warmed without the hook), it is re-keyed: hard-linked (or copied)
  under the stable key through a temp name and ``os.replace``, with its ``-atime`` file, so
  processes without the hook keep hitting their entry and nothing is recompiled.
- ``observe``: JAX's keys are kept; the manifest records what the stable key would have been.

A module with custom_partitioning calls is keyed by replay (:mod:`.replay`): a recorded variant
whose partitioner calls reproduce gives its key; otherwise a new variant is compiled and the
calls XLA makes are recorded into its manifest just before JAX stores the entry (the hook also
wraps ``compilation_cache.put_executable_and_time``). The recorder stays after :func:`uninstall`
(it only records pointers the hook is waiting for).

Known cost: with eviction on (``jax_compilation_cache_max_size``), a re-keyed entry is counted twice
by JAX's size accounting although the hard link shares the bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachedoctor.stablekeys.rekey import _rekey_entry, rekey_entry

__all__ = ["install", "installed_mode", "rekey_entry", "run_script", "stats", "uninstall"]

logger = logging.getLogger("cachedoctor.stablekeys.hook")

MODES = ("stable", "observe")
_MAX_CANDIDATES = 16  # replay at most this many recorded variants of one module per lookup
_MAX_PENDING = 64  # compiles JAX did not store (too fast, process_id != 0) are forgotten


@dataclass
class _State:
    mode: str | None = None
    record_ir: bool = False
    manifests: bool = True
    migrate: bool = True
    warned: bool = False
    stats: dict[str, int] = field(
        default_factory=lambda: {
            "keys": 0,
            "migrated": 0,
            "fallbacks": 0,
            "unsound": 0,
            "manifest_errors": 0,
            "replayed": 0,  # hits decided by replaying recorded partitioner calls
            "replay_misses": 0,  # candidates whose calls did not reproduce
            "recorded": 0,  # replay manifests written after a compile
            "per_process_keys": 0,  # keys found to differ from process 0's only per process
        }
    )
    last_error: str | None = None
    last_replay_miss: str | None = None
    warned_jax_flag: bool = False
    said: set[str] = field(default_factory=set)  # topics already said on stderr
    process_checks: int = 0  # lookups compared with process 0's manifests (bounded)
    # key -> (hasher result, replay digest, pointers, backend, autotune mode, whether JAX's key
    # holds the pointer) until JAX stores
    # the entry
    pending: dict[str, tuple[Any, str | None, list[bytes], Any, str | None, bool | None]] = field(
        default_factory=dict
    )


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


def _warn_once(message: str) -> None:
    """The one stderr line of a hook that steps aside (JAX keeps its own keys)."""
    if not _state.warned:
        _state.warned = True
        with contextlib.suppress(Exception):
            sys.stderr.write(f"cachedoctor: {message}; the JAX cache keeps its own keys\n")


def _check_compiler_calls_through_module() -> None:
    """JAX must reach get_cache_key through the module attribute, or patching it does nothing."""
    import types

    from jax._src import compiler

    from cachedoctor.stablekeys.keys import InternalsChanged

    for obj in vars(compiler).values():
        code = getattr(obj, "__code__", None)
        if isinstance(code, types.CodeType) and {"compilation_cache", "get_cache_key"} <= set(
            code.co_names
        ):
            return
    raise InternalsChanged("jax._src.compiler does not call compilation_cache.get_cache_key")


def install(
    mode: str = "stable", *, record_ir: bool = False, manifests: bool = True, migrate: bool = True
) -> bool:
    """Make this process's JAX use the stable key (``stable``) or record it (``observe``).

    Idempotent; calling again changes the settings. Returns False (after one warning) when the
    installed JAX's internals are not what the hook expects; JAX is then left untouched.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    from cachedoctor.stablekeys import keys

    with _lock:
        try:
            keys.check_internals()
            _check_compiler_calls_through_module()
        except Exception as exc:
            _state.last_error = str(exc)
            _warn_once(f"unexpected JAX internals ({exc})")
            return False
        from jax._src import compilation_cache as cc

        from cachedoctor.stablekeys import replay

        try:
            replay.install()
            _wrap_put(cc)
        except Exception as exc:  # custom_partitioning keys then keep their pointer (a miss)
            _state.last_error = f"replay unavailable: {exc}"
            logger.info("custom_partitioning replay unavailable: %s", exc)
        from cachedoctor.stablekeys import manifest

        manifest.share_jax_filesystem()
        _state.mode, _state.record_ir = mode, record_ir
        _state.manifests, _state.migrate = manifests, migrate
        if getattr(cc.get_cache_key, "__cachedoctor_original__", None) is None:
            original = cc.get_cache_key

            def get_cache_key(
                module: Any,
                devices: Any,
                compile_options: Any,
                backend: Any,
                *args: Any,
                **kwargs: Any,
            ) -> str:
                try:
                    key = _get_cache_key(
                        original, module, devices, compile_options, backend, args, kwargs
                    )
                except Exception as exc:  # never break JAX: fall back to its own key
                    _state.stats["fallbacks"] += 1
                    _state.last_error = f"{type(exc).__name__}: {exc}"
                    logger.debug("stable key failed, using JAX's key", exc_info=True)
                    key = None
                if key is None:
                    return str(original(module, devices, compile_options, backend, *args, **kwargs))
                return key

            get_cache_key.__cachedoctor_original__ = original  # type: ignore[attr-defined]
            get_cache_key.__wrapped__ = original  # type: ignore[attr-defined]
            cc.get_cache_key = get_cache_key
        return True


def _wrap_put(cc: Any) -> None:
    """Write a replay manifest (the calls XLA just made) right before JAX stores the entry."""
    if getattr(cc.put_executable_and_time, "__cachedoctor_original__", None) is not None:
        return
    original = cc.put_executable_and_time
    from jax._src import compiler

    code = getattr(getattr(compiler, "_cache_write", None), "__code__", None)
    if code is None or "put_executable_and_time" not in code.co_names:
        raise RuntimeError("jax._src.compiler does not call put_executable_and_time")

    def put_executable_and_time(cache_key: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _write_replay_manifest(str(cache_key))
        except Exception as exc:  # never break JAX
            _state.stats["manifest_errors"] += 1
            _state.last_error = f"replay manifest: {exc}"
            _say_once(
                f"manifests {_local_cache_dir()}",
                f"cannot write the replay manifest of {cache_key} ({type(exc).__name__}:"
                f" {exc}): it is never reused, the module recompiles on the next run",
            )
        return original(cache_key, *args, **kwargs)

    put_executable_and_time.__cachedoctor_original__ = original  # type: ignore[attr-defined]
    put_executable_and_time.__wrapped__ = original  # type: ignore[attr-defined]
    cc.put_executable_and_time = put_executable_and_time


def uninstall() -> bool:
    """Restore JAX's own ``get_cache_key``; returns whether the hook was installed."""
    import sys

    with _lock:
        _state.mode = None
        cc = sys.modules.get("jax._src.compilation_cache")
        original = getattr(getattr(cc, "get_cache_key", None), "__cachedoctor_original__", None)
        if cc is None or original is None:
            return False
        cc.get_cache_key = original  # type: ignore[attr-defined]
        put = getattr(cc.put_executable_and_time, "__cachedoctor_original__", None)
        if put is not None:
            cc.put_executable_and_time = put  # type: ignore[attr-defined]
        return True


def installed_mode() -> str | None:
    """``stable``, ``observe`` or None; also checks JAX still calls our wrapper."""
    import sys

    cc = sys.modules.get("jax._src.compilation_cache")
    fn = getattr(cc, "get_cache_key", None)
    if _state.mode is None or getattr(fn, "__cachedoctor_original__", None) is None:
        return None
    return _state.mode


def stats() -> dict[str, Any]:
    """Counters of this process (keys computed, migrations, fallbacks) and the last error."""
    return {
        **_state.stats,
        "mode": installed_mode(),
        "last_error": _state.last_error,
        "last_replay_miss": _state.last_replay_miss,
    }


def _ignores_everything(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """JAX's FDO-profile sharing asks for IgnoreCallbacks.ALL: not a cache key, pass it through."""
    value = args[0] if args else next(iter(kwargs.values()), None)
    return value is not None and not isinstance(value, bool) and getattr(value, "name", "") == "ALL"


def _strips_partitioning(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    value = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(value, bool):
        return value
    return getattr(value, "name", "NO") != "NO"


def _local_cache_dir() -> Path | str | None:
    """JAX's cache dir: a Path, a ``gs://`` / ``s3://`` URL (manifests as objects), or None."""
    from jax._src import config

    value = config.compilation_cache_dir.value
    if not value:
        return None
    if "://" in str(value):  # a bucket; file:// and other schemes: no manifests, as ever
        from cachedoctor.storage.location import Location

        where = Location.of_setting(str(value))
        return where.spelling if where is not None and not where.is_local else None
    return Path(value)


def _get_cache_key(
    original: Any,
    module: Any,
    devices: Any,
    options: Any,
    backend: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> str | None:
    from cachedoctor.stablekeys import keys

    mode = _state.mode
    if mode is None or _ignores_everything(args, kwargs):
        return None
    cache_dir = _local_cache_dir()
    if mode == "observe":
        own_key = str(original(module, devices, options, backend, *args, **kwargs))
        with contextlib.suppress(Exception):
            result = keys.stable_key(module, devices, options, backend, record_ir=_state.record_ir)
            _state.stats["keys"] += 1
            # JAX's own key holds the pointer unless its removal flag stripped it: usage
            # evidence (core/usage/lookups) that no later run computes this key
            pointer = _has_partitioning(result) and not _strips_partitioning(args, kwargs)
            if result.to_replay and cache_dir is not None:
                # the manifest waits for the partitioner calls of this compile (see _pending)
                _expect_calls(own_key, result, None, backend, options, jax_key_pointer=pointer)
            # once per key, as in stable mode: a module JAX never stores (host callbacks)
            # must not rewrite its manifest on every run
            elif (
                cache_dir is not None
                and _state.manifests
                and not _manifest_exists(cache_dir, own_key)
            ):
                _record(cache_dir, result, mode, own_key, own_key, backend, None, options, pointer)
        return own_key

    result = keys.stable_key(module, devices, options, backend, record_ir=_state.record_ir)
    _state.stats["keys"] += 1
    if cache_dir is not None:
        _explain_process_key(cache_dir, result)
    if result.to_replay:
        return _replayed_key(cache_dir, result, backend, options)
    if not result.sound:
        _state.stats["unsound"] += 1
        why = "; ".join(v.reason or "" for v in result.volatile if v.reason)
        _say_once(
            "unsound",
            f"{result.module_name}: keeping a raw pointer in the key ({why}): it recompiles on"
            " every run (a miss, never a stale hit)",
        )
    jax_key: str | None = None
    migrated_from = None
    if isinstance(cache_dir, str):  # a bucket: no re-keying (no rename or link), manifests only
        if _state.manifests and not _manifest_exists(cache_dir, result.key):
            _record(cache_dir, result, mode, result.key, jax_key, backend, None, options)
    elif cache_dir is not None and not (cache_dir / f"{result.key}-cache").exists():
        if _state.migrate and result.sound:
            # An entry that JAX wrote with its own key for this very compilation?
            if not result.changed:
                jax_key = result.jax_equivalent_key
            elif not (_strips_partitioning(args, kwargs) and _has_partitioning(result)):
                # (never import an entry keyed with the pointer REMOVED: it may be stale)
                jax_key = str(original(module, devices, options, backend, *args, **kwargs))
            if jax_key is not None and _rekey_entry(cache_dir, jax_key, result.key):
                migrated_from = jax_key
                _state.stats["migrated"] += 1
                logger.info("re-keyed %s as %s", jax_key, result.key)
        # JAX may still decide not to write this entry (too small or too fast to compile):
        # write its manifest once, not on every miss
        if _state.manifests and (migrated_from or not _manifest_exists(cache_dir, result.key)):
            _record(cache_dir, result, mode, result.key, jax_key, backend, migrated_from, options)
    elif cache_dir is not None and _state.manifests and not _manifest_exists(cache_dir, result.key):
        _record(cache_dir, result, mode, result.key, jax_key, backend, None, options)
    return result.key


def _explain_process_key(cache_dir: Path | str, result: Any) -> None:
    """In process N > 0 of a job, say once when this key differs from process 0's only in what
    JAX hashes per process (:mod:`.processes`): the run's own explanation of its misses. Only
    the first lookups of such a process are compared (each module's manifests, from the index).
    """
    from cachedoctor.stablekeys import processes

    if _state.process_checks >= _MAX_PROCESS_CHECKS:
        return
    process = processes.current_process()
    if process is None or process[0] == 0:
        return
    _state.process_checks += 1
    index = _index_for(cache_dir)
    found = processes.against_first(result, process[0], index.module(result.module_name))
    if found is not None:
        _state.stats["per_process_keys"] += 1
        _state.process_checks = _MAX_PROCESS_CHECKS
        _say_once("per-process", found.line())


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
    cache_dir: Path | str | None, result: Any, backend: Any, options: Any = None
) -> str | None:
    """The key of a module with custom_partitioning calls, decided by replay.

    A recorded variant of this module (same base key) whose partitioner calls all reproduce
    against the current callbacks gives its key (a hit). Otherwise, after one fresh listing
    (variants other processes recorded since this one started), a new key, and the calls XLA
    makes while compiling are recorded into its manifest (:func:`_write_replay_manifest`).
    """
    from cachedoctor.stablekeys import keys, replay

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
    found = _reproducing(result, _replay_candidates(cache_dir, result, index.module))
    if found is None:
        found = _reproducing(result, _replay_candidates(cache_dir, result, index.refresh))
    if found is not None:
        _state.stats["replayed"] += 1
        return found
    if index.error:
        _say_once(
            f"manifests {cache_dir}",
            f"cannot list the key manifests of {cache_dir} ({index.error}): modules with"
            " custom_partitioning compile under a new key (a miss, never a stale hit)",
        )
    digest = hashlib.sha256(uuid.uuid4().bytes).hexdigest()  # a fresh variant
    key = keys.replayed_key(result, digest)
    _expect_calls(key, result, digest, backend, options)
    return key


def _reproducing(result: Any, candidates: list[Any]) -> str | None:
    """The key of the first candidate whose recorded partitioner calls all reproduce."""
    from cachedoctor.stablekeys import replay

    pointers = [pointer for _, pointer in result.to_replay]
    indices = [i for i, _ in result.to_replay]
    for candidate in candidates:
        replay_ops = candidate.replay or []
        if [op["index"] for op in replay_ops] != indices:
            continue
        differs = replay.reproduces([op["calls"] for op in replay_ops], pointers)
        if differs is None:
            return str(candidate.key)
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
    cache_dir: Path | str, result: Any, source: Callable[[str], list[Any]]
) -> list[Any]:
    """Replay manifests of this module with the same base key, newest first, from ``source``
    (the index's manifests of the module, or the ones a fresh listing found).

    In a local dir only variants whose entry exists (one ``stat`` each); on a bucket that would
    be a request per candidate, and a variant whose entry was evicted only makes JAX compile
    once more under the key its calls reproduce.
    """
    found = [m for m in source(result.module_name) if m.base_key == result.key and m.replay]
    if isinstance(cache_dir, Path):
        found = [m for m in found if (cache_dir / f"{m.key}-cache").exists()]
    found.sort(key=lambda m: m.created, reverse=True)
    return found[:_MAX_CANDIDATES]


def _write_replay_manifest(key: str) -> None:
    from cachedoctor.stablekeys import replay

    with _lock:
        pending = _state.pending.pop(key, None)
    if pending is None:
        return
    result, digest, pointers, backend, autotune, jax_key_pointer = pending
    calls = replay.take(pointers)
    cache_dir = _local_cache_dir()
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


def _write(cache_dir: Path | str, m: Any, ir_text: str | None, *, create: bool) -> None:
    """Write a manifest (create-only unless it replaces one) and add it to the index.

    A manifest another process wrote first is fine: same key, same components."""
    from cachedoctor.stablekeys import manifest

    with contextlib.suppress(FileExistsError):
        manifest.write_manifest(cache_dir, m, ir_text=ir_text, create=create)
    _index_for(cache_dir).add(m)


def _autotune_mode(options: Any) -> str | None:
    from cachedoctor.stablekeys.subcache_roles import autotune_mode

    return autotune_mode(options)


def _index_for(cache_dir: Path | str) -> Any:
    from cachedoctor.stablekeys.manifest_index import index_for

    return index_for(cache_dir)


def _has_partitioning(result: Any) -> bool:
    return any(v.field.startswith("custom_call[") for v in result.volatile)


def _manifest_exists(cache_dir: Path | str, key: str) -> bool:
    """Whether ``key`` has a manifest, from the index (no request per lookup)."""
    try:
        return bool(_index_for(cache_dir).has(key))
    except Exception:  # a bucket that cannot be reached: _record will count the error
        return False


def _record(
    cache_dir: Path | str,
    result: Any,
    mode: str,
    stored_under: str,
    jax_key: str | None,
    backend: Any,
    migrated_from: str | None,
    options: Any = None,
    jax_key_pointer: bool | None = None,
) -> None:
    from cachedoctor.stablekeys import manifest, processes

    try:
        m = manifest.from_key_result(
            result,
            mode=mode,
            stored_under=stored_under,
            jax_key=jax_key,
            backend=backend,
            migrated_from=migrated_from,
            process=processes.current_process(),
            autotune_mode=_autotune_mode(options),
            jax_key_pointer=jax_key_pointer,
        )
        _write(cache_dir, m, result.canonical_ir, create=migrated_from is None)
    except Exception as exc:  # a read-only cache or an unreachable bucket must not stop compiling
        _state.stats["manifest_errors"] += 1
        _state.last_error = f"manifest: {exc}"
        _say_once(
            f"manifests {cache_dir}",
            f"cannot write key manifests to {cache_dir} ({type(exc).__name__}: {exc}):"
            " modules with custom_partitioning will not be reused (a miss, never a stale hit)",
        )


def run_script(path: str, argv: list[str] | None = None, *, mode: str = "stable") -> None:
    """Run a Python script as ``__main__`` with the hook installed (no ``.pth`` needed).

    ``python -m cachedoctor.stablekeys.hook [--mode stable|observe] script.py [args...]``
    does the same;
    ``demo`` and ``check`` use it to run programs in fresh interpreters.
    """
    import runpy
    import sys

    install(mode)
    sys.argv = [path, *(argv or [])]
    runpy.run_path(path, run_name="__main__")


if __name__ == "__main__":  # pragma: no cover - exercised through subprocesses
    import sys as _sys

    _args = _sys.argv[1:]
    _mode = "stable"
    if _args[:1] == ["--mode"]:
        _mode, _args = _args[1], _args[2:]
    if not _args:
        _sys.exit(
            "usage: python -m cachedoctor.stablekeys.hook"
            " [--mode stable|observe] script.py [args...]"
        )
    run_script(_args[0], _args[1:], mode=_mode)
