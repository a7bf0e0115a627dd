"""Plans and their results (``prune``, ``rekey``): a table for people, a JSON document for tools."""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cachedoctor._version import __version__
from cachedoctor.core.prune.actions import SCHEMA_VERSION, Action, ApplyReport, Op, Plan, Status
from cachedoctor.errors import count
from cachedoctor.render.console import print_table
from cachedoctor.render.jsonout import to_plain
from cachedoctor.units import format_bytes

_OP_VERB = {
    Op.REMOVE_ENTRY: "remove",
    Op.REMOVE_FILE: "remove file",
    Op.RECREATE_ATIME: "add -atime",
    Op.FIX_MODE: "chmod go-w",
    Op.MOVE_ENTRY: "move",
    Op.DROP_DUPLICATE: "drop duplicate",
}
_STATUS_STYLE = {Status.DONE: "green", Status.SKIPPED: "yellow", Status.FAILED: "bold red"}


_HEX = re.compile(r"([0-9a-f]{12})[0-9a-f]{52}")


def short(text: str) -> str:
    """Keys shortened for a terminal (``jit_f-6477fbdd0405…``); JSON keeps them whole."""
    return _HEX.sub(lambda m: m.group(1) + "…", text)


def _last_used(a: Action) -> str:
    if a.last_used_ns is None:
        return "-"
    t = _dt.datetime.fromtimestamp(a.last_used_ns / 1e9, tz=_dt.UTC)
    return t.strftime("%Y-%m-%d %H:%M")


def render_plan(
    plan: Plan, console: Console, *, result: ApplyReport | None = None, limit: int = 200
) -> None:
    """The plan (dry run) or what applying it did, then skipped items and notes."""
    title = f"{plan.command} {plan.cache_dir}"
    if plan.selectors:
        title += f"  [{', '.join(plan.selectors)}]"
    console.print(Text(title, style="bold"))
    if not plan.actions:
        console.print(Text("nothing to do", style="green"))
    else:
        _actions_table(plan, console, result, limit)
    for c in plan.conflicts:
        console.print(Text(f"conflict  {short(c.name)}: {short(c.reason)}", style="bold red"))
    if plan.skipped:
        console.print(Text(f"left alone ({len(plan.skipped)})", style="bold"))
        for s in plan.skipped[:limit]:
            console.print(f"  {short(s.name)}: {short(s.reason)}", markup=False, highlight=False)
    for note in plan.notes:
        console.print(Text(f"note: {note}", style="dim"))
    if not plan.actions:
        return  # "nothing to do" was said above
    _summary(plan, console, result)


def _actions_table(plan: Plan, console: Console, result: ApplyReport | None, limit: int) -> None:
    """The first ``limit`` actions, each with its outcome when the plan was applied."""
    outcome = {id(o.action): o for o in result.outcomes} if result else {}
    shown = plan.actions[:limit]
    with_size = any(a.bytes for a in shown)
    with_used = any(a.last_used_ns is not None for a in shown)
    table = Table(show_edge=False, title_justify="left")
    if result is not None:
        table.add_column("result")
    table.add_column("action", no_wrap=True)
    table.add_column("entry / file", overflow="fold")
    table.add_column("rule", overflow="fold")
    if with_size:
        table.add_column("size", justify="right", no_wrap=True)
    if with_used:
        table.add_column("last used (UTC)", no_wrap=True)
    table.add_column("why", overflow="fold", min_width=24)
    for a in shown:
        name = short(a.name)
        if a.op is Op.MOVE_ENTRY and a.new_key:
            name += "\n→ " + short(a.new_key)
        cells = [_OP_VERB[a.op], name, ",".join(r.value for r in a.rules)]
        if with_size:
            cells.append(format_bytes(a.bytes) if a.bytes else "")
        if with_used:
            cells.append(_last_used(a))
        cells.append(short(a.reason))
        if result is not None:
            o = outcome.get(id(a))
            status = Text(o.status.value, style=_STATUS_STYLE[o.status]) if o else Text("-")
            if o and o.detail and o.status is not Status.DONE:
                status.append(f" ({short(o.detail)})")
            table.add_row(status, *cells)
        else:
            table.add_row(*cells)
    if len(plan.actions) > limit:
        table.caption = f"{len(plan.actions) - limit} more actions (use --json)"
    print_table(console, table)


