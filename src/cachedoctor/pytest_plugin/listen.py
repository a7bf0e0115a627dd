"""JAX's monitoring events, counted per test: one pair of listeners for the whole process,
routed to the test that runs (JAX 0.4.38 .. 0.7 cannot unregister a listener by name, so they
stay installed and count nothing between runs they are not told of).

The events (``jax/_src/dispatch.py``, ``compiler.py``; the same names in 0.4.38 .. 0.12, but
detected in this JAX's source, never assumed: :func:`missing_events`):

- ``/jax/core/compile/backend_compile_duration``: around ``compile_or_get_cached``, once per
  program JAX takes to its compile step, compiled or loaded from the persistent cache;
- ``/jax/core/compile/jaxpr_trace_duration``, ``jaxpr_to_mlir_module_duration``: tracing and
  lowering;
- ``/jax/compilation_cache/compile_requests_use_cache``, ``cache_hits``: a compile asked the
  persistent cache, and found the executable (a miss is a request without a hit, as JAX logs it);
- ``/jax/compilation_cache/compile_time_saved_sec``: what a hit saved, as JAX reckons it.

A miss's module and cause come from the stats recorder (``stablekeys/stats.observe_misses``)
when it runs in the process; else the module is the name JAX's compile event gives (``jit(f)``;
none in 0.4.38) and the cause unknown.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Any

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
HITS = "/jax/compilation_cache/cache_hits"
SAVED = "/jax/compilation_cache/compile_time_saved_sec"
EVENTS = (BACKEND_COMPILE, TRACE, LOWER, REQUESTS, HITS, SAVED)
# where each event is sent: the modules whose source names it
SENT_IN = ("jax._src.dispatch", "jax._src.compiler", "jax._src.interpreters.pxla")
UNNAMED = "(module not named by this JAX's events)"


@dataclass
class Tally:
    """What one test (or the time outside tests) compiled so far."""

    compilations: int = 0
    compile_secs: float = 0.0
    trace_secs: float = 0.0
    lower_secs: float = 0.0
    requests: int = 0
    hits: int = 0
    saved_secs: float = 0.0
    # each miss: the module, and the recorder's description of it (None: recorder off)
    misses: list[tuple[str, dict[str, Any] | None]] = field(default_factory=list)


@dataclass
class _Compile:
    """The compile in progress on a thread: what the cache events said of it so far."""

    requested: bool = False
    hit: bool = False
    described: dict[str, Any] | None = None


class Listener:
    """JAX's listeners, counting into the current :class:`Tally`."""

    def __init__(self) -> None:
        self.current = Tally()
        self.installed = False
        self.recorder_seen = False  # the stats recorder described a miss in this process
        self._lock = threading.Lock()
        self._local = threading.local()

    def switch(self) -> Tally:
        """Start a new tally; the one it replaces (what ran since the last switch)."""
        with self._lock:
            done, self.current = self.current, Tally()
        return done

    def install(self) -> bool:
        """Register with JAX once ``jax`` is imported (never imports it: a suite's conftest may
        set JAX's environment before its own import). True once registered."""
        if self.installed:
            return True
        if "jax._src.monitoring" not in sys.modules:
            return False
        from jax._src import monitoring

        monitoring.register_event_listener(self.on_event)
        monitoring.register_event_duration_secs_listener(self.on_duration)
        # the stats recorder, where the hook's start-up (run as jax was imported) loaded it
        stats = sys.modules.get("cachedoctor.stablekeys.stats")
        observe = getattr(stats, "observe_misses", None)
        if callable(observe):
            observe(self.on_miss)
        self.installed = True
        return True

    def _compile(self) -> _Compile:
        found: _Compile | None = getattr(self._local, "compile", None)
        if found is None:
            found = self._local.compile = _Compile()
        return found

    def on_event(self, event: str, *args: Any, **kwargs: Any) -> None:
        if event == REQUESTS:
            self._local.compile = _Compile(requested=True)
            with self._lock:
                self.current.requests += 1
        elif event == HITS:
            self._compile().hit = True
            with self._lock:
                self.current.hits += 1

    def on_duration(self, event: str, *args: Any, **kwargs: Any) -> None:
        if event not in EVENTS:
            return
        secs = float(args[0] if args else kwargs.get("duration_secs", kwargs.get("duration", 0)))
        with self._lock:
            tally = self.current
            if event == BACKEND_COMPILE:
                tally.compilations += 1
                tally.compile_secs += secs
                done = self._compile()
                self._local.compile = None
                if done.requested and not done.hit:
                    tally.misses.append(self._missed(done, kwargs))
            elif event == TRACE:
                tally.trace_secs += secs
            elif event == LOWER:
                tally.lower_secs += secs
            elif event == SAVED:
                tally.saved_secs += secs

    def _missed(self, done: _Compile, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
        if done.described is not None:
            return str(done.described.get("module")), done.described
        return str(kwargs.get("fun_name") or UNNAMED), None

    def on_miss(self, doc: dict[str, Any]) -> None:
        """The stats recorder's description of the miss on this thread (before JAX's compile
        event closes it)."""
        self.recorder_seen = True
        self._compile().described = doc


def missing_events() -> list[str]:
    """The events this JAX's source never names (their counts are unknown, not 0)."""
    import inspect

    text = ""
    for name in SENT_IN:
        module = sys.modules.get(name)
        if module is None:
            continue
        try:
            text += inspect.getsource(module)
        except (OSError, TypeError):
            return []  # no source to tell: assume nothing missing rather than everything
    if not text:
        return []
    constants = {
        BACKEND_COMPILE: "BACKEND_COMPILE_EVENT",
        TRACE: "JAXPR_TRACE_EVENT",
        LOWER: "JAXPR_TO_MLIR_MODULE_EVENT",
    }
    return [e for e in EVENTS if e not in text and constants.get(e, e) not in text]


def recorder_mode() -> str | None:
    """The stats recorder's mode in this process (None: it does not record)."""
    stats = sys.modules.get("cachedoctor.stablekeys.stats")
    mode = getattr(stats, "recording_mode", None)
    return mode() if callable(mode) else None


def cache_dir_setting() -> str | None:
    """JAX's persistent cache folder in force (None: unset, or jax not imported)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        value = jax.config.jax_compilation_cache_dir
    except Exception:
        return None
    return str(value) if value else None


def jax_version() -> str | None:
    jax = sys.modules.get("jax")
    return None if jax is None else str(getattr(jax, "__version__", "")) or None
