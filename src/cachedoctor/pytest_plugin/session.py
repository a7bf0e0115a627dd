"""The plugin's work once ``--cachedoctor`` asks for it: each test's compiles counted from JAX's
events (``listen``), its misses explained (``core/suite``), the figures put in JUnit XML
properties, handed from xdist's workers to their controller, and rendered through the renderer
registry at the end (``render/formats``: the terminal summary, ``--cachedoctor-json``).
"""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import Any

import pytest

from cachedoctor.core.suite import (
    OUTSIDE,
    Miss,
    MissExplainer,
    SuiteReport,
    TestCompiles,
    added,
    merged,
    part_document,
)
from cachedoctor.pytest_plugin import listen

WORKER_OUTPUT = "cachedoctor"  # the key of a worker's figures in xdist's workeroutput
PROPERTY = "cachedoctor_"  # JUnit XML property names start so


class CompileAccounting:
    """The pytest hooks of one run (or one xdist worker, or the controller)."""

    def __init__(self, config: pytest.Config) -> None:
        top = config.getoption("cachedoctor_top")
        if top < 0:
            raise pytest.UsageError(f"--cachedoctor-top: expected 0 or more, got {top}")
        self.config = config
        self.top = int(top)
        self.fail_on_miss = bool(config.getoption("cachedoctor_fail_on_miss"))
        self.json_path: str | None = config.getoption("cachedoctor_json")
        self.worker = hasattr(config, "workerinput")
        self.listener = listen.Listener()
        self.explainer: MissExplainer | None = None
        self.tests: dict[str, TestCompiles] = {}
        self.running: TestCompiles | None = None
        self.unjudged = TestCompiles(OUTSIDE)  # the test's compiles fail-on-miss has not judged
        self.outside = TestCompiles(OUTSIDE)
        self.parts: list[dict[str, Any]] = []  # the workers' figures, on xdist's controller
        self.report: SuiteReport | None = None
        self.error: str | None = None

    # --- counting ------------------------------------------------------------------------

    def _taken(self, nodeid: str) -> TestCompiles:
        """What JAX compiled since the last switch, as one test's figures, misses explained."""
        tally = self.listener.switch()
        misses = tuple(self._explained(module, doc) for module, doc in tally.misses)
        missing = self._missing()
        return TestCompiles(
            nodeid,
            compilations=tally.compilations,
            compile_secs=tally.compile_secs,
            trace_secs=tally.trace_secs,
            lower_secs=tally.lower_secs,
            requests=None if listen.REQUESTS in missing else tally.requests,
            hits=None if listen.HITS in missing else tally.hits,
            saved_secs=tally.saved_secs,
            misses=misses,
        )

    def _missing(self) -> list[str]:
        if not hasattr(self, "_missing_events"):
            if not self.listener.installed:
                return []
            self._missing_events = listen.missing_events()
        return self._missing_events

    def _explained(self, module: str, doc: dict[str, Any] | None) -> Miss:
        if self.explainer is None:
            self.explainer = MissExplainer.of_setting(listen.cache_dir_setting())
        try:
            return self.explainer.explain(doc, module)
        except Exception as exc:  # never let the accounting break a test
            return Miss(module, None, "unknown", f"cachedoctor could not explain it: {exc}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_collectstart(self) -> None:
        self.listener.install()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        self.listener.install()
        self.outside = added(self.outside, self._taken(OUTSIDE))
        self.running = TestCompiles(item.nodeid)
        yield
        self.running = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        phase = self._taken(item.nodeid)
        test = added(self.running or TestCompiles(item.nodeid), phase)
        if call.when == "teardown":
            item.user_properties.extend(self._properties(test))
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        # a miss in setup (a fixture's compile) fails the call, so that the test still runs
        self.unjudged = added(self.unjudged, phase) if call.when != "setup" else phase
        if self.fail_on_miss and (call.when != "setup" or not report.passed):
            said = _miss_message(self.unjudged)
            self.unjudged = TestCompiles(item.nodeid)
            if said is not None:
                test = added(test, TestCompiles(item.nodeid, failed_on_miss=True))
                if not report.failed:
                    report.outcome = "failed"
                    report.longrepr = said
                else:
                    report.sections.append(("cachedoctor", said))
        self.running = test
        if call.when == "teardown":
            self.tests[item.nodeid] = test

    def _properties(self, test: TestCompiles) -> list[tuple[str, object]]:
        """The test's figures as JUnit XML properties."""
        props: list[tuple[str, object]] = [
            (PROPERTY + "compilations", test.compilations),
            (PROPERTY + "compile_secs", round(test.compile_secs, 6)),
        ]
        if test.hits is not None:
            props.append((PROPERTY + "cache_hits", test.hits))
        if test.cache_misses is not None:
            props.append((PROPERTY + "cache_misses", test.cache_misses))
        props += [(PROPERTY + "miss", f"{m.module}: {m.cause}") for m in test.misses]
        return props

    # --- the end -------------------------------------------------------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist's controller: a worker's figures."""
        part = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT)
        if isinstance(part, dict):
            self.parts.append(part)

    def _part(self) -> dict[str, Any]:
        tests = list(self.tests.values())
        if self.running is not None:  # interrupted inside a test
            tests.append(self.running)
        outside = added(self.outside, self._taken(OUTSIDE))
        doc = part_document(
            tests,
            outside,
            jax=listen.jax_version(),
            missing_events=self._missing(),
            recorder=listen.recorder_mode(),
            cache_dir=listen.cache_dir_setting(),
        )
        return dict(json.loads(json.dumps(doc)))  # plain data, as execnet carries it

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        part = self._part()
        if self.worker:
            session.config.workeroutput[WORKER_OUTPUT] = part  # type: ignore[attr-defined]
            return
        self.report = merged(self.parts or [part], fail_on_miss=self.fail_on_miss)
        if self.json_path:
            from cachedoctor.errors import CachedoctorError
            from cachedoctor.render.formats import write_report

            try:
                write_report(self.json_path, self.report, "json")
            except CachedoctorError as exc:
                self.error = str(exc)
                # a document asked for and not written: the run does not pass as if it were
                if session.exitstatus == pytest.ExitCode.OK:
                    session.exitstatus = pytest.ExitCode.USAGE_ERROR

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.report is None:
            return
        # the text format's writer (render/formats) calls the same function; the registry's
        # console (rich) would cost a warm suite's run more than the summary's few lines
        from cachedoctor.render.suite import suite_lines

        terminalreporter.write_sep("=", "cachedoctor: JAX compiles")
        for line in suite_lines(self.report, top=self.top):
            terminalreporter.write_line(line)
        if self.error:
            terminalreporter.write_line(f"cachedoctor: {self.error}", red=True)


def _miss_message(phase: TestCompiles) -> str | None:
    """Why --cachedoctor-fail-on-miss fails this phase of a test (None: it does not)."""
    lines = [f"{m.module}: {m.cause}" for m in phase.misses]
    uncached = phase.uncached or 0
    if uncached:
        lines.append(
            f"{uncached} compile{'s' if uncached != 1 else ''} did not ask the persistent cache"
            " (is JAX_COMPILATION_CACHE_DIR set, and the cache on?)"
        )
    if not lines:
        return None
    n = len(phase.misses)
    head = (
        f"cachedoctor: {n} persistent-cache miss{'es' if n != 1 else ''} in a run that should"
        " compile nothing (--cachedoctor-fail-on-miss)"
    )
    return "\n".join([head, *("  " + line for line in lines)])
