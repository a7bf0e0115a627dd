"""cachedoctor: inspect, explain and repair JAX's persistent compilation cache.

The Python API (docs/api.md) is loaded on first use, so ``import cachedoctor`` stays cheap and
imports neither jax nor the commands::

    import cachedoctor
    report = cachedoctor.scan("/data/jax-cache")
    print(report.summary.entries, [f.kind for f in report.findings])

PYTEST_DONT_REWRITE: pytest marks the package of its plugin (``cachedoctor.pytest_plugin``) for
assertion rewriting, and warns when the package was imported first (the hook's start-up);
cachedoctor holds no test assertions (the plugin unmarks it: ``pytest_plugin/__init__.py``).
"""

from __future__ import annotations

from cachedoctor._version import __version__

# Not ``typing``'s: the hook's start-up imports this package in every Python process of an
# activated environment, and ``typing`` (with ``re``, ``enum``, ...) costs ~10 ms (mypy
# reads a ``TYPE_CHECKING`` of its own as typing's)
TYPE_CHECKING = False

__all__ = [
    "CachedoctorError", "__version__", "diff", "lint", "metrics", "prune_plan", "scan", "stats"
]  # fmt: skip

if TYPE_CHECKING:
    from typing import Any

    from cachedoctor.api import diff, lint, metrics, prune_plan, scan, stats
    from cachedoctor.errors import CachedoctorError


def __getattr__(name: str) -> Any:
    if name == "CachedoctorError":
        from cachedoctor.errors import CachedoctorError

        return CachedoctorError
    if name in ("diff", "lint", "metrics", "prune_plan", "scan", "stats"):
        from cachedoctor import api

        return getattr(api, name)
    raise AttributeError(f"module 'cachedoctor' has no attribute {name!r}")
