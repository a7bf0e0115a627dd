"""Keep the command reference honest: docs/commands.md is generated from each command's --help.

python tools/check_docs.py          # fail if docs/commands.md or README.md are stale
python tools/check_docs.py --write  # regenerate docs/commands.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from cachedoctor.cli import COMMANDS, cli  # noqa: E402

HEADER = """# Command reference

Generated from each command's `--help` by `python tools/check_docs.py --write`; `nox -s docs`
fails when it is stale.

Sizes, durations and times read alike in every command and in the Python API (`units.py`): a
SIZE is `50GB`, `800MiB` or bytes; an AGE is a number with `s`, `m`, `h`, `d` or `w` (`30d`,
`2w`; a bare number is seconds); WHEN is a time ago (`7d`), a UTC date (`YYYY-MM-DD`) or a Unix
time. A value that is not one is a usage error (exit 2) that shows the forms.

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


def main() -> int:
    target = ROOT / "docs" / "commands.md"
    fresh = render()
    if "--write" in sys.argv:
        target.write_text(fresh)
        print(f"wrote {target}")
        return 0
    errors = []
    if not target.exists() or target.read_text() != fresh:
        errors.append("docs/commands.md is stale: run `python tools/check_docs.py --write`")
    readme = (ROOT / "README.md").read_text()
    for name in COMMANDS:
        if f"cachedoctor {name}" not in readme:
            errors.append(f"README.md does not mention `cachedoctor {name}`")
    demo_cmd, test_cmd = readme_commands()
    if "cachedoctor demo" not in demo_cmd:
        errors.append("README's first command must run `cachedoctor demo`")
    ci = (ROOT / ".ci" / "run").read_text()
    if test_cmd not in ci:
        errors.append("README's test command is not what .ci/run runs")
    for line in errors:
        print(f"docs: {line}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
