"""Fixtures of the hook's tests: the local S3 and GCS servers, for caches in a bucket."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.buckets import Servers, running_servers


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """moto's S3 server and the GCS emulator on 127.0.0.1, this process's environment aimed at
    them (``servers.env`` for JAX's processes); skipped, saying why, without ``test-remote``."""
    with running_servers() as found:
        yield found
