"""Keep the docs honest: what they claim about the code, checked against the code.

python tools/check_docs.py          # fail on the first claim that is not true (all are listed)
python tools/check_docs.py --write  # regenerate docs/commands.md and docs/findings.md

- docs/commands.md is generated from each command's --help; the README names every command and
  opens with the demo and the test command CI runs;
- docs/findings.md is generated from the catalog of finding kinds (core/catalog_entries.py, by
  tools/findings_doc.py), and every finding kind has exactly one entry there;
- docs/architecture.md: every path and module it names in backticks exists (and the function or
  class named after it), each package's module list names exactly its modules, the registry's
  formats are the ones listed, no command imports a renderer other than the registry and the
  consoles, and there is no import cycle (grimp counts imports in functions and under
  TYPE_CHECKING);
- docs/api.md: each function's signature is cachedoctor.api's, each attribute it lists exists on
  the report it returns, ``__all__`` holds what it lists, ``import cachedoctor`` imports no jax,
  click or rich;
- docs/json-schema.md: every command with a JSON output is in its table, each one that runs
  without a JAX-written cache prints a ``schema_version`` 1 on an empty cache, and the scan
  document's fields, ENTRY and FINDING tables are the code's;
- docs/development.md's size rule: no function in src/ over 80 lines without ``long:`` and the
  reason in its docstring (the generated xla/_optionnames.py aside), and no module in src/ over
  600 lines unless ``LONG_MODULES`` (below) names it with the reason.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import inspect
import json
import re
import subprocess
import sys
import tempfile
import typing
from collections.abc import Iterator
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "cachedoctor"
sys.path.insert(0, str(ROOT / "src"))

import findings_doc  # noqa: E402  (beside this script)

from cachedoctor.cli import COMMANDS, cli  # noqa: E402

HEADER = """# Command reference

Generated from each command's `--help` by `python tools/check_docs.py --write`; `nox -s docs`
fails when it is stale.

Sizes, durations and times read alike in every command and in the Python API (`units.py`):

- a SIZE is a number of bytes (`1000000`), or a number and one of the units `B`, `kB`, `MB`,
  `GB`, `TB` (powers of 1000) or `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024), in any case, a
  space allowed between: `50GB`, `800MiB`, `1.5 GiB`; refused: a bare `k`, `m`, `g` or `t`
  (`800M`: 1000 or 1024?), any other unit (`1y`), a sign (`-1GB`);
- an AGE is a number of seconds (`45`, `1.5`), or a number and one of the units `s`, `min`,
  `h`, `d` or `w`, in any case, a space allowed between: `45s`, `90min`, `12h`, `30d`, `2w`,
  `1.5h`, `.5d`, `30 D`; refused: `m` (`6m`: minutes or months?), any other unit (`1y`), a sign
  (`-3d`), a sum (`1d2h`);
- WHEN is a time ago (an AGE with its unit: `7d`, `30min`), a UTC date (`2026-01-31`), or a
  bare number, which is a Unix time (`1767225600`), not seconds ago; refused: `6m`, `7y`.

A value that is not one is a usage error (exit 2) that shows the forms.

Off a terminal (a pipe, a file, `-o FILE`) no line is wrapped or ends in spaces: a message, a
path or a key stays whole on its line, and a table is as wide as its rows need.

Shell completion is click's: `eval "$(_CACHEDOCTOR_COMPLETE=bash_source cachedoctor)"` in
`~/.bashrc` (bash 4.4 or newer), `eval "$(_CACHEDOCTOR_COMPLETE=zsh_source cachedoctor)"` in
`~/.zshrc`, or `_CACHEDOCTOR_COMPLETE=fish_source cachedoctor >
~/.config/fish/completions/cachedoctor.fish`. DIR completes folder names and `--ignore` the
finding kinds.
"""


def render() -> str:
    runner = CliRunner()
    parts = [HEADER]
    top = runner.invoke(cli, ["--help"], prog_name="cachedoctor", terminal_width=100)
    if top.exit_code != 0:
        raise SystemExit(f"`cachedoctor --help` failed: {top.output}")
    parts.append("## cachedoctor\n\n```text\n" + top.output.rstrip() + "\n```\n")
    for name in sorted(COMMANDS):
        result = runner.invoke(cli, [name, "--help"], prog_name="cachedoctor", terminal_width=100)
        if result.exit_code != 0:
            raise SystemExit(f"`cachedoctor {name} --help` failed: {result.output}")
        parts.append(f"## cachedoctor {name}\n\n```text\n{result.output.rstrip()}\n```\n")
    return "\n".join(parts)


def readme_commands() -> tuple[str, str]:
    """The README's two quickstart commands (first two ```sh blocks)."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)\n```", text, re.S)
    if len(blocks) < 2:
        raise SystemExit("README.md must open with two ```sh blocks (demo, tests)")
    return blocks[0].strip(), blocks[1].strip()


