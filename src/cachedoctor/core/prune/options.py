"""What the user asked ``prune`` to remove: the selectors, parsed once for the CLI and the API."""

from __future__ import annotations

from dataclasses import dataclass

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
    module: str | None = None  # alone: a rule; with other rules: limits them to these modules
    xla_subcaches: bool = False
    repair: bool = False
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    selectors: tuple[str, ...] = ()  # the user's spelling, for the report

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
