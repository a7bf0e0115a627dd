"""The runtime hook: make JAX's persistent cache use the stable key (:mod:`.keys`).

It wraps one JAX function, ``jax._src.compilation_cache.get_cache_key``, which ``jax._src.compiler``
calls through the module attribute. The wrapper keeps the original (``__cachedoctor_original__``),
swallows its own errors and then calls the original, so JAX never sees a failure of ours. If the
internals are not what we expect, :func:`install` warns once and leaves JAX untouched.

Modes:
- ``stable``: JAX stores and looks up entries under the stable key. On a miss, when the entry under
  JAX's own key exists (a cache warmed without the hook), it is re-keyed: hard-linked (or copied)
  under the stable key through a temp name and ``os.replace``, with its ``-atime`` file, so
  processes without the hook keep hitting their entry and nothing is recompiled. A key whose
  manifest is known (a warm cache) is not checked for its entry here: JAX's own lookup does
  that, and on its miss the hook re-keys and JAX's read is made again (the hook also wraps
  ``compilation_cache.get_executable_and_time``), so a hit costs no ``stat`` of ours.
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
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachedoctor.stablekeys import keys, misskeys, readonly, splithash
from cachedoctor.stablekeys.entry_files import current_process
from cachedoctor.stablekeys.hook_replay import (
    _MAX_PROCESS_CHECKS,
    _autotune_mode,
    _expect_calls,
    _has_entry,
    _index_for,
    _lock,
    _replayed_key,
    _say_once,
    _shown,
    _state,
    _write,
    _write_replay_manifest,
    logger,
)
from cachedoctor.stablekeys.rekey import _rekey_entry, rekey_entry

if TYPE_CHECKING:
    from cachedoctor.storage.location import Location

__all__ = ["install", "installed_mode", "rekey_entry", "run_script", "stats", "uninstall"]

MODES = ("stable", "observe")

# .lookup: (key, then :func:`_rekey_on_miss`'s other arguments) for this thread's last key whose
# entry was left to JAX's own lookup (a warm key, its manifest known). Dropped at that lookup; a key
# JAX never looks up this way (PGLE's ``_is_executable_in_cache``) keeps its module alive until
# the thread's next such key, and is never re-keyed: a miss, as ever, never a wrong hit.
_awaiting = threading.local()


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

    from cachedoctor.stablekeys.splithash import InternalsChanged

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
    with _lock:
        try:
            splithash.check_internals()
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
        try:
            _wrap_get(cc)
            _state.await_lookups = True
        except Exception as exc:  # each key's entry is then looked for here (a stat)
            _state.await_lookups = False
            logger.info("JAX's lookup not wrapped: %s", exc)
        from cachedoctor.stablekeys.entry_files import share_jax_filesystem

        share_jax_filesystem()
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
                    from cachedoctor.stablekeys.keys import KernelsNotStripped

                    if isinstance(exc, KernelsNotStripped):
                        _say_once(
                            "mosaic",
                            f"cannot strip the Pallas kernels' debug locations ({exc}): keeping"
                            " JAX's own key, which holds their source paths and lines",
                        )
                    key = None
                if key is None:
                    return str(original(module, devices, compile_options, backend, *args, **kwargs))
                return key

            _put_in_place(cc, "get_cache_key", get_cache_key, original)
        return True


def _put_in_place(cc: Any, name: str, wrapper: Any, original: Any) -> None:
    """``compilation_cache.<name>`` becomes ``wrapper``, which keeps JAX's own function where
    :func:`uninstall` (and the hasher, for ``get_cache_key``) finds it."""
    wrapper.__cachedoctor_original__ = original
    wrapper.__wrapped__ = original
    setattr(cc, name, wrapper)


def _check_compiler_calls(caller: str, name: str) -> None:
    """``jax._src.compiler.<caller>`` must reach ``compilation_cache.<name>`` through the module
    attribute, or wrapping it does nothing."""
    from jax._src import compiler

    code = getattr(getattr(compiler, caller, None), "__code__", None)
    if code is None or name not in code.co_names:
        raise RuntimeError(f"jax._src.compiler does not call {name}")


def _wrap_put(cc: Any) -> None:
    """Write a replay manifest (the calls XLA just made) right before JAX stores the entry."""
    if getattr(cc.put_executable_and_time, "__cachedoctor_original__", None) is not None:
        return
    original = cc.put_executable_and_time
    _check_compiler_calls("_cache_write", "put_executable_and_time")

    def put_executable_and_time(cache_key: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _write_replay_manifest(str(cache_key), _cache_location())
        except Exception as exc:  # never break JAX
            _state.stats["manifest_errors"] += 1
            _state.last_error = f"replay manifest: {exc}"
            _say_once(
                f"manifests {_shown(_cache_location())}",
                f"cannot write the replay manifest of {cache_key} ({type(exc).__name__}:"
                f" {exc}): it is never reused, the module recompiles on the next run",
            )
        return original(cache_key, *args, **kwargs)

    _put_in_place(cc, "put_executable_and_time", put_executable_and_time, original)


def _wrap_get(cc: Any) -> None:
    """On JAX's miss of a key left to its lookup (``_awaiting``), re-key JAX's own entry
    and let JAX read again: the stat a hit would otherwise cost is JAX's own read."""
    if getattr(cc.get_executable_and_time, "__cachedoctor_original__", None) is not None:
        return
    original = cc.get_executable_and_time
    _check_compiler_calls("_cache_read", "get_executable_and_time")

    def get_executable_and_time(cache_key: Any, *args: Any, **kwargs: Any) -> Any:
        found = original(cache_key, *args, **kwargs)
        awaited = getattr(_awaiting, "lookup", None)
        if awaited is None or awaited[0] != cache_key:
            return found
        _awaiting.lookup = None
        if isinstance(found, tuple) and found and found[0] is None:
            try:
                if _rekey_on_miss(*awaited):  # JAX's own entry, now under this key too
                    return original(cache_key, *args, **kwargs)
            except Exception as exc:  # never break JAX: the miss stands, JAX compiles
                _state.last_error = f"re-keying on a miss: {type(exc).__name__}: {exc}"
                logger.debug("re-keying on a miss failed", exc_info=True)
        return found

    _put_in_place(cc, "get_executable_and_time", get_executable_and_time, original)


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
        for name in ("put_executable_and_time", "get_executable_and_time"):
            wrapped = getattr(getattr(cc, name, None), "__cachedoctor_original__", None)
            if wrapped is not None:
                setattr(cc, name, wrapped)
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


