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
- ``/jax/compilation_cache/cache_misses``: despite its name, sent when an entry is *written*;
- ``/jax/compilation_cache/compile_time_saved_sec`` and ``cache_retrieval_time_sec``: durations
  on a hit.

A miss is a request without a hit (JAX's ``PERSISTENT COMPILATION CACHE MISS`` log line).
Recording never breaks or slows the program: memory is bounded (:data:`MAX_MODULES`), every
error is swallowed after one stderr line, and the only I/O happens at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.storage.files import atomic_file
from cachedoctor.storage.urls import is_url

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
OTHER_MODULE = "(other modules)"
UNKNOWN_MODULE = "(unknown module)"  # an event outside compile_or_get_cached

EVENT_PREFIX = "/jax/compilation_cache/"
COUNTED_EVENTS = {
    EVENT_PREFIX + "compile_requests_use_cache": "requests",
    EVENT_PREFIX + "cache_hits": "hits",
    EVENT_PREFIX + "cache_misses": "writes",
}
TIMED_EVENTS = {
    EVENT_PREFIX + "compile_time_saved_sec": "saved_secs",
    EVENT_PREFIX + "cache_retrieval_time_sec": "retrieval_secs",
}
COUNTERS = (
    "requests",
    "hits",
    "misses",
    "writes",
    "compile_secs",
    "saved_secs",
    "retrieval_secs",
)


@dataclass
class _Call:
    """One compile_or_get_cached call on this thread: its module and what the events said."""

    module: str
    requested: bool = False
    hit: bool = False


@dataclass
class _Recorder:
    mode: str
    started: float = field(default_factory=_wall)
    modules: dict[str, dict[str, float]] = field(default_factory=dict)
    warned: bool = False
    written: str | None = None  # where the record went (for tests and `status`)


_recorder: _Recorder | None = None
_listening = False  # JAX's listeners are registered: this process records
_lock = threading.Lock()
_local = threading.local()


def _warn_once(message: str) -> None:
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
    if call is not None:
        if name == "requests":
            call.requested = True
        elif name == "hits":
            call.hit = True
    with _lock:
        counters = _counters(call.module if call is not None else UNKNOWN_MODULE)
        counters[name] += amount


def _on_event(event: str, **kwargs: Any) -> None:
    try:
        name = COUNTED_EVENTS.get(event)
        if name is not None and _recorder is not None:
            _add(name, 1)
    except Exception as exc:  # never let a listener break a compile
        _warn_once(f"{type(exc).__name__}: {exc}")


def _on_duration(event: str, duration_secs: float, **kwargs: Any) -> None:
    try:
        name = TIMED_EVENTS.get(event)
        if name is not None and _recorder is not None:
            _add(name, float(duration_secs))
    except Exception as exc:
        _warn_once(f"{type(exc).__name__}: {exc}")


def _module_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The MLIR module's ``sym_name``: the name JAX puts before the hash in the cache key."""
    computation = kwargs.get("computation", args[1] if len(args) > 1 else None)
    try:
        from cachedoctor.stablekeys.keys import _module_name as sym_name

        return sym_name(computation)
    except Exception:
        return UNKNOWN_MODULE


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    def compile_or_get_cached(*args: Any, **kwargs: Any) -> Any:
        call = _Call(_module_name(args, kwargs))
        outer = _current()
        _local.call = call
        start = _monotonic()
        try:
            return original(*args, **kwargs)
        finally:
            _local.call = outer
            if call.requested and not call.hit:
                try:
                    with _lock:
                        counters = _counters(call.module)
                        counters["misses"] += 1
                        counters["compile_secs"] += _monotonic() - start
                except Exception as exc:
                    _warn_once(f"{type(exc).__name__}: {exc}")

    compile_or_get_cached.__cachedoctor_original__ = original  # type: ignore[attr-defined]
    compile_or_get_cached.__wrapped__ = original  # type: ignore[attr-defined]
    return compile_or_get_cached


def start(mode: str) -> bool:
    """Begin recording in this process (idempotent); False, after one warning, when JAX lacks
    the listener API or ``compile_or_get_cached``."""
    global _recorder, _listening
    with _lock:
        if _recorder is not None:
            return True
        _recorder = _Recorder(mode)
    try:
        from jax._src import compiler, monitoring

        original = compiler.compile_or_get_cached
        if getattr(original, "__cachedoctor_original__", None) is None:
            compiler.compile_or_get_cached = _wrap(original)
        monitoring.register_event_listener(_on_event)
        monitoring.register_event_duration_secs_listener(_on_duration)
        _listening = True
    except Exception as exc:
        _warn_once(f"this JAX has no usable monitoring API ({type(exc).__name__}: {exc})")
        return False
    _at_exit(write_record)
    return True


def _at_exit(fn: Callable[[], object]) -> None:
    """Run ``fn`` as the program ends, while thread pools still take work.

    ``atexit`` handlers run after ``concurrent.futures`` has shut every pool down, and a bucket
    write needs one (aiobotocore opens its connection through ``asyncio.to_thread``: "cannot
    schedule new futures after shutdown", so no record ever reached S3). Python's hook for
    that (``threading._register_atexit``, what ``concurrent.futures`` itself uses) runs before
    the pools stop, in the reverse order of registration: the pools' own hook must be there
    first (``concurrent.futures.thread`` registers it when imported, which may not have
    happened yet); without the hook, plain ``atexit``.
    """
    import concurrent.futures.thread  # noqa: F401 - registers the pools' exit hook before ours

    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(fn)
    except RuntimeError:
        atexit.register(fn)


def snapshot() -> dict[str, Any] | None:
    """This process's record so far (None when not recording)."""
    recorder = _recorder
    if recorder is None:
        return None
    with _lock:
        modules = {name: dict(c) for name, c in recorder.modules.items()}
    import jax

    return {
        "format": RECORD_FORMAT,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "start": recorder.started,
        "end": _wall(),
        "jax": str(getattr(jax, "__version__", "")),
        "hook": recorder.mode,
        "modules": modules,
    }


def recording() -> dict[str, str | None] | None:
    """In which mode this process records, and where its record will go (for ``status``).

    None when it does not record (the hook is off, or JAX lacks the listener API).
    """
    recorder = _recorder
    if recorder is None or not _listening:
        return None
    try:
        cache_dir = _cache_dir()
    except Exception:
        cache_dir = None
    where = f"{cache_dir.rstrip('/')}/{STATS_DIRNAME}/" if cache_dir else None
    return {"mode": recorder.mode, "records": where}


def _cache_dir() -> str | None:
    from jax._src import config

    value = config.compilation_cache_dir.value
    return str(value) if value else None


def record_name(record: dict[str, Any]) -> str:
    """A file name no other process picks: host, pid, start time and a random tag."""
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(record["host"]))[:64]
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(float(record["start"])))
    return f"{stamp}-{host}-{record['pid']}-{uuid.uuid4().hex[:8]}{RECORD_SUFFIX}"


def write_record() -> str | None:
    """At exit: write this process's record into the cache dir; never raises.

    Nothing is written when no compile asked the cache (a process that merely imported JAX).
    """
    try:
        record = snapshot()
        cache_dir = _cache_dir()
        if record is None or cache_dir is None or _recorder is None or _recorder.written:
            return None
        if not any(c["requests"] for c in record["modules"].values()):
            return None
        name = f"{STATS_DIRNAME}/{record_name(record)}"
        data = json.dumps(record, sort_keys=True).encode()
        if is_url(cache_dir):
            from cachedoctor.stablekeys.manifest import share_jax_filesystem, store_for

            share_jax_filesystem()
            store = store_for(cache_dir)  # JAX's own filesystem (the hook's store): no client
            store.write_atomic(name, data)
            _recorder.written = store.url_of(name)
        else:  # no store: importing one at exit would register exit handlers after shutdown
            path = os.path.join(cache_dir, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with atomic_file(path, temp_prefix=".cachedoctor-tmp-") as fh:
                fh.write(data)
            _recorder.written = path
        return _recorder.written
    except Exception as exc:
        _warn_once(f"could not write the stats record ({type(exc).__name__}: {exc})")
        return None
