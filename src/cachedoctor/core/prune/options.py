"""What the user asked ``prune`` to remove: the selectors, parsed once for the CLI and the API.

:meth:`PruneOptions.from_selectors` is the one constructor both edges call: it takes the values as
the user gave them (``"2w"``, ``"10GB"``, or a number from Python), reads them with ``units.py``'s
grammar (the one place a duration or a size becomes a number), checks the flags' types, and
records the user's spelling for the plan's report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cachedoctor import units

DEFAULT_STALE_AFTER_S = 24 * 3600  # temp files, manifests without entry (a compile may take hours)


@dataclass(frozen=True)
class PruneOptions:
    """What ``prune`` selects. Entry rules combine: an entry goes when any selected rule matches."""

    older_than_s: float | None = None
    max_size: int | None = None
    duplicates: bool = False
    corrupt: bool = False
    orphans: bool = False
    relocated: bool = False
    stale_jax: bool = False
    stale_jax_in_use: bool = False  # also the entries another JAX version still uses
    module: str | None = None  # alone: a rule; with other rules: limits them to these modules
    xla_subcaches: bool = False
    repair: bool = False
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    # the cache dir as the jobs spell it (their JAX_COMPILATION_CACHE_DIR): --relocated judges
    # against it; None: the spelling given, and another spelling of this folder is kept
    jobs_cache_dir: str | None = None
    selectors: tuple[str, ...] = ()  # the user's spelling, for the report

    @classmethod
    def from_selectors(
        cls,
        *,
        older_than: str | float | None = None,
        max_size: str | int | None = None,
        duplicates: object = False,
        corrupt: object = False,
        orphans: object = False,
        relocated: object = False,
        stale_jax: object = False,
        stale_jax_in_use: object = False,
        module: object = None,
        xla_subcaches: object = False,
        repair: object = False,
        stale_after: str | float = DEFAULT_STALE_AFTER_S,
        jobs_cache_dir: object = None,
    ) -> PruneOptions:
        """The options from the values as the user gave them: ``older_than`` and
        ``stale_after`` a duration (``"30d"``, ``"2w"`` or seconds), ``max_size`` a size
        (``"50GB"``, ``"800MiB"`` or bytes), ``module`` a glob, the flags True or False.

        Raises ValueError naming the argument (``max_size: not a size: 'lots' (…)``)."""
        size = None if max_size is None else _read(units.parse_size, max_size, "max_size")
        age = None if older_than is None else _read(units.parse_duration, older_than, "older_than")
        on = {
            name: _flag(value, name)
            for name, value in (
                ("duplicates", duplicates),
                ("corrupt", corrupt),
                ("orphans", orphans),
                ("relocated", relocated),
                ("stale_jax", stale_jax),
                ("stale_jax_in_use", stale_jax_in_use),
                ("xla_subcaches", xla_subcaches),
                ("repair", repair),
            )
        }
        if module is not None and not isinstance(module, str):
            raise ValueError(f"module: expected a str or None, not {module!r:.60}")
        if jobs_cache_dir is not None and not isinstance(jobs_cache_dir, str):
            raise ValueError(f"jobs_cache_dir: expected a str or None, not {jobs_cache_dir!r:.60}")
        valued = (
            ("older-than", older_than),
            ("max-size", max_size),
            ("module", module),
            ("jobs-cache-dir", jobs_cache_dir),
        )
        spelled = [f"{flag} {value}" for flag, value in valued if value is not None]
        spelled += [name.replace("_", "-") for name, flag_on in on.items() if flag_on]
        return cls(
            older_than_s=age,
            max_size=None if size is None else int(size),
            duplicates=on["duplicates"],
            corrupt=on["corrupt"],
            orphans=on["orphans"],
            relocated=on["relocated"],
            stale_jax=on["stale_jax"] or on["stale_jax_in_use"],
            stale_jax_in_use=on["stale_jax_in_use"],
            module=module,
            xla_subcaches=on["xla_subcaches"],
            repair=on["repair"],
            stale_after_s=_read(units.parse_duration, stale_after, "stale_after"),
            jobs_cache_dir=jobs_cache_dir,
            selectors=tuple(spelled),
        )

    def understood(self) -> str:
        """What the plan took the user's words to mean, in full units (a plan states it)."""
        said = []
        if self.older_than_s is not None:
            said.append(f"entries last used more than {units.say_duration(self.older_than_s)} ago")
        if self.max_size is not None:
            said.append(f"a cache of at most {units.say_size(self.max_size)} of entries")
        flags = (
            (self.duplicates, "duplicates"),
            (self.corrupt, "corrupt entries"),
            (self.relocated, "relocated entries"),
            (self.stale_jax_in_use, "entries of another jaxlib, in use or not"),
            (self.stale_jax and not self.stale_jax_in_use, "entries of another jaxlib"),
            (self.orphans, f"leftovers older than {units.say_duration(self.stale_after_s)}"),
            (self.xla_subcaches, "XLA's sub-caches"),
            (self.repair, "repairs"),
        )
        said += [what for on, what in flags if on]
        if self.jobs_cache_dir is not None:
            said.append(f"the jobs spelling the cache dir {self.jobs_cache_dir}")
        if self.module is not None:
            said.append(f"only modules matching {self.module}")
        return "understood: " + "; ".join(said)

    @property
    def entry_rules(self) -> bool:
        return any(
            (
                self.older_than_s is not None,
                self.max_size is not None,
                self.duplicates,
                self.corrupt,
                self.relocated,
                self.stale_jax,
            )
        )

    @property
    def anything(self) -> bool:
        return self.entry_rules or any(
            (self.orphans, self.module is not None, self.xla_subcaches, self.repair)
        )


def _flag(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"{name}: expected True or False, not {value!r:.60}")


def _read(parse: Callable[[Any], float], value: object, name: str) -> float:
    """``units``' reading of what the user gave; its ValueError names the argument."""
    try:
        return parse(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