def readme_problems() -> Iterator[str]:
    target = ROOT / "docs" / "commands.md"
    if not target.exists() or target.read_text() != render():
        yield "docs/commands.md is stale: run `python tools/check_docs.py --write`"
    readme = (ROOT / "README.md").read_text()
    for name in COMMANDS:
        if f"cachedoctor {name}" not in readme:
            yield f"README.md does not mention `cachedoctor {name}`"
    demo_cmd, test_cmd = readme_commands()
    if "cachedoctor demo" not in demo_cmd:
        yield "README's first command must run `cachedoctor demo`"
    if test_cmd not in (ROOT / ".ci" / "run").read_text():
        yield "README's test command is not what .ci/run runs"


# --- docs/architecture.md --------------------------------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
_NAMED = re.compile(r"`((?:tests/)?[a-z_]+(?:/[a-z_]+)*/?(?:\.py)?(?:\.[A-Za-z_][A-Za-z0-9_]*)?)`")
_PACKAGE_LIST = re.compile(r'\["(\w+)/ — ([^"]*)"\]')


def _module_exists(parts: list[str]) -> bool:
    base = SRC.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def named_path_problems(text: str, where: str) -> Iterator[str]:
    """Each backticked ``pkg/module[.attr]``, ``file.py`` or ``tests/...`` path exists."""
    for name in sorted(set(_NAMED.findall(text))):
        if "/" not in name or (ROOT / name).exists():
            continue  # a path of the checkout (src/, tests/e2e/, tools/check_docs.py)
        if name.startswith(("tests/", "docs/", "tools/", "src/")):
            yield f"{where} names {name}, which does not exist"
            continue
        path, _, attr = name.removesuffix(".py").partition(".")
        if name.endswith(".py"):
            path, attr = name.removesuffix(".py"), ""
        parts = [p for p in path.split("/") if p]
        if not _module_exists(parts):
            yield f"{where} names {name}: no module cachedoctor.{'.'.join(parts)}"
            continue
        if attr:
            module = importlib.import_module("cachedoctor." + ".".join(parts))
            if not hasattr(module, attr):
                yield f"{where} names {name}: cachedoctor.{'.'.join(parts)} has no {attr}"


def _modules_of(package: Path, *, private: bool = False) -> set[str]:
    """The modules and subpackages of a package folder (``_private`` ones only if asked)."""
    found = set()
    for child in package.iterdir():
        if child.name.startswith("__") or (child.name.startswith("_") and not private):
            continue
        if child.suffix == ".py":
            found.add(child.stem)
        elif (child / "__init__.py").is_file():
            found.add(child.name + "/")
    return found


def package_list_problems(text: str) -> Iterator[str]:
    """Each ``pkg/ — a, b, c`` box of the diagrams names exactly the package's modules (a box
    that describes instead of listing, ``core/ — one package per job``, is left alone)."""
    for package, listing in _PACKAGE_LIST.findall(text):
        folder = SRC / package if (SRC / package).is_dir() else SRC / "core" / package
        if not folder.is_dir():
            continue
        plain = re.sub(r"\([^)]*\)", "", listing.split(":")[0])
        named = {n.strip() for n in plain.split(",") if n.strip()}
        if not all(re.fullmatch(r"\w+/?", n) for n in named):
            continue
        for missing in sorted(named - _modules_of(folder, private=True)):
            yield f"architecture.md lists {package}/{missing}, which does not exist"
        for unlisted in sorted(_modules_of(folder) - named):
            yield f"architecture.md's {package}/ box does not list {unlisted}"


def registry_problems(text: str) -> Iterator[str]:
    from cachedoctor.render.formats import FORMATS

    listed = re.search(r"one registry \(([^)]*)\)", text)
    if listed is None:
        yield "architecture.md does not list the registry's formats"
    elif {f.strip() for f in listed.group(1).split(",")} != set(FORMATS):
        yield (
            f"architecture.md lists the formats ({listed.group(1)}), "
            f"the registry has {sorted(FORMATS)}"
        )


