"""The bucket services cachedoctor reaches, by URL scheme: the one registry.

``urls`` (is this a bucket URL?), ``location`` (the words of its refusal) and ``remote_store``
(which filesystem, which versions, which errors) ask it instead of naming a service. A new
service is one module beside ``gs`` and ``s3`` with a ``Backend`` (:mod:`.base`), and a line
in ``_BUILTIN``. Importing this imports no bucket client: the hook imports it at JAX start-up.
"""

from __future__ import annotations

from cachedoctor.storage.backends import gs, s3
from cachedoctor.storage.backends.base import Backend, Failure, Op, failure_of

__all__ = [
    "Backend",
    "Failure",
    "Op",
    "backend_for",
    "endpoint_variables",
    "failure_of",
    "is_scheme",
    "register",
    "schemes",
    "unregister",
    "with_or",
]

_BUILTIN: tuple[Backend, ...] = (gs.BACKEND, s3.BACKEND)  # in the order messages name them
_REGISTRY: dict[str, Backend] = {b.scheme: b for b in _BUILTIN}


def register(backend: Backend) -> None:
    """Reach ``backend.scheme://`` URLs through ``backend`` (named last in messages)."""
    _REGISTRY[backend.scheme] = backend


def unregister(scheme: str) -> None:
    """Forget a scheme ``register`` added."""
    _REGISTRY.pop(scheme, None)


def is_scheme(scheme: str) -> bool:
    """True when ``scheme://`` names a bucket a registered backend reaches."""
    return scheme in _REGISTRY


def backend_for(scheme: str) -> Backend:
    """The backend of a registered scheme (KeyError otherwise: ``urls`` checked it)."""
    return _REGISTRY[scheme]


def schemes() -> tuple[Backend, ...]:
    """Every registered backend, in the order messages name them."""
    return tuple(_REGISTRY.values())


def endpoint_variables() -> tuple[str, ...]:
    """The environment variables that say where each service is (a worker sets the same)."""
    return tuple(v for b in _REGISTRY.values() for v in b.endpoint_variables)


def with_or(words: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``: the registered schemes in a message."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
