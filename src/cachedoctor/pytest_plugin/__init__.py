"""cachedoctor's pytest plugin: per test, what JAX compiled, whether the persistent cache hit,
and why it missed (docs/pytest.md).

pytest loads this module in every run of an environment cachedoctor is installed in (the
``pytest11`` entry point), so it is free when off: it imports only pytest and adds its options;
without ``--cachedoctor`` (or an option that implies it) it registers nothing else, imports
neither jax nor the rest of cachedoctor, and changes nothing in the run.
"""

from __future__ import annotations

import pytest

SESSION_PLUGIN = "cachedoctor-session"
PACKAGE = __name__.split(".", 1)[0]


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    _leave_unrewritten(pluginmanager)
    group = parser.getgroup("cachedoctor", "JAX compiles per test (cachedoctor)")
    group.addoption(
        "--cachedoctor",
        action="store_true",
        default=False,
        help="count JAX's compiles and persistent-cache hits and misses per test, and say why"
        " each miss missed",
    )
    group.addoption(
        "--cachedoctor-json",
        metavar="FILE",
        default=None,
        help="write the figures as one JSON document to FILE (implies --cachedoctor)",
    )
    group.addoption(
        "--cachedoctor-fail-on-miss",
        action="store_true",
        default=False,
        help="fail a test that misses the persistent cache, or compiles without it: for a"
        " run on a restored cache (implies --cachedoctor)",
    )
    group.addoption(
        "--cachedoctor-top",
        metavar="N",
        type=int,
        default=10,
        help="tests shown in the summary's ranking by compile time (default 10)",
    )


def pytest_configure(config: pytest.Config) -> None:
    on = (
        config.getoption("cachedoctor")
        or config.getoption("cachedoctor_json")
        or config.getoption("cachedoctor_fail_on_miss")
    )
    if on:
        from cachedoctor.pytest_plugin.session import CompileAccounting

        config.pluginmanager.register(CompileAccounting(config), SESSION_PLUGIN)


def _leave_unrewritten(pluginmanager: pytest.PytestPluginManager) -> None:
    """Undo pytest's marking of ``cachedoctor`` for assertion rewriting (it marks the package of
    every ``pytest11`` entry point): else every cachedoctor module a suite imports afterwards
    would be rewritten, cachedoctor's own suite included, which ran without it before the
    plugin existed. Through pytest's rewrite hook's attributes, where they are; else pytest's
    default stays."""
    hook = getattr(pluginmanager, "rewrite_hook", None)
    marked = getattr(hook, "_must_rewrite", None)
    if isinstance(marked, set) and PACKAGE in marked:
        marked.discard(PACKAGE)
        cache = getattr(hook, "_marked_for_rewrite_cache", None)
        if isinstance(cache, dict):
            cache.clear()