def _summary(plan: Plan, console: Console, result: ApplyReport | None) -> None:
    """The last line: what the dry run would do, or what applying it did."""
    entries = plan.entries_to_remove
    if result is None:
        if plan.command == "rekey":
            moves = sum(1 for a in plan.actions if a.op is Op.MOVE_ENTRY)
            what = (
                f"would move {count(moves, 'entry', 'entries')}, drop {count(entries, 'duplicate')}"
            )
        else:
            files = sum(1 for a in plan.actions if a.op is Op.REMOVE_FILE)
            fixes = len(plan.actions) - entries - files
            what = "would remove " + count(entries, "entry", "entries")
            what += " and " + count(files, "other file")
            if fixes:
                what += f", make {count(fixes, 'fix', 'fixes')}"
        console.print(
            Text(
                f"dry run: {what}, reclaiming {format_bytes(plan.bytes_to_reclaim)}; "
                "add --apply to do it",
                style="bold",
            )
        )
    else:
        console.print(
            Text(
                f"applied: {result.count(Status.DONE)} done, {result.count(Status.SKIPPED)} "
                f"skipped, {result.count(Status.FAILED)} failed; reclaimed "
                f"{format_bytes(result.bytes_reclaimed)}" + _lock_note(plan, result.locked),
                style="bold",
            )
        )


def _lock_note(plan: Plan, locked: bool) -> str:
    if not plan.has_locks:
        return " (conditional deletes: a bucket has no locks)"
    return "" if locked else " (no .lockfile: JAX's LRU eviction is off)"


def _action_dict(a: Action) -> dict[str, Any]:
    data: dict[str, Any] = {
        "op": a.op.value,
        "name": a.name,
        "rules": [r.value for r in a.rules],
        "rule": a.rules[0].value if a.rules else None,
        "reason": a.reason,
        "bytes": a.bytes,
        "module": a.module,
        "last_used_ns": a.last_used_ns,
        "files": to_plain(a.files),
    }
    if a.folder:
        data["folder"] = a.folder
    if a.new_key:
        data["new_key"] = a.new_key
    return data


def plan_document(plan: Plan, result: ApplyReport | None = None) -> dict[str, Any]:
    """JSON for a plan; with ``result``, each action carries its outcome."""
    outcome = {id(o.action): o for o in result.outcomes} if result else {}
    actions = []
    for a in plan.actions:
        data = _action_dict(a)
        if result is not None:
            o = outcome.get(id(a))
            data["status"] = o.status.value if o else None
            data["detail"] = o.detail if o else None
            data["bytes_reclaimed"] = o.bytes if o else 0
        actions.append(data)
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "cachedoctor", "version": __version__},
        "command": plan.command,
        "cache_dir": str(plan.cache_dir),
        "created_at": plan.created_at,
        "applied": result is not None,
        "selectors": list(plan.selectors),
        "jax": {"jax_version": plan.jax_version, "jaxlib_version": plan.jaxlib_version},
        "eviction_in_use": plan.eviction_in_use,
        "summary": {
            "actions": len(plan.actions),
            "entries": plan.entries_to_remove,
            "bytes_to_reclaim": plan.bytes_to_reclaim,
            "skipped": len(plan.skipped),
            "conflicts": len(plan.conflicts),
        },
        "actions": actions,
        "skipped": to_plain(plan.skipped),
        "conflicts": to_plain(plan.conflicts),
        "notes": list(plan.notes),
    }
    if result is not None:
        doc["result"] = {
            "done": result.count(Status.DONE),
            "skipped": result.count(Status.SKIPPED),
            "failed": result.count(Status.FAILED),
            "bytes_reclaimed": result.bytes_reclaimed,
            "locked": result.locked,
        }
    return doc
