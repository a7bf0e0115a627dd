"""``cachedoctor status`` output: the effective settings, where each comes from, and what a
fresh interpreter reported (``stablekeys.activation.StatusReport``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from cachedoctor.stablekeys import settings
from cachedoctor.stablekeys.activation import StatusReport

STATUS_SCHEMA_VERSION = 1


def status_json(report: StatusReport) -> str:
    """``status --json``: the report's fields, the config path as a string, ``schema_version``."""
    data = asdict(report)
    data["config_path"] = str(report.config_path)
    data["problems"] = report.problems
    data["schema_version"] = STATUS_SCHEMA_VERSION
    return json.dumps(data, default=str, indent=2)


def status_lines(report: StatusReport) -> Iterator[str]:
    """The text report, line by line (plain: the sources in brackets are not markup)."""
    state = "present" if report.config_exists else "absent (not enabled)"
    if report.disabled:
        state += f"; ignored: {settings.DISABLE_ENV}=1"
    yield f"config file: {report.config_path} ({state})"
    yield "effective settings (env > config file > JAX default):"
    for r in report.settings:
        yield f"  {r.key:<22} {_shown(r.key, r.value):<50} [{r.source}]"
    p = report.probe
    yield "fresh interpreter:"
    if "error" in p:
        yield f"  {p['error']}"
    else:
        yield f"  python {p.get('python')}  jax {p.get('jax', p.get('jax_error'))}"
        yield f"  hook active: {p.get('hook') or 'no'}"
        read_only = (p.get("startup") or {}).get("read_only")
        if read_only:
            yield (
                "  read-only: yes: lookups only; no entry, -atime file, manifest or record is"
                " written to the cache"
                if read_only.get("installed")
                else "  read-only: this JAX cannot be made read-only: its persistent cache is off"
            )
        recording = p.get("stats")
        if recording:
            where = recording.get("records") or "nowhere: no cache dir is set"
            mode = recording["mode"]
            yield f"  stats recording: active ({mode} mode), records go to {where}"
        else:
            yield "  stats recording: no"
        for err in report.activation_errors:
            yield f"  activation error: {err}"
        if not p.get("pth"):
            yield "  start-up .pth not found on sys.path: reinstall cachedoctor"
    yield from _key_mode_lines(report.key_modes)
    yield "multi-host roles (asked of JAX in the fresh interpreter):"
    for role in report.roles:
        yield f"  - {role}"


def _key_mode_lines(summary: dict[str, Any] | None) -> Iterator[str]:
    """Modules per key mode of the cache dir's manifests; each fallback with why."""
    if summary is None:
        return
    modes = summary["modes"]
    if not modes:
        yield "key modes: no key manifests in the cache dir yet"
        return
    yield "key modes (cache dir manifests, modules per mode):"
    for mode, modules in modes.items():
        more = ", …" if len(modules) > 8 else ""
        yield f"  {mode:<9} {len(modules):>4}  {', '.join(modules[:8])}{more}"
    for module, why in summary["fallbacks"].items():
        yield f"  fell back: {module}: {why}"
    per_process = summary.get("per_process") or []
    for found in per_process[:8]:
        yield f"  per-process key: {found['line']}"
    if len(per_process) > 8:
        yield f"  … and {len(per_process) - 8} more per-process keys (status --json)"


def _shown(key: str, value: object) -> str:
    """A value as `enable` spells it: sub-caches by choice name, an unset value as such."""
    if value is None:
        return "unset"
    if key == "xla_caches":
        names = {v: k for k, v in settings.XLA_CACHE_CHOICES.items()}
        return names.get(str(value), str(value))
    return str(value)
