"""What JAX in this environment would hash into a key, without the program: for ``preflight``.

Six of the eight components of JAX's key do not depend on the program: ``jax_lib version``,
``backend version``, ``XLA flags``, ``accelerator_config`` (for a given set of devices),
``compression`` and ``custom_hook``. The compile options do in part (replicas, partitions,
sharding propagation), and in part do not (the debug options XLA_FLAGS and the cache directory
set, the effort levels JAX's settings set). This module runs JAX's own key code
(``compilation_cache.get_cache_key`` through the recording hash of :mod:`keys`) on a one-line
program lowered here, for each device count asked, with the compile options JAX's
``compiler.get_compile_options`` makes for it, so that every digest and value is the one JAX
would compute in this process for a program on that many devices.

First the settings a job's process of this environment starts with are applied, as start-up
activation applies them (the config file's JAX settings, the XLA_FLAGS of a bucket's local
sub-caches), without the hook. JAX's ``jax_compilation_cache_dir`` is then the spelling asked,
for the time of the call (the directory the job will use: the sub-cache paths under it are
hashed into the compile options). Nothing is compiled, so nothing is read from or written to
any cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


class ProbeError(Exception):
    """JAX cannot be imported or its key code is not what cachedoctor knows (one line)."""


@dataclass(frozen=True)
class HereKey:
    """The program-independent part of JAX's key here, for programs on ``count`` devices."""

    count: int
    components: dict[str, str]  # JAX's component name -> digest (computation: a stand-in's)
    values: dict[str, list[str]]  # the hashed pieces of the small components (misskeys form)


@dataclass(frozen=True)
class Here:
    """This environment as JAX's key sees it."""

    jax: str
    jaxlib: str
    platform: str
    platform_version: str
    device_count: int
    device_kinds: list[str]
    cache_dir: str
    xla_caches: str | None
    settings: dict[str, Any]
    keys: dict[int, HereKey] = field(default_factory=dict)  # by device count

    def to_dict(self) -> dict[str, Any]:
        return {
            "jax": self.jax,
            "jaxlib": self.jaxlib,
            "platform": self.platform,
            "platform_version": self.platform_version,
            "device_count": self.device_count,
            "device_kinds": self.device_kinds,
            "cache_dir": self.cache_dir,
            "xla_caches": self.xla_caches,
            "settings": self.settings,
        }


@contextlib.contextmanager
def _cache_dir_set(spelling: str) -> Iterator[None]:
    """JAX's ``jax_compilation_cache_dir`` is ``spelling`` for the block (restored after)."""
    import jax
    from jax._src import config

    before = config.compilation_cache_dir.value
    jax.config.update("jax_compilation_cache_dir", spelling)  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_dir", before)  # type: ignore[no-untyped-call]


def _options(devices: list[Any], backend: Any) -> Any:
    """JAX's compile options for a program partitioned over ``devices`` (one replica)."""
    import numpy as np
    from jax._src import compiler

    assignment = np.array([[d.id for d in devices]])
    try:
        return compiler.get_compile_options(
            num_replicas=1,
            num_partitions=len(devices),
            device_assignment=assignment,
            backend=backend,
        )
    except TypeError:  # a JAX whose get_compile_options takes no backend
        return compiler.get_compile_options(
            num_replicas=1, num_partitions=len(devices), device_assignment=assignment
        )


def _key_for(count: int, devices: list[Any], backend: Any, module: Any) -> HereKey:
    import numpy as np

    from cachedoctor.stablekeys import misskeys, splithash

    chosen = devices[:count]
    try:
        _, split = splithash.jax_key(module, np.array(chosen), _options(chosen, backend), backend)
    except splithash.InternalsChanged as exc:
        raise ProbeError(f"JAX's key code did not hash through cachedoctor's: {exc}") from exc
    return HereKey(count, dict(split.components), misskeys.shown_values(split.chunks))


def probe(cache_dir: str, counts: Iterable[int]) -> Here:
    """This environment's JAX, and its key's program-independent components for each device
    count in ``counts`` that this machine has (raises :class:`ProbeError` in one line)."""
    try:
        from cachedoctor.stablekeys import _startup

        errors = _startup.as_a_job_starts()  # before JAX reads XLA_FLAGS
        if errors:
            raise ProbeError("; ".join(errors))
        import jax
        import jax.numpy as jnp
        import jaxlib
        from jax._src import config, xla_bridge

        from cachedoctor.stablekeys import misskeys, splithash

        splithash.check_internals()
    except Exception as exc:  # ImportError, InternalsChanged, a backend that fails to start
        raise ProbeError(f"cannot ask JAX what it would hash here: {exc}") from exc
    try:
        backend = xla_bridge.get_backend()
        devices = list(jax.devices())
        with _cache_dir_set(cache_dir):
            # an abstract argument: lowering it compiles and dispatches nothing
            scalar = jax.ShapeDtypeStruct((), jnp.float32)  # type: ignore[no-untyped-call]
            module = jax.jit(lambda x: x + 1).lower(scalar).compiler_ir()
            found = {
                n: _key_for(n, devices, backend, module)
                for n in sorted(set(counts))
                if 0 < n <= len(devices)
            }
            xla_caches = config.persistent_cache_enable_xla_caches.value
    except ProbeError:
        raise
    except Exception as exc:
        raise ProbeError(f"JAX failed computing a key here: {type(exc).__name__}: {exc}") from exc
    return Here(
        jax=jax.__version__,
        jaxlib=str(getattr(jaxlib, "__version__", "?")),
        platform=backend.platform,
        platform_version=str(backend.platform_version),
        device_count=len(devices),
        device_kinds=sorted({str(d.device_kind) for d in devices}),
        cache_dir=cache_dir,
        xla_caches=None if xla_caches is None else str(xla_caches),
        settings=misskeys.lowering_settings(),
        keys=found,
    )