def _cache_location() -> Location | None:
    """JAX's cache dir as one Location (a folder, or a ``gs://`` / ``s3://`` bucket whose
    manifests are objects), or None: unset, or a ``file://`` or other URL (no manifests there,
    as ever)."""
    return _cache_setting()[1]


def _cache_setting() -> tuple[Any, Location | None]:
    """JAX's cache-dir setting as it is now, and its :func:`_cache_location`."""
    value = splithash.jax_module("config").compilation_cache_dir.value
    if not value:
        return value, None
    known = _state.location
    if known is not None and known[0] == value:  # parsed once per setting, not per lookup
        return known
    from cachedoctor.storage.location import Location

    where = Location.of_setting(str(value))
    if where is not None and "://" in str(value) and where.url is None:
        where = None  # file:///abs: the hook has always left it alone
    _state.location = (value, where)
    return value, where


def _get_cache_key(
    original: Any,
    module: Any,
    devices: Any,
    options: Any,
    backend: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> str | None:
    mode = _state.mode
    if mode is None or _ignores_everything(args, kwargs):
        return None
    setting, cache_dir = _cache_setting()
    if mode == "observe":
        return _observed_key(cache_dir, (original, module, devices, options, backend, args, kwargs))
    result = keys.stable_key(
        module, devices, options, backend, cache_dir=setting or None, record_ir=_state.record_ir
    )
    _state.stats["keys"] += 1
    misskeys.note_stable(result.key, result, devices)  # a recorded miss names its components
    if cache_dir is not None:
        _explain_process_key(cache_dir, result)
    if result.to_replay:
        return _replayed_key(cache_dir, result, backend, options, devices)
    sound = result.sound
    if not sound:
        _state.stats["unsound"] += 1
        why = "; ".join(v.reason or "" for v in result.volatile if v.reason)
        _say_once(
            "unsound",
            f"{result.module_name}: keeping a raw pointer in the key ({why}): it recompiles on"
            " every run (a miss, never a stale hit)",
        )
    jax_call = (original, module, devices, options, backend, args, kwargs)
    if cache_dir is None:
        pass
    elif not cache_dir.can_rename:
        # a bucket: no re-keying (no rename or link), manifests only
        if _state.manifests and not _manifest_exists(cache_dir, result.key):
            _record(cache_dir, result, mode, result.key, None, backend, None, options)
    elif (
        _state.await_lookups
        and _state.manifests
        and not readonly.active()
        and _manifest_exists(cache_dir, result.key)
    ):
        # a key seen before (a warm cache): whether its entry is there is JAX's lookup's to say
        if _state.migrate and sound:
            _awaiting.lookup = (result.key, cache_dir, result, mode, jax_call)
    elif not _has_entry(cache_dir, result.key):
        jax_key = migrated_from = None
        if (_state.migrate or readonly.active()) and sound:
            # An entry that JAX wrote with its own key for this very compilation?
            jax_key = _importable_jax_key(result, jax_call)
            if readonly.active():  # JAX's own entry is read where it is, not re-keyed
                return jax_key if jax_key and _has_entry(cache_dir, jax_key) else result.key
            if jax_key is not None and _rekeyed(cache_dir, jax_key, result.key):
                migrated_from = jax_key
        # JAX may still decide not to write this entry (too small or too fast to compile):
        # write its manifest once, not on every miss
        if _state.manifests and (migrated_from or not _manifest_exists(cache_dir, result.key)):
            _record(cache_dir, result, mode, result.key, jax_key, backend, migrated_from, options)
    elif _state.manifests and not _manifest_exists(cache_dir, result.key):
        _record(cache_dir, result, mode, result.key, None, backend, None, options)
    return result.key


def _observed_key(cache_dir: Location | None, jax_call: tuple[Any, ...]) -> str:
    """``observe``: JAX's own key, with the stable key recorded beside it."""
    original, module, devices, options, backend, args, kwargs = jax_call
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
            cache_dir is not None and _state.manifests and not _manifest_exists(cache_dir, own_key)
        ):
            _record(cache_dir, result, "observe", own_key, own_key, backend, None, options, pointer)
    return own_key


