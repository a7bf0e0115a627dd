"""Start-up shim that ``cachedoctor check`` puts first on PYTHONPATH for the command it runs.

When ``CACHEDOCTOR_CHECK_OBSERVE=1``, it installs cachedoctor's runtime hook in ``observe`` mode
right after ``jax`` is imported (never importing jax itself), so the hook records what the stable
key would have been. A hook that is already installed (``cachedoctor enable``) is left as it is.
It then runs the ``sitecustomize`` it shadows, if any. Silent and harmless when cachedoctor's
hook cannot be imported in that interpreter.
"""

import contextlib
import os
import sys
from typing import Any


def _activate_after_jax_import() -> None:
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
                try:
                    from cachedoctor import hook  # type: ignore[attr-defined,unused-ignore]

                    if hook.installed_mode() is None:
                        hook.install(mode="observe")
                except Exception:
                    pass

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


if os.environ.get("CACHEDOCTOR_CHECK_OBSERVE") == "1":
    with contextlib.suppress(Exception):
        _activate_after_jax_import()
with contextlib.suppress(Exception):
    _chain_shadowed_sitecustomize()
