"""Shell completion (click's, documented in docs/commands.md) as bash asks for it on TAB: the
function that `_CACHEDOCTOR_COMPLETE=bash_source cachedoctor` prints is sourced and called.
For a DIR, the answer is "dir", which that function turns into bash's own folder completion
(``compopt -o dirnames``)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.caches import SCRIPT, cli_env

ASK = """
eval "$(_CACHEDOCTOR_COMPLETE=bash_source "$CD")"
COMP_WORDS=($WORDS); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
if [ -n "$TRAILING" ]; then COMP_WORDS+=(""); COMP_CWORD=$(( COMP_CWORD + 1 )); fi
_cachedoctor_completion "$CD"
printf '%s\\n' "${COMPREPLY[@]}"
"""


def _bash() -> str:
    bash = shutil.which("bash")
    if bash is None or SCRIPT is None:
        pytest.skip("needs bash and the installed cachedoctor console script")
    return bash


def complete(words: str, *, trailing: bool = False) -> list[str]:
    env = {**cli_env(), "CD": str(SCRIPT), "WORDS": words, "TRAILING": "1" if trailing else ""}
    proc = subprocess.run(
        [_bash(), "--norc", "--noprofile", "-c", ASK], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def answer(words: str) -> list[str]:
    """click's side of the protocol: ``type,value`` lines for the bash function."""
    parts = words.split()
    env = {
        **cli_env(),
        "_CACHEDOCTOR_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(parts) - 1),
    }
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, env=env)
    return proc.stdout.split()


@pytest.mark.slow
def test_the_bash_script_registers_itself() -> None:
    _bash()
    env = {**cli_env(), "_CACHEDOCTOR_COMPLETE": "bash_source"}
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, env=env)
    assert "complete -o nosort -F _cachedoctor_completion cachedoctor" in proc.stdout


@pytest.mark.slow
def test_commands_options_and_kinds_complete_in_bash() -> None:
    assert complete("cachedoctor st") == ["stats", "status"]
    assert "--older-than" in complete("cachedoctor prune --old")
    assert complete("cachedoctor scan --ignore unk") == ["unknown-layout", "unknown-file"]
    assert complete("cachedoctor lint --format", trailing=True) == [
        "text",
        "json",
        "github",
        "junit",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "words",
    [
        "cachedoctor scan /tm",
        "cachedoctor lint /tm",
        "cachedoctor prune /tm",
        "cachedoctor rekey /tm",
        "cachedoctor stats /tm",
        "cachedoctor show x --dir /tm",
        "cachedoctor diff --dir /tm",
        "cachedoctor enable --dir /tm",
    ],
)
def test_a_dir_completes_as_folders(words: str) -> None:
    _bash()
    assert answer(words) == ["dir,/tm"]