ALLOWED_RENDER = {"cachedoctor.render.formats", "cachedoctor.render.console"}
# Commands that print a few lines about what they did (architecture.md names them), not a report.
MESSAGES_ONLY = {"enable", "disable"}


def cli_render_problems() -> Iterator[str]:
    """A command renders only through the registry: it imports no per-format renderer, and
    every command but those that only print messages imports the registry."""
    for path in sorted((SRC / "cli").glob("*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
        renderers = {m for m in imported if m.startswith("cachedoctor.render.")}
        for name in sorted(renderers):
            allowed = any(name == ok or name.startswith(ok + ".") for ok in ALLOWED_RENDER)
            if not allowed and name.rpartition(".")[0] not in renderers:  # once per module
                yield f"cli/{path.name} imports {name}: render through render/formats"
        renders = any(m.startswith("cachedoctor.render.formats") for m in imported)
        if path.stem in COMMANDS and path.stem not in MESSAGES_ONLY and not renders:
            yield f"cli/{path.name} does not render through render/formats"


def cycle_problems() -> Iterator[str]:
    import grimp

    graph = grimp.build_graph("cachedoctor", include_external_packages=False)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    for cycle in _cycles(edges):
        yield "import cycle: " + " -> ".join(sorted(cycle))


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


# --- docs/api.md -------------------------------------------------------------------------------

API_DOC = ROOT / "docs" / "api.md"
_API_ROW = re.compile(r"^\| `(\w+)(\([^`]*\))?` \| (.*?) \|", re.M)


def api_problems() -> Iterator[str]:
    import cachedoctor
    from cachedoctor import api

    rows = _API_ROW.findall(API_DOC.read_text())
    listed = {name for name, _, _ in rows}
    if set(cachedoctor.__all__) != listed:
        yield f"api.md lists {sorted(listed)}, cachedoctor.__all__ is {sorted(cachedoctor.__all__)}"
    for name, params, returns in rows:
        if not params:
            continue
        function = getattr(api, name, None)
        if function is None:
            yield f"api.md documents {name}(), which cachedoctor.api does not have"
            continue
        yield from _signature_problems(name, params[1:-1], inspect.signature(function))
        hints = typing.get_type_hints(function, localns=_type_checking_names(api))
        yield from _returns_problems(name, returns, hints["return"])
    probe = "import sys, cachedoctor; print(sorted({'jax', 'click', 'rich'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    if out.stdout.strip() != "[]":
        yield f"api.md: `import cachedoctor` is cheap, but it imports {out.stdout.strip()}"


def _type_checking_names(module: object) -> dict[str, object]:
    """What a module imports under ``TYPE_CHECKING`` (its annotations name them), imported."""
    names: dict[str, object] = {}
    for node in ast.walk(ast.parse(inspect.getsource(module))):  # type: ignore[arg-type]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module:
                    imported = importlib.import_module(stmt.module)
                    for alias in stmt.names:
                        names[alias.asname or alias.name] = getattr(imported, alias.name)
    return names


def _signature_problems(name: str, documented: str, actual: inspect.Signature) -> Iterator[str]:
    shown: list[tuple[str, str | None, bool]] = []  # name, default as written, keyword-only
    keyword_only = False
    for part in (p.strip() for p in documented.split(",") if p.strip()):
        if part == "*":
            keyword_only = True
            continue
        param, _, default = part.partition("=")
        shown.append((param, default or None, keyword_only))
    real = [
        (p.name, p.default, p.kind is inspect.Parameter.KEYWORD_ONLY)
        for p in actual.parameters.values()
    ]
    if [(n, k) for n, _, k in shown] != [(n, k) for n, _, k in real]:
        yield f"api.md: {name}({documented}) is not cachedoctor.api.{name}{actual}"
        return
    for (param, default, _), (_, real_default, _) in zip(shown, real, strict=True):
        if default is not None and repr(real_default) != default:
            yield f"api.md: {name}'s {param} defaults to {real_default!r}, not {default}"


def _returns_problems(name: str, returns: str, cls: type) -> Iterator[str]:
    """The attributes api.md lists for a report (outside parentheses) exist on its class."""
    if f"`{cls.__name__}`" not in returns:
        yield f"api.md: {name} returns {cls.__name__}, the table says {returns}"
    top = re.sub(r"\([^)]*\)", "", returns.partition(":")[2])
    fields = {f.name for f in dataclasses.fields(cls)} | set(dir(cls))
    for attr in re.findall(r"`(\w+)`", top):
        if attr not in fields:
            yield f"api.md: {cls.__name__} has no {attr}"


# --- docs/json-schema.md ------------------------------------------------------------------------

SCHEMA_DOC = ROOT / "docs" / "json-schema.md"
NEEDS_A_JAX_CACHE = {"show", "diff"}  # tests/e2e/test_documents.py runs them on one


def json_commands() -> set[str]:
    """Every command with a ``--json`` flag or a ``--format`` that offers json."""
    import click

    ctx = click.Context(cli)
    found = set()
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        for param in command.params if command else ():
            choices = getattr(param.type, "choices", ())
            if param.name == "as_json" or (param.name == "fmt" and "json" in choices):
                found.add(name)
    return found


@contextlib.contextmanager
def _quiet_environment(folder: Path) -> Iterator[dict[str, str]]:
    """No config, index or cache of the developer's: everything in ``folder``."""
    env = {
        "CACHEDOCTOR_CONFIG": str(folder / "config.toml"),
        "XDG_CACHE_HOME": str(folder / "xdg"),
        "JAX_COMPILATION_CACHE_DIR": str(folder / "cache"),
        "NO_COLOR": "1",
    }
    yield env


def schema_version_problems() -> Iterator[str]:
    commands = json_commands()
    table = SCHEMA_DOC.read_text().split("\n## ", 1)[0]
    for name in sorted(commands):
        if f"`{name} --" not in table:
            yield f"json-schema.md's table does not name `{name}`'s JSON document"
    with tempfile.TemporaryDirectory() as tmp, _quiet_environment(Path(tmp)) as env:
        cache = Path(tmp) / "cache"
        cache.mkdir()
        runs = {
            "scan": ["scan", str(cache), "--json"],
            "lint": ["lint", str(cache), "--format", "json"],
            "prune": ["prune", str(cache), "--orphans", "--json"],
            "rekey": ["rekey", str(cache), "--json"],
            "stats": ["stats", str(cache), "--json"],
            "why": ["why", str(cache), "--json"],
            "preflight": ["preflight", str(cache), "--json"],
            "pack": ["pack", str(cache), "-o", str(Path(tmp) / "b.tar"), "--json"],
            "unpack": ["unpack", str(Path(tmp) / "b.tar"), str(cache), "--json"],
            "status": ["status", "--json"],
            "check": ["check", "--runs", "1", "--format", "json", "--", sys.executable, "-c", ""],
        }
        for name in sorted(commands - NEEDS_A_JAX_CACHE - set(runs)):
            yield f"check_docs.py does not run `{name}`'s JSON document: add it to the runs"
        for name, argv in runs.items():
            out = subprocess.run(
                [sys.executable, "-m", "cachedoctor", *argv],
                capture_output=True,
                text=True,
                env={**_environ(), **env},
                timeout=300,
                check=False,
            )
            try:
                version = json.loads(out.stdout).get("schema_version")
            except ValueError:
                yield f"`cachedoctor {' '.join(argv[:1])} ...` printed no JSON: {out.stderr[-300:]}"
                continue
            if version != 1:
                yield f"`cachedoctor {name}`'s JSON document has schema_version {version!r}"
        yield from _scan_document_problems(cache)


def _environ() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDOCTOR_", "JAX_"))}


def _scan_document_problems(cache: Path) -> Iterator[str]:
    """The scan example's top-level and summary fields, and the ENTRY and FINDING tables."""
    from cachedoctor.cache.model import EntryInfo
    from cachedoctor.core.findings import Finding
    from cachedoctor.core.scan.run import scan_directory
    from cachedoctor.render.jsonout import ENTRY_FIELDS_NOT_SHOWN, scan_document
    from cachedoctor.storage.location import Location

    text = SCHEMA_DOC.read_text()
    document = scan_document(scan_directory(Location.parse(str(cache)), use_index=False))
    example = re.search(r"## `scan --json`\n\n```json\n(.*?)\n```", text, re.S)
    if example is None:
        yield "json-schema.md has no scan example"
        return
    shown = json.loads(re.sub(r"\[(ENTRY|FINDING), \.\.\.\]", "[]", example.group(1)))
    if list(shown) != list(document):
        yield f"json-schema.md's scan fields {list(shown)} are not the document's {list(document)}"
    if list(shown.get("summary", {})) != list(document["summary"]):
        yield f"json-schema.md's summary fields are not {list(document['summary'])}"
    for table, cls, extra in (("ENTRY", EntryInfo, {"ok", "format"}), ("FINDING", Finding, set())):
        hidden = set(ENTRY_FIELDS_NOT_SHOWN) if cls is EntryInfo else set()
        section = text.split(f"### {table}\n", 1)[-1].split("\n#", 1)[0]
        documented = set(re.findall(r"^\| ((?:`\w+`(?:, )?)+) \|", section, re.M))
        names = {n for cell in documented for n in re.findall(r"`(\w+)`", cell)}
        real = ({f.name for f in dataclasses.fields(cls)} | extra) - hidden
        if names != real:
            missing, unknown = sorted(real - names), sorted(names - real)
            yield f"json-schema.md's {table} table: missing {missing}, not fields {unknown}"


MAX_FUNCTION_LINES = 80  # docs/development.md, "Size"
LONG_MARKER = "long:"  # in a longer function's docstring, followed by why it stays whole
GENERATED = {SRC / "xla" / "_optionnames.py"}


def function_length_problems() -> Iterator[str]:
    """No function in src/ is longer than MAX_FUNCTION_LINES (``def`` line to its last, the
    docstring included) unless its docstring says ``long:`` and why."""
    for path in sorted(SRC.rglob("*.py")):
        if path in GENERATED:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES and LONG_MARKER not in (ast.get_docstring(node) or ""):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                yield (
                    f"{where}: {node.name} is {lines} lines (over {MAX_FUNCTION_LINES}): split it, "
                    f"or say why not after {LONG_MARKER!r} in its docstring"
                )


MAX_MODULE_LINES = 600  # docs/development.md, "Size"
# The modules in src/ allowed over MAX_MODULE_LINES (path under src/cachedoctor/ -> why it stays
# whole). An entry whose module is gone or back under the limit fails too: remove it then.
LONG_MODULES = {
    "xla/_optionnames.py": (
        "generated data table (python -m cachedoctor.xla.optionschema writes it from jaxlib's "
        "descriptors): one line per option field, no code to split"
    ),
}


def module_length_problems(
    src: Path = SRC, allowed: typing.Mapping[str, str] = LONG_MODULES
) -> Iterator[str]:
    """No module under ``src`` is over MAX_MODULE_LINES lines (counted as ``wc -l`` counts
    them) unless ``allowed`` names it, by its path under ``src``, with a reason; an entry of
    ``allowed`` whose module is gone or not over the limit is a problem too (a stale excuse)."""
    sizes = {
        path.relative_to(src).as_posix(): path.read_bytes().count(b"\n")
        for path in sorted(src.rglob("*.py"))
    }
    for name, lines in sizes.items():
        if lines > MAX_MODULE_LINES and not allowed.get(name, "").strip():
            yield (
                f"{name} is {lines} lines (over {MAX_MODULE_LINES}): split it along a seam, or "
                f"say why it stays whole in LONG_MODULES (tools/check_docs.py)"
            )
    for name in sorted(allowed):
        if name not in sizes:
            yield f"LONG_MODULES names {name}, which does not exist: remove its entry"
        elif sizes[name] <= MAX_MODULE_LINES:
            yield (
                f"{name} is {sizes[name]} lines, not over {MAX_MODULE_LINES}: remove its entry "
                f"from LONG_MODULES"
            )


def problems() -> list[str]:
    text = ARCHITECTURE.read_text()
    found = [
        *readme_problems(),
        *findings_doc.problems(),
        *named_path_problems(text, "architecture.md"),
        *package_list_problems(text),
        *registry_problems(text),
        *cli_render_problems(),
        *cycle_problems(),
        *api_problems(),
        *schema_version_problems(),
        *function_length_problems(),
        *module_length_problems(),
    ]
    return found


def main() -> int:
    if "--write" in sys.argv:
        target = ROOT / "docs" / "commands.md"
        target.write_text(render())
        findings_doc.TARGET.write_text(findings_doc.render())
        print(f"wrote {target} and {findings_doc.TARGET}")
        return 0
    errors = problems()
    for line in errors:
        print(f"docs: {line}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
