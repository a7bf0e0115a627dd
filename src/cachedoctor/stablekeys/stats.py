"""Recording: count this process's persistent-cache requests per module, write one record at exit.

JAX counts its cache traffic only through its monitoring events, which live and die with the
process. :func:`start` registers listeners through JAX's public listener API
(``jax._src.monitoring.register_event_listener`` / ``register_event_duration_secs_listener``) and
wraps ``jax._src.compiler.compile_or_get_cached``, which only names the module the events that
follow belong to (a thread-local), and times the compiles that did not hit. Nothing is written
until the process exits: then one small JSON record goes into ``cachedoctor-stats/`` in the cache
directory (atomically; one object per process on ``gs://`` / ``s3://``).

The events, the same in JAX 0.4.38 .. 0.12 (detected, not assumed: an event this JAX never sends
leaves its counter at zero):

- ``/jax/compilation_cache/compile_requests_use_cache``: a compile that asks the cache;
- ``/jax/compilation_cache/cache_hits``: the executable came from the cache;
- ``/jax/compilation_cache/cache_misses``: despite its name, sent right *before* JAX's
  ``cache.put`` (which may still fail);
- ``/jax/compilation_cache/compile_time_saved_sec`` and ``cache_retrieval_time_sec``: durations
  on a hit.

A miss is a request without a hit (JAX's ``PERSISTENT COMPILATION CACHE MISS`` log line). Each
miss then has one outcome, decided as JAX's ``compiler._cache_write`` decides it (the same code
in 0.4.38 .. 0.12 but for host callbacks, below), each a counter of the module:

- ``writes``: the write event came and the entry exists afterwards (``<key>-cache`` in a local
  cache dir, one ``stat``; on ``gs://`` / ``s3://``: JAX's put returned, no request is made);
- ``write_failures``: JAX's put raised (JAX warns "Error writing persistent compilation cache
  entry for '...'": a missing ``-atime`` file under its LRU, a name too long, a full disk);
- ``writes_lost``: the write event came, JAX's put returned, and no entry exists (JAX's LRU
  drops an entry larger than ``max_size`` with a warning; or another process evicted it at once);
- ``refused_process``: this is not process 0 (JAX: "Not writing ... since process_id != 0");
- ``refused_host_callbacks``: the compile had host callbacks and this JAX's ``_cache_write``
  refuses them (JAX <= 0.10: "Not writing persistent cache entry for '...' because it uses host
  callbacks"). Detected, not assumed: JAX 0.12's ``_cache_write`` takes no ``host_callbacks``
  and stores such modules like any other (:func:`refuses_host_callbacks`);
- ``refused_compile_time``: JAX did not call its put with neither of those, the minimum compile
  time above 0: the one reason left in ``_cache_write`` (JAX: "because it took < ... seconds");
- ``refused_size``: JAX's put ran, sent no write event and raised nothing, the minimum entry
  size above 0 (JAX: "since its size ... is less than threshold").
- ``refused_read_only``: the process used the cache read-only (``readonly.py``): JAX's put ran
  and stored nothing, by the user's choice.

A miss that fits none (a compile that raised) has no outcome. The record also holds the cache
settings in force at exit (``config``). To see the put, :func:`start` also wraps
``compilation_cache.put_executable_and_time`` (under its own marker: the hook wraps it too).

Per key, a module also counts (``keys``, at most :data:`MAX_KEYS_PER_MODULE` keys; the rest only
in the module's counters): ``lookups`` (JAX asked its cache for this key), ``hits`` (the lookup
returned the executable) and ``writes`` (a miss whose outcome was ``writes``). The key comes from
``compilation_cache.get_executable_and_time(cache_key, ...)``, which ``compiler._cache_read``
calls with the key it looks up (the same call in 0.4.38 .. 0.12), wrapped under the same marker
discipline as the put; a write's key is the put's.

When JAX's load of an entry raises (it then warns "Error reading persistent compilation cache
entry" and compiles), the record keeps the key, JAX's error and, in a local cache, the file's
size, modification time and inode (``load_failures``, at most :data:`MAX_LOAD_FAILURES`): the
evidence ``scan`` and ``prune --corrupt`` need for damage that only JAX's own parser sees.

Recording never breaks or slows the program: memory is bounded (:data:`MAX_MODULES`), every
error is swallowed after one stderr line, and the only I/O before exit is one ``stat`` after a
write to a local cache, and one after a load JAX failed.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from cachedoctor.stablekeys import entry_files, misskeys, readonly

# The recorder's own clocks, bound once at import where a program's mocks cannot reach them:
# JAX's compilation_cache_test patches time.monotonic with ten values for two compiles, and
# each call the recorder took from it was one JAX's compiler then lacked (StopIteration). In a
# tuple, since freezegun replaces module attributes that are the real functions.
_CLOCKS = (time.monotonic, time.time)


def _monotonic() -> float:
    return _CLOCKS[0]()


def _wall() -> float:
    return _CLOCKS[1]()


RECORD_FORMAT = "cachedoctor-stats/1"
RECORD_SUFFIX = ".json"
MAX_MODULES = 4096  # beyond this many module names, counts go to OTHER_MODULE
MAX_KEYS_PER_MODULE = 16  # beyond this many keys of one module, only the module counts them
MAX_MISSED_KEYS = 64  # missed keys whose components a record keeps (``missed``: misskeys.py)
MAX_MISSED_BYTES = 8192  # a missed key's values beyond this are left out (its digests stay)
MAX_LOAD_FAILURES = 16  # entries JAX failed to load that a record names (``load_failures``)
MAX_LOAD_MESSAGE = 400  # characters of JAX's error kept per failure
KEY_COUNTS = ("lookups", "hits", "writes")  # per key, in a module's ``keys``
OTHER_MODULE = "(other modules)"
UNKNOWN_MODULE = "(unknown module)"  # an event outside compile_or_get_cached

EVENT_PREFIX = "/jax/compilation_cache/"
COUNTED_EVENTS = {
    EVENT_PREFIX + "compile_requests_use_cache": "requests",
    EVENT_PREFIX + "cache_hits": "hits",
    EVENT_PREFIX + "cache_misses": "writes",  # outside a compile; inside, an outcome decides
}
TIMED_EVENTS = {
    EVENT_PREFIX + "compile_time_saved_sec": "saved_secs",
    EVENT_PREFIX + "cache_retrieval_time_sec": "retrieval_secs",
}
# Each miss's outcome (see the module docstring); records before these existed lack them and
# count JAX's write event as ``writes``.
OUTCOMES = (
    "writes", "write_failures", "writes_lost", "refused_process", "refused_host_callbacks",
    "refused_compile_time", "refused_size", "refused_read_only",
)  # fmt: skip
COUNTERS = (
    "requests", "hits", "misses", *OUTCOMES, "compile_secs", "saved_secs", "retrieval_secs",
)  # fmt: skip
# The settings in force at exit, by JAX's config name (evidence for the refusals)
CONFIG_NAMES = {
    "min_compile_time_secs": "persistent_cache_min_compile_time_secs",
    "min_entry_size_bytes": "persistent_cache_min_entry_size_bytes",
    "max_size": "compilation_cache_max_size",
    # 1 when JAX's key leaves custom_partitioning pointers out: whether a key this process
    # wrote is computed again by another process (prune --duplicates' evidence of a writer)
    "remove_ptr_from_key": "remove_custom_partitioning_ptr_from_cache_key",
}


class _Call:
    """One compile_or_get_cached call on this thread: its module and what the events said.

    The events' counts wait here until the compile returns (one lock, then), and the module's
    name is read from the key JAX looked up (``<module>-<hex>``, its ``sym_name``), from the
    MLIR module only when there was no lookup. (Plain classes here: ``@dataclass`` costs
    ~0.4 ms at import, in every recording process's start.)"""

    def __init__(self, computation: Any, host_callbacks: bool = False) -> None:
        self._computation = computation
        self._module: str | None = None
        self.host_callbacks = host_callbacks
        self.requested = False
        self.hit = False
        self.write_event = False  # JAX sent cache_misses: it is about to put the entry
        self.get_key: str | None = None  # JAX called get_executable_and_time with this key
        self.put_key: str | None = None  # JAX called put_executable_and_time with this key
        self.put_failed = False  # ... and it raised
        self.missed: dict[str, Any] | None = None  # what went into the missed key (misskeys)
        self.added: dict[str, float] = {}  # counters the events added, counted at the end

    @property
    def module(self) -> str:
        if self._module is None:
            key = self.get_key or self.put_key
            if key is not None and "-" in key:
                self._module = key.rsplit("-", 1)[0]
            else:
                self._module = _sym_name(self._computation)
            self._computation = None
        return self._module


class _Recorder:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.started = _wall()
        self.modules: dict[str, dict[str, float]] = {}
        self.keys: dict[str, dict[str, dict[str, int]]] = {}  # module: key: n
        self.missed: dict[str, dict[str, Any]] = {}  # key: its components
        self.load_failures: dict[str, dict[str, Any]] = {}  # key: JAX's error
        self.warned = False
        self.written: str | None = None  # where the record went (for tests and `status`)


_recorder: _Recorder | None = None
_listening = False  # JAX's listeners are registered: this process records
_refuses_host_callbacks = True  # this JAX's _cache_write refuses them (set by start())
_lock = threading.Lock()
_local = threading.local()
_first_request: Callable[[], object] | None = None  # start()'s, until it is called
# called with each miss as it is counted (the pytest plugin's per-test causes); misses only
_miss_observers: list[Callable[[dict[str, Any]], object]] = []


def observe_misses(observer: Callable[[dict[str, Any]], object]) -> None:
    """Call ``observer`` in the compiling thread with each miss once counted: its ``module``,
    ``key``, ``outcome``, ``time`` and, when recorded, what went into the key (as ``missed``
    keeps it, whole). Misses only: a hit costs nothing more."""
    _miss_observers.append(observer)


def recording_mode() -> str | None:
    """The mode this process records in; None when it does not record (the hook is off, or
    JAX lacks the listener API)."""
    return _recorder.mode if _recorder is not None and _listening else None


def record_written() -> str | None:
    """Where this process's record went, once it is written (``stats_record``)."""
    return _recorder.written if _recorder is not None else None


def mark_record_written(where: str) -> None:
    """Note where the record went: one record per process."""
    if _recorder is not None:
        _recorder.written = where


def warn_once(message: str) -> None:
    """One stderr line for this process's first recording problem; the rest are silent."""
    if _recorder is not None and not _recorder.warned:
        _recorder.warned = True
        # one stderr line, never a Python warning: `-W error` would make it an exception
        with contextlib.suppress(Exception):
            sys.stderr.write(f"cachedoctor: stats recording: {message}\n")


def _counters(module: str) -> dict[str, float]:
    assert _recorder is not None
    modules = _recorder.modules
    found = modules.get(module)
    if found is None:
        if len(modules) >= MAX_MODULES:
            module = OTHER_MODULE
        found = modules.setdefault(module, dict.fromkeys(COUNTERS, 0))
    return found


def _current() -> _Call | None:
    call: _Call | None = getattr(_local, "call", None)
    return call


def _add(name: str, amount: float) -> None:
    call = _current()
    if call is None:
        with _lock:
            _counters(UNKNOWN_MODULE)[name] += amount
        return
    if name == "requests":
        call.requested = True
    elif name == "hits":
        call.hit = True
    elif name == "writes":  # its outcome is counted when the compile returns
        call.write_event = True
        return
    call.added[name] = call.added.get(name, 0) + amount


def _on_event(event: str, **kwargs: Any) -> None:
    try:
        name = COUNTED_EVENTS.get(event)
        if name is not None and _recorder is not None:
            _add(name, 1)
    except Exception as exc:  # never let a listener break a compile
        warn_once(f"{type(exc).__name__}: {exc}")


def _on_duration(event: str, duration_secs: float, **kwargs: Any) -> None:
    try:
        name = TIMED_EVENTS.get(event)
        if name is not None and _recorder is not None:
            _add(name, float(duration_secs))
    except Exception as exc:
        warn_once(f"{type(exc).__name__}: {exc}")


_SYM_NAME: list[Callable[[Any], str] | None] = [None]


def _computation(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The MLIR module of a ``compile_or_get_cached`` call."""
    return kwargs.get("computation", args[1] if len(args) > 1 else None)


def _sym_name(computation: Any) -> str:
    """The MLIR module's ``sym_name``: the name JAX puts before the hash in the cache key."""
    try:
        sym_name = _SYM_NAME[0]
        if sym_name is None:  # keys, imported at the first compile: recording stays light
            from cachedoctor.stablekeys import keys

            sym_name = _SYM_NAME[0] = keys._module_name
        return sym_name(computation)
    except Exception:
        return UNKNOWN_MODULE


def _host_callbacks_at(original: Callable[..., Any]) -> int | None:
    """Where ``compile_or_get_cached`` takes ``host_callbacks`` (position 4 in 0.4.38 .. 0.12)."""
    try:
        import inspect

        names = list(inspect.signature(original).parameters)
        return names.index("host_callbacks")
    except (TypeError, ValueError):
        return None


def _has_host_callbacks(at: int | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    try:
        if "host_callbacks" in kwargs:
            return bool(kwargs["host_callbacks"])
        return at is not None and len(args) > at and bool(args[at])
    except Exception:
        return False


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    at = _host_callbacks_at(original)

    def compile_or_get_cached(*args: Any, **kwargs: Any) -> Any:
        call = _Call(_computation(args, kwargs), _has_host_callbacks(at, args, kwargs))
        outer = _current()
        _local.call = call
        start = _monotonic()
        compiled = False
        try:
            result = original(*args, **kwargs)
            compiled = True
            return result
        finally:
            _local.call = outer
            misskeys.forget()
            if call.requested or call.added:
                try:
                    _finish(call, start, compiled)
                except Exception as exc:
                    warn_once(f"{type(exc).__name__}: {exc}")

    compile_or_get_cached.__cachedoctor_original__ = original  # type: ignore[attr-defined]
    compile_or_get_cached.__wrapped__ = original  # type: ignore[attr-defined]
    return compile_or_get_cached


def _finish(call: _Call, start: float, compiled: bool) -> None:
    """Count a compile that asked the cache: a miss's outcome, and the key's lookup, hit or
    write."""
    global _first_request
    outcome = None
    if _first_request is not None and call.requested:
        said, _first_request = _first_request, None
        said()
    if not call.hit and call.requested:
        outcome = _outcome(call) if compiled else None
    module = call.module
    with _lock:
        counters = _counters(module)
        for name, amount in call.added.items():
            counters[name] += amount
        if not call.requested:
            return
        if not call.hit:
            counters["misses"] += 1
            counters["compile_secs"] += _monotonic() - start
            if outcome is not None:
                counters[outcome] += 1
        if call.get_key is not None:
            _count_key(module, call.get_key, "lookups")
            if call.hit:
                _count_key(module, call.get_key, "hits")
        if outcome == "writes" and call.put_key is not None:
            _count_key(module, call.put_key, "writes")
        if not call.hit and call.missed is not None and call.get_key is not None:
            _keep_missed(call, outcome)
    if not call.hit and _miss_observers:
        doc = {**(call.missed or {}), "module": call.module, "key": call.get_key}
        for observer in _miss_observers:
            observer({**doc, "time": _wall(), "outcome": outcome})


def _keep_missed(call: _Call, outcome: str | None) -> None:
    """Keep what went into a missed key (under the lock), at most :data:`MAX_MISSED_KEYS`."""
    assert _recorder is not None and call.missed is not None and call.get_key is not None
    missed = _recorder.missed
    if call.get_key in missed or len(missed) >= MAX_MISSED_KEYS:
        return
    doc = {**call.missed, "module": call.module, "time": _wall(), "outcome": outcome}
    if len(json.dumps(doc.get("values", {}))) > MAX_MISSED_BYTES:
        values = doc["values"]
        doc["values"] = {k: v for k, v in values.items() if len(json.dumps(v)) <= 1024}
        doc["values_left_out"] = sorted(set(values) - set(doc["values"]))
    missed[call.get_key] = doc


def _count_key(module: str, key: str, name: str) -> None:
    """One more ``name`` for ``key`` in its module's ``keys`` (under the lock); a key beyond
    :data:`MAX_KEYS_PER_MODULE` is left to the module's counters."""
    assert _recorder is not None
    if module not in _recorder.modules:
        module = OTHER_MODULE  # as _counters filed it
    keys = _recorder.keys.setdefault(module, {})
    counts = keys.get(key)
    if counts is None:
        if len(keys) >= MAX_KEYS_PER_MODULE:
            return
        counts = keys[key] = dict.fromkeys(KEY_COUNTS, 0)
    counts[name] += 1


def _outcome(call: _Call) -> str | None:
    """What became of a compile that missed, as JAX's ``_cache_write`` decided (module doc)."""
    if (call.write_event or call.put_key is not None) and readonly.active():
        return "refused_read_only"
    if call.write_event:
        if call.put_failed:
            return "write_failures"
        if call.put_key is not None and not entry_files.entry_exists(call.put_key):
            return "writes_lost"
        return "writes"
    if call.put_key is not None:
        if call.put_failed:
            return "write_failures"
        return "refused_size" if (_config_value("min_entry_size_bytes") or 0) > 0 else None
    from jax._src import distributed

    if distributed.global_state.process_id != 0:
        return "refused_process"
    if call.host_callbacks and _refuses_host_callbacks:
        return "refused_host_callbacks"
    return "refused_compile_time" if (_config_value("min_compile_time_secs") or 0) > 0 else None


def refuses_host_callbacks(cache_write: Callable[..., Any] | None) -> bool:
    """Whether JAX's ``compiler._cache_write`` refuses a module with host callbacks: it takes
    them as its ``host_callbacks`` parameter (0.4.38 .. 0.10) only to refuse them; 0.12's takes
    none and writes such a module like any other."""
    if cache_write is None:
        return True  # as 0.4.38 .. 0.10.2 do
    try:
        import inspect

        return "host_callbacks" in inspect.signature(cache_write).parameters
    except (TypeError, ValueError):
        return True


def _config_value(name: str) -> float | None:
    """A cache setting in force (:data:`CONFIG_NAMES`); None when this JAX lacks it."""
    try:
        from jax._src import config

        value = getattr(config, CONFIG_NAMES[name]).value
    except Exception:
        return None
    if isinstance(value, bool):  # a flag, kept as a number like the other settings
        return float(value)
    if not isinstance(value, int | float):
        return None
    return value


def _wrap_put(original: Callable[..., Any]) -> Callable[..., Any]:
    """JAX's ``put_executable_and_time``, noting on this thread's call that it ran, for which
    key, and whether it raised (JAX then warns "Error writing ..."; the error goes on)."""

    def put_executable_and_time(cache_key: Any, *args: Any, **kwargs: Any) -> Any:
        call = _current()
        if call is not None:
            call.put_key = str(cache_key)
        try:
            return original(cache_key, *args, **kwargs)
        except BaseException:
            if call is not None:
                call.put_failed = True
            raise

    put_executable_and_time.__cachedoctor_stats_original__ = original  # type: ignore[attr-defined]
    put_executable_and_time.__wrapped__ = original  # type: ignore[attr-defined]
    return put_executable_and_time


def _wrap_get(original: Callable[..., Any]) -> Callable[..., Any]:
    """JAX's ``get_executable_and_time``, noting on this thread's call which key it looks up."""

    def get_executable_and_time(cache_key: Any, *args: Any, **kwargs: Any) -> Any:
        call = _current()
        if call is not None:
            with contextlib.suppress(Exception):
                call.get_key = str(cache_key)
        try:
            result = original(cache_key, *args, **kwargs)
        except Exception as exc:  # JAX warns "Error reading ..." and compiles; the error goes on
            try:
                _note_load_failure(call, str(cache_key), exc)
            except Exception as note_exc:
                warn_once(f"{type(note_exc).__name__}: {note_exc}")
            raise
        if call is not None and isinstance(result, tuple) and result and result[0] is None:
            try:  # a miss: what went into the key, while JAX's arguments are as it hashed them
                call.missed = misskeys.describe_miss(str(cache_key))
            except Exception as exc:
                warn_once(f"{type(exc).__name__}: {exc}")
        return result

    get_executable_and_time.__cachedoctor_stats_original__ = original  # type: ignore[attr-defined]
    get_executable_and_time.__wrapped__ = original  # type: ignore[attr-defined]
    return get_executable_and_time


def _note_load_failure(call: _Call | None, key: str, exc: Exception) -> None:
    """Keep JAX's error on loading ``key`` (at most :data:`MAX_LOAD_FAILURES` a record) and,
    in a local cache, the file's identity then: evidence that these very bytes do not load
    (``core/usage/load_failures.py`` decides what it proves)."""
    if _recorder is None:
        return
    doc: dict[str, Any] = {
        "module": call.module if call is not None else UNKNOWN_MODULE,
        "time": _wall(),
        "error": type(exc).__name__,
        "message": str(exc)[:MAX_LOAD_MESSAGE],
        "file": entry_files.file_identity(key),
    }
    with _lock:
        failures = _recorder.load_failures
        if key not in failures and len(failures) < MAX_LOAD_FAILURES:
            failures[key] = doc


def start(mode: str, first_request: Callable[[], object] | None = None) -> bool:
    """Begin recording in this process (idempotent); False, after one warning, when JAX lacks
    the listener API or ``compile_or_get_cached``. ``first_request`` is called once, as the
    first compile that asks the cache ends (JAX has opened its cache: ``stats_record``)."""
    global _recorder, _listening, _refuses_host_callbacks, _first_request
    with _lock:
        if _recorder is not None:
            return True
        _recorder = _Recorder(mode)
    try:
        from jax._src import compilation_cache, compiler, monitoring

        _refuses_host_callbacks = refuses_host_callbacks(getattr(compiler, "_cache_write", None))
        original = compiler.compile_or_get_cached
        if getattr(original, "__cachedoctor_original__", None) is None:
            compiler.compile_or_get_cached = _wrap(original)
        put = compilation_cache.put_executable_and_time
        if getattr(put, "__cachedoctor_stats_original__", None) is None:
            compilation_cache.put_executable_and_time = _wrap_put(put)
        get = getattr(compilation_cache, "get_executable_and_time", None)  # keys: optional
        with contextlib.suppress(Exception):  # missed keys' components: optional
            misskeys.wrap_cache_key_get()
        if get is not None and getattr(get, "__cachedoctor_stats_original__", None) is None:
            compilation_cache.get_executable_and_time = _wrap_get(get)
        monitoring.register_event_listener(_on_event)
        monitoring.register_event_duration_secs_listener(_on_duration)
        _listening = True
    except Exception as exc:
        warn_once(f"this JAX has no usable monitoring API ({type(exc).__name__}: {exc})")
        return False
    _first_request = first_request
    return True


def recorded() -> dict[str, Any] | None:
    """This process's counts so far, copied under the lock (None when not recording), with
    the recorder's mode and start, the time now and the cache settings in force: what
    ``stats_record.snapshot`` makes the record of."""
    recorder = _recorder
    if recorder is None:
        return None
    with _lock:
        modules: dict[str, dict[str, Any]] = {}
        for name, c in recorder.modules.items():
            modules[name] = dict(c)
            keys = recorder.keys.get(name)
            if keys:
                modules[name]["keys"] = {key: dict(n) for key, n in keys.items()}
        missed = {key: dict(doc) for key, doc in recorder.missed.items()}
        load_failures = {key: dict(doc) for key, doc in recorder.load_failures.items()}
    return {
        "mode": recorder.mode,
        "start": recorder.started,
        "end": _wall(),
        "config": {name: _config_value(name) for name in CONFIG_NAMES},
        "modules": modules,
        "missed": missed,
        "load_failures": load_failures,
    }
