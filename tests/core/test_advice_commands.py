"""Every command a finding's advice or evidence tells the user to run is one the CLI reads as
written (issue 54, "Predictions/advice"): its command exists and its options parse, the
template's fields filled as the rules fill them. Whether each does what its advice says is
``test_advice_followed.py``'s, on real caches."""

from __future__ import annotations

import re
import shlex

import click
import pytest

from cachedoctor.cli import cli
from cachedoctor.core import catalog
from cachedoctor.core.findings import Case

COMMAND = re.compile(r"`(cachedoctor [^`]+)`")
# what the rules put in a command's fields: a module, a size, a cache dir
FILLED = {"module": "jit_f", "size": "50GB", "stored": "/data/jaxcache"}


def advised() -> list[tuple[str, str]]:
    """(case, command) for each command in each case's advice and evidence."""
    out = []
    for name, case in vars(catalog).items():
        if isinstance(case, Case):
            for command in COMMAND.findall(case.advice + " " + case.evidence):
                out.append((name, command))
    return out


@pytest.mark.parametrize(("case", "command"), advised())
def test_each_advised_command_parses(case: str, command: str) -> None:
    words = shlex.split(command.format_map(FILLED))[1:]
    parent = cli.make_context("cachedoctor", [], resilient_parsing=True)
    sub = cli.get_command(parent, words[0])
    assert sub is not None, f"{case}: no command {words[0]!r} in {command!r}"
    try:
        sub.make_context(words[0], words[1:], parent=parent)
    except click.ClickException as exc:
        pytest.fail(f"{case}: `{command}` does not parse: {exc.format_message()}")


def test_the_advice_names_commands() -> None:
    assert len({c for _, c in advised()}) >= 10  # the catalog's commands were found