def _importable_jax_key(result: Any, jax_call: tuple[Any, ...]) -> str | None:
    """JAX's own key for this compilation, under which a cache warmed without the hook holds
    its entry; None when that entry must not be imported."""
    if not result.changed:
        return str(result.jax_equivalent_key)
    original, module, devices, options, backend, args, kwargs = jax_call
    if _strips_partitioning(args, kwargs) and _has_partitioning(result):
        return None  # never import an entry keyed with the pointer REMOVED: it may be stale
    return str(original(module, devices, options, backend, *args, **kwargs))


def _rekeyed(cache_dir: Location, jax_key: str, key: str) -> bool:
    """Re-key JAX's entry ``jax_key`` as ``key`` (see :mod:`.rekey`); whether it was there."""
    if not _rekey_entry(Path(cache_dir.spelling), jax_key, key):
        return False
    _state.stats["migrated"] += 1
    logger.info("re-keyed %s as %s", jax_key, key)
    return True


def _rekey_on_miss(
    key: str, cache_dir: Location, result: Any, mode: str, jax_call: tuple[Any, ...]
) -> bool:
    """JAX's own lookup of ``key``, a key whose entry was left to it (``_awaiting``), missed:
    re-key JAX's entry for this compilation, its manifest noting where from, so that JAX can
    read again (:func:`_wrap_get`). JAX has not handed the options to the compiler yet, so its
    key is computed from them as it hashed them."""
    jax_key = _importable_jax_key(result, jax_call)
    if jax_key is None or not _rekeyed(cache_dir, jax_key, key):
        return False
    options, backend = jax_call[3], jax_call[4]
    _record(cache_dir, result, mode, key, jax_key, backend, jax_key, options)
    return True


def _explain_process_key(cache_dir: Location, result: Any) -> None:
    """In process N > 0 of a job, say once when this key differs from process 0's only in what
    JAX hashes per process (:mod:`.processes`): the run's own explanation of its misses. Only
    the first lookups of such a process are compared (each module's manifests, from the index).
    """
    if _state.process_checks >= _MAX_PROCESS_CHECKS:
        return
    process = current_process()
    if process is None or process[0] == 0:
        return
    from cachedoctor.stablekeys import processes  # a job's process N > 0 only

    _state.process_checks += 1
    index = _index_for(cache_dir)
    found = processes.against_first(result, process[0], index.module(result.module_name))
    if found is not None:
        _state.stats["per_process_keys"] += 1
        _state.process_checks = _MAX_PROCESS_CHECKS
        _say_once("per-process", found.line())


def _has_partitioning(result: Any) -> bool:
    return any(v.field.startswith("custom_call[") for v in result.volatile)


def _manifest_exists(cache_dir: Location, key: str) -> bool:
    """Whether ``key`` has a manifest, from the index (no request per lookup)."""
    try:
        return bool(_index_for(cache_dir).has(key))
    except Exception:  # a bucket that cannot be reached: _record will count the error
        return False


def _record(
    cache_dir: Location,
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
            f"manifests {_shown(cache_dir)}",
            f"cannot write key manifests to {_shown(cache_dir)} ({type(exc).__name__}: {exc}):"
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
