"""The one retry policy for store calls, and the thread pool stores run their calls in.

Every call that can be throttled goes through ``call_with_retry``: exponential backoff with
jitter on 429/503/SlowDown and dropped connections (``transient_reason`` tells them from a
definite answer), every retry counted in the store's ``IoStats``. The libraries' own retries are
turned off where they allow it (``remote_store``), so attempts do not multiply. Separate from
the stores because it is about time and failure, not where bytes live: both stores and the
tests use it alone, and it holds the one piece of process state (whom to tell about a wait,
``telling_waits``).
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import errno
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, TypeVar

from cachedoctor.storage.model import IoStats, StoreError

T = TypeVar("T")

_THROTTLE_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "ConditionalRequestConflict",  # S3's 409 while another conditional write is in flight
    "503",
    "429",
    "500",
}
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
_THROTTLE_TEXT = ("SlowDown", "reduce your request rate", "Too Many Requests", "TooManyRequests")
_TRANSIENT_TYPES = {  # dropped or refused connections and timeouts, by class name
    "ProxyError",
    "ReadTimeout",
    "ServerDisconnectedError",
    "ServerTimeoutError",
    "ClientConnectionError",
    "ClientConnectorError",
    "ClientOSError",
    "ClientPayloadError",
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
}


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8  # including the first
    base_s: float = 0.2
    cap_s: float = 10.0

    def delay(self, retry: int) -> float:
        """Exponential backoff with jitter: the 1st retry waits ~base, each next one twice that."""
        ceiling = min(self.cap_s, self.base_s * (2.0**retry))
        return float(ceiling / 2 + random.uniform(0, ceiling / 2))


def _chain(exc: BaseException) -> builtins.list[BaseException]:
    out: builtins.list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out and len(out) < 10:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def transient_reason(exc: BaseException) -> str | None:
    """Why ``exc`` is worth retrying (e.g. "SlowDown", "http-429"), or None when it is not.

    Looks through the exception chain, most specific first: s3fs turns botocore's ClientError
    into an OSError(EBUSY) raised from the original; gcsfs raises HttpError with ``code``.
    """
    chain = _chain(exc)
    for current in chain:
        response = getattr(current, "response", None)
        if isinstance(response, dict):  # botocore ClientError
            code = str((response.get("Error") or {}).get("Code") or "")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in _THROTTLE_CODES:
                return code
            if status in _TRANSIENT_STATUS:
                return f"http-{status}"
            return None  # a definite answer from the server that is not a throttle
    for current in chain:
        for attr in ("code", "status"):
            value = getattr(current, attr, None)
            if isinstance(value, int) and value in _TRANSIENT_STATUS:
                return f"http-{value}"
    for current in chain:
        if isinstance(current, OSError) and current.errno in (errno.EBUSY, errno.EAGAIN):
            return "busy"
        if isinstance(current, (ConnectionError, TimeoutError)):
            return type(current).__name__
        if type(current).__name__ in _TRANSIENT_TYPES:
            return type(current).__name__
        text = str(current)
        for marker in _THROTTLE_TEXT:
            if marker in text:
                return marker
    return None


# Whom to tell, with one line, when a store call first has to wait and retry (an unreachable
# endpoint should not be 20 s of silence). Nobody, unless a caller asks: the CLI passes its
# stderr writer for the duration of a command (``telling_waits``); the API and the hook (inside
# the user's JAX process) stay silent. A context variable, not a module attribute: it holds
# only inside that ``with`` block, and ``bounded_map`` carries it into its threads.
_wait_notice: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "cachedoctor_wait_notice", default=None
)
_waited = threading.Event()  # told once per process


@contextlib.contextmanager
def telling_waits(notice: Callable[[str], None]) -> Iterator[None]:
    """Within the block, the first store call that has to wait says so once through ``notice``."""
    token = _wait_notice.set(notice)
    try:
        yield
    finally:
        _wait_notice.reset(token)


def _say_waiting(what: str, reason: str, policy: RetryPolicy) -> None:
    notice = _wait_notice.get()
    if notice is None or _waited.is_set():
        return
    _waited.set()
    budget = sum(min(policy.cap_s, policy.base_s * 2.0**i) for i in range(policy.attempts - 1))
    notice(
        f"cachedoctor: waiting for {what} ({reason}); retrying with backoff, "
        f"at most {policy.attempts} attempts in about {budget:.0f} s"
    )


def call_with_retry(
    fn: Callable[[], T],
    *,
    what: str,
    stats: IoStats | None = None,
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``fn``; on a throttling or transient error back off and try again.

    The one place that retries store calls. Errors that are not transient propagate at once;
    a transient one that outlasts ``policy.attempts`` becomes a StoreError naming ``what``.
    """
    policy = policy or RetryPolicy()
    for attempt in range(policy.attempts):
        try:
            return fn()
        except Exception as exc:
            reason = transient_reason(exc)
            if reason is None:
                raise
            if attempt == policy.attempts - 1:
                raise StoreError(
                    f"{what}: still failing after {policy.attempts} attempts ({reason}): {exc}"
                ) from exc
            if stats is not None:
                stats.count_retry(reason)
            _say_waiting(what, reason, policy)
            sleep(policy.delay(attempt))
    raise AssertionError("unreachable")


def bounded_map(fn: Callable[[T], Any], items: Sequence[T], workers: int) -> list[Any]:
    """``[fn(i) for i in items]`` on at most ``workers`` threads, results in input order."""
    if workers <= 1 or len(items) <= 1:
        return [fn(i) for i in items]
    results: list[Any] = [None] * len(items)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cachedoctor-io") as pool:
        futures = {  # each call in this context (``telling_waits``)
            pool.submit(contextvars.copy_context().run, fn, item): index
            for index, item in enumerate(items)
        }
        for future in as_completed(futures):
            results[futures[future]] = future.result()
    return results
