"""Start-up shim that ``cachedoctor check`` puts first on PYTHONPATH for the command it runs.

It activates cachedoctor's runtime hook in the mode ``CACHEDOCTOR_HOOK`` names (``check`` sets
``observe``: JAX keeps its keys, the hook records key manifests) even where cachedoctor's
start-up ``.pth`` is not installed, e.g. when running from a source checkout. With
``stablekeys._startup`` available it simply calls its ``startup()`` (idempotent, so a ``.pth``
that already ran is harmless); otherwise it installs the hook right after ``jax`` is imported,
never importing jax itself. A hook already installed is left as it is. Then it runs the
``sitecustomize`` it shadows, if any. Silent and harmless when cachedoctor cannot be imported.
"""

import contextlib
import os
import sys
from typing import Any


def _activate(mode: str) -> None:
    try:
        from cachedoctor.stablekeys._startup import startup  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pass
    else:
        startup()
        return
    import importlib.util

    class _AfterJax:
        def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
            if name != "jax":
                return None
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            spec = importlib.util.find_spec("jax")
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            original = loader.exec_module

            def exec_module(module: Any) -> None:
                original(module)
                with contextlib.suppress(Exception):
                    from cachedoctor.stablekeys import hook  # type: ignore[attr-defined,unused-ignore]

                    if hook.installed_mode() is None:
                        hook.install(mode=mode)

            loader.exec_module = exec_module
            return spec

    if "jax" not in sys.modules:
        sys.meta_path.insert(0, _AfterJax())


def _chain_shadowed_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_mode = os.environ.get("CACHEDOCTOR_HOOK", "")
_verify = bool(os.environ.get("CACHEDOCTOR_VERIFY_FRESH"))  # check --verify's run
if (_mode in ("observe", "stable") or _verify) and os.environ.get("CACHEDOCTOR_DISABLE") != "1":
    with contextlib.suppress(Exception):
        _activate(_mode)
with contextlib.suppress(Exception):
    _chain_shadowed_sitecustomize()
