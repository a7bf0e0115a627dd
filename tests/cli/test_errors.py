"""The same condition gives the same one-line error in every command that takes a cache folder
(issue 24: a NotADirectoryError was `no-such-dir` in lint and `not-a-dir` in prune)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.caches import SCRIPT, cli_env

COMMANDS = [
    ["scan", "{d}"],
    ["lint", "{d}"],
    ["prune", "{d}", "--duplicates"],
    ["rekey", "{d}"],
    ["stats", "{d}"],
    ["stats", "{d}", "--zero"],
    ["show", "jit_x", "--dir", "{d}"],
    ["diff", "--module", "jit_x", "--dir", "{d}"],
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "slug"),
    [("missing", "no-such-dir"), ("a-file", "not-a-dir"), ("loop", "symlink-loop")],
)
def test_one_slug_per_condition_in_every_command(tmp_path: Path, where: str, slug: str) -> None:
    assert SCRIPT, "the cachedoctor console script is not installed in this environment"
    (tmp_path / "a-file").write_text("x")
    os.symlink("loop", tmp_path / "loop")
    said = {}
    for args in COMMANDS:
        argv = [a.format(d=tmp_path / where) for a in args]
        proc = subprocess.run(
            [SCRIPT, *argv], capture_output=True, text=True, env=cli_env(), timeout=120
        )
        assert proc.returncode == 2, (argv, proc)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "internal-error" not in lines[0], (argv, proc.stderr)
        said[" ".join(args[:1])] = lines[0].split(":")[1].strip()
    assert set(said.values()) == {slug}, said
