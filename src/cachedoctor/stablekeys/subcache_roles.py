"""The multi-host roles of XLA's autotune sub-cache when activation keeps it local.

JAX puts the per-fusion autotune sub-cache in the cache dir and gives it a mode per process:
UPDATE in process 0, READ in the others, so that one process of a job writes it
(``jax/_src/compiler.py:get_compile_options`` in every supported release; the JAX pull request
of seed 004: "set it to update for process 0 and read-only for the other processes").

With a ``gs://`` / ``s3://`` cache dir, start-up activation turns JAX's sub-caches off
(``jax_persistent_cache_enable_xla_caches=none``) and names a local folder in ``XLA_FLAGS``
instead (XLA cannot write a URL). JAX's branch that sets the mode then never runs and every
process keeps XLA's default, UPDATE. :func:`install` wraps ``get_compile_options`` to do what
that branch does, for the folder activation chose: the mode by JAX's own process id. JAX
clears the mode before hashing (``cache_key.py``, flag and field, 0.4.38 to 0.12), so no key
changes. The kernel cache file has no per-process mode in JAX either.

Checked, not assumed: ``pxla`` must call ``compiler.get_compile_options`` through the module
and jaxlib must have ``AutotuneCacheMode``; otherwise JAX is left as it is and one line on
stderr says what that means.
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any

AUTOTUNE_FIELD = "xla_gpu_per_fusion_autotune_cache_dir"
MODE_FIELD = "xla_gpu_experimental_autotune_cache_mode"


def _calls_through_module(module: Any, attribute: str) -> bool:
    """Whether some function of ``module`` reaches ``attribute`` as an attribute, not a name."""
    if attribute in vars(module):
        return False  # imported by name: patching the defining module would not reach it
    for obj in vars(module).values():
        for fn in (obj, *vars(obj).values()) if isinstance(obj, type) else (obj,):
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            if isinstance(code, types.CodeType) and _names(code, attribute):
                return True
    return False


def _names(code: types.CodeType, attribute: str) -> bool:
    if attribute in code.co_names:
        return True
    return any(isinstance(c, types.CodeType) and _names(c, attribute) for c in code.co_consts)


def install(autotune_dir: str | None, *, read_only: bool = False) -> bool:
    """Give the autotune sub-cache at ``autotune_dir`` JAX's per-process modes; idempotent.

    ``read_only`` (the cache is used read-only, ``readonly.py``): READ in every process, for
    the sub-cache wherever it is (``autotune_dir`` None: JAX's own, under the cache dir).
    False (after one line on stderr) when this JAX's internals are not what that needs.
    """
    try:
        from jax._src import compiler
        from jax._src.interpreters import pxla
        from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

        modes = (xc.AutotuneCacheMode.UPDATE, xc.AutotuneCacheMode.READ)
        original = compiler.get_compile_options
        if not _calls_through_module(pxla, "get_compile_options"):
            raise RuntimeError("pxla does not call compiler.get_compile_options")
    except Exception as exc:
        said = (
            f"cannot give XLA's autotune sub-cache the READ mode on this JAX ({type(exc).__name__}:"
            f" {exc}): XLA may update it although the cache is read-only"
            if read_only
            else f"cannot give the local autotune sub-cache {autotune_dir} JAX's per-process"
            f" modes on this JAX ({type(exc).__name__}: {exc}); every process of a"
            " multi-process job updates it (XLA's default)"
        )
        with contextlib.suppress(Exception):
            sys.stderr.write(f"cachedoctor: {said}\n")
        return False
    if getattr(original, "__cachedoctor_original__", None) is not None:
        return True

    def get_compile_options(*args: Any, **kwargs: Any) -> Any:
        options = original(*args, **kwargs)
        with contextlib.suppress(Exception):  # never break a compile: XLA's default stays
            debug = options.executable_build_options.debug_options
            folder = getattr(debug, AUTOTUNE_FIELD, "")
            if read_only and folder:
                setattr(debug, MODE_FIELD, modes[1])
            elif folder and folder == autotune_dir:
                from jax._src import distributed

                first = distributed.global_state.process_id == 0
                setattr(debug, MODE_FIELD, modes[0] if first else modes[1])
        return options

    get_compile_options.__cachedoctor_original__ = original  # type: ignore[attr-defined]
    get_compile_options.__wrapped__ = original  # type: ignore[attr-defined]
    compiler.get_compile_options = get_compile_options
    return True


def roles(process_ids: tuple[int, ...] = (0, 1)) -> dict[str, Any]:
    """What ``get_compile_options`` gives each of these process ids in this interpreter: the
    autotune sub-cache folder and mode, and the kernel cache file (for ``status``).

    The process id is set only for the call (JAX's own global), then put back.
    """
    from jax._src import compiler, distributed

    out: dict[str, Any] = {}
    state = distributed.global_state
    saved = state.process_id
    try:
        for pid in process_ids:
            state.process_id = pid
            options = compiler.get_compile_options(1, 1)  # kept: debug points into it
            debug = options.executable_build_options.debug_options
            mode = getattr(debug, MODE_FIELD, None)
            out[str(pid)] = {
                "autotune_dir": getattr(debug, AUTOTUNE_FIELD, "") or None,
                "autotune_mode": str(getattr(mode, "name", mode)) if mode is not None else None,
                "kernel_cache_file": getattr(debug, "xla_gpu_kernel_cache_file", "") or None,
            }
    finally:
        state.process_id = saved
    return out


def autotune_mode(options: Any) -> str | None:
    """The autotune sub-cache mode the compile options carry (None: no autotune sub-cache)."""
    try:
        debug = options.executable_build_options.debug_options
        if not getattr(debug, AUTOTUNE_FIELD, ""):
            return None
        mode = getattr(debug, MODE_FIELD)
    except Exception:
        return None
    return str(getattr(mode, "name", mode))
