"""Where each setting of this environment comes from, for ``status``: the environment, the
config file or the default.

Apart from :mod:`.settings`, which every hooked process imports at start-up: a ``@dataclass``
costs about 0.4 ms to make, and only ``status`` asks for this one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from cachedoctor.stablekeys.settings import OPTIONS, jax_value, load


@dataclass(frozen=True)
class Resolved:
    """An effective value and where it came from."""

    key: str
    value: Any
    source: str  # "env NAME", "config file", "JAX default" / "default"


def resolve(file_values: dict[str, Any] | None = None) -> list[Resolved]:
    """Effective settings of this process's environment: env, then config file, then default.

    The default's value is None here; ``status`` asks a fresh interpreter for JAX's actual value.
    """
    file_values = load() if file_values is None else file_values
    out = []
    for opt in OPTIONS:
        env = os.environ.get(opt.env)
        if env is not None:
            out.append(Resolved(opt.key, env, f"env {opt.env}"))
        elif opt.key in file_values:
            out.append(Resolved(opt.key, jax_value(opt.key, file_values[opt.key]), "config file"))
        else:
            default = "JAX default" if opt.jax_name else "default"
            out.append(Resolved(opt.key, None, default))
    return out
