"""errors.path_error and errors.os_reason: one slug and one wording per condition, for the
OSError the kernel gives, whatever the verb (issue 24).

The errors are real: each comes from the operation the code does on a real path (a missing
name, a folder where a file belongs or the other way round, a symbolic-link loop, a 300-character
name, a mode-000 folder); the expected slugs are written out here, per verb.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cachedoctor.errors import CachedoctorError, clip, os_reason, path_error
from cachedoctor.stablekeys.settings import ConfigError
from cachedoctor.storage.files import open_regular, write_atomic

LONG = "x" * 300


def kernel_error(op: Callable[[], object]) -> OSError:
    try:
        op()
    except OSError as exc:
        return exc
    raise AssertionError("the operation succeeded")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """a-file, a-dir, loop (a link to itself) and file-link (a link to a-file)."""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    os.symlink("loop", tmp_path / "loop")
    os.symlink("a-file", tmp_path / "file-link")
    return tmp_path


def test_each_condition_has_its_slug(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    os.symlink("loop", tmp_path / "loop")
    cases = {
        tmp_path / "missing": ("no-such-dir", "no such directory: "),
        tmp_path / "a-file": ("not-a-dir", "not a directory: "),
        tmp_path / "loop": ("symlink-loop", "a loop of symbolic links"),
        tmp_path / LONG: ("name-too-long", "the name is too long"),
    }
    for path, (slug, words) in cases.items():
        error = path_error(kernel_error(functools.partial(os.listdir, path)), path)
        assert isinstance(error, CachedoctorError)
        assert error.slug == slug and words in str(error), (path, error.slug, error)
    missing = tmp_path / "missing"
    as_file = path_error(kernel_error(lambda: os.listdir(missing)), missing, what="file")
    assert as_file.slug == "no-such-file"


# verb -> (what, the operation the code does for it, {condition: (name, slug, message)})
# {p} in a message is the path as given, {d} its folder.
VERBS: dict[str, tuple[str, Callable[[Path], object], dict[str, tuple[str, str, str]]]] = {
    "read file": (
        "file",
        open_regular,  # show --extract's source, the config file, a baseline
        {
            "missing": ("missing", "no-such-file", "no such file: {p}"),
            "wrong kind": ("a-dir", "is-a-dir", "cannot read {p}: it is a directory"),
            "loop": ("loop", "symlink-loop", "cannot read {p}: a loop of symbolic links"),
            "long": (LONG, "name-too-long", "cannot read {p}: the name is too long"),
            "link": ("file-link", "symlink", "cannot read {p}: a symbolic link; not followed"),
        },
    ),
    "read dir": (
        "dir",
        os.listdir,  # a cache folder
        {
            "missing": ("missing", "no-such-dir", "no such directory: {p}"),
            "wrong kind": ("a-file", "not-a-dir", "not a directory: {p}"),
            "loop": ("loop", "symlink-loop", "cannot read {p}: a loop of symbolic links"),
            "long": (LONG, "name-too-long", "cannot read {p}: the name is too long"),
        },
    ),
    "use dir": (
        "dir",
        os.stat,  # enable's check of the cache folder and the folders above it
        {
            "missing": ("missing", "no-such-dir", "no such directory: {p}"),
            "wrong kind": ("a-file/sub", "not-a-dir", "not a directory: {p}"),
            "loop": ("loop", "symlink-loop", "cannot use {p}: a loop of symbolic links"),
            "long": (LONG, "name-too-long", "cannot use {p}: the name is too long"),
        },
    ),
    "write file": (
        "file",
        lambda p: write_atomic(p, b"report"),  # -o FILE, --extract, a baseline, the config
        {
            "missing": ("missing/out", "no-such-dir", "cannot write {p}: no such directory: {d}"),
            "wrong kind": ("a-dir", "is-a-dir", "cannot write {p}: it is a directory"),
            "loop": ("loop/out", "symlink-loop", "cannot write {p}: a loop of symbolic links"),
            "long": (LONG, "name-too-long", "cannot write {p}: the name is too long"),
            "under a file": (
                "a-file/out",
                "not-a-dir",
                "cannot write {p}: a part of its path is not a directory",
            ),
        },
    ),
    "create dir": (
        "dir",
        os.mkdir,  # enable's cache folder
        {
            "missing": ("missing/sub", "no-such-dir", "cannot create {p}: no such directory: {d}"),
            "wrong kind": (
                "a-file/sub",
                "not-a-dir",
                "cannot create {p}: a part of its path is not a directory",
            ),
            "loop": ("loop/sub", "symlink-loop", "cannot create {p}: a loop of symbolic links"),
            "long": (LONG, "name-too-long", "cannot create {p}: the name is too long"),
        },
    ),
    "remove file": (
        "file",
        os.unlink,  # disable's config file
        {
            "missing": ("missing", "no-such-file", "no such file: {p}"),
            "wrong kind": ("a-dir", "is-a-dir", "cannot remove {p}: it is a directory"),
            "loop": ("loop/x", "symlink-loop", "cannot remove {p}: a loop of symbolic links"),
            "long": (LONG, "name-too-long", "cannot remove {p}: the name is too long"),
        },
    ),
}
CASES = [(verb, cond) for verb, (_, _, conds) in VERBS.items() for cond in conds]


@pytest.mark.parametrize(("verb", "condition"), CASES, ids=[f"{v}-{c}" for v, c in CASES])
def test_each_condition_per_verb(tree: Path, verb: str, condition: str) -> None:
    word, what = verb.split()[0], VERBS[verb][0]
    op = VERBS[verb][1]
    name, slug, message = VERBS[verb][2][condition]
    path = tree / name
    exc = kernel_error(lambda: op(path))
    error = path_error(exc, path, what=what, verb=word)
    expected = message.format(p=clip(str(path)), d=path.parent)
    assert (error.slug, str(error)[: len(expected)]) == (slug, expected), (exc, str(error))
    assert "\n" not in str(error) and len(str(error)) < 250


def test_the_class_is_kept_and_the_condition_gives_the_slug(tree: Path) -> None:
    path = tree / "a-dir"
    error = path_error(
        kernel_error(lambda: open_regular(path)),
        path,
        what="config file",
        cls=ConfigError,
        hint="set CACHEDOCTOR_CONFIG to a file",
    )
    assert isinstance(error, ConfigError) and error.slug == "is-a-dir"
    assert str(error) == (
        f"cannot read config file {path}: it is a directory (set CACHEDOCTOR_CONFIG to a file)"
    )
    baseline = path_error(
        kernel_error(lambda: open_regular(tree / "nope")), "b.json", what="baseline"
    )
    assert (baseline.slug, str(baseline)) == ("no-such-file", "no such baseline file: b.json")


def test_os_reason_says_what_path_error_says(tree: Path) -> None:
    """The evidence of a finding or problem uses the condition's words, not the system's."""
    cases = {
        "missing": "no such file or directory",
        "a-dir": "it is a directory",
        "loop": "a loop of symbolic links",
        "file-link": "a symbolic link; not followed",
        LONG: "the name is too long",
        "a-file/x": "not a directory",
    }
    for name, reason in cases.items():
        exc = kernel_error(functools.partial(open_regular, tree / name))
        assert os_reason(exc) == reason, (name, exc)
    assert os_reason(OSError(errno.EIO, "Input/output error")) == "Input/output error"
    assert os_reason(OSError("no errno at all")) == "no errno at all"


def test_any_other_condition_is_io_in_the_systems_words(tmp_path: Path) -> None:
    error = path_error(OSError(5, "Input/output error"), tmp_path)
    assert error.slug == "io" and str(error) == f"cannot read {tmp_path}: Input/output error"
    written = path_error(OSError(errno.EFBIG, "File too large"), "x.bin", what="file", verb="write")
    assert (written.slug, str(written)) == ("io", "cannot write x.bin: File too large")


def test_a_long_path_is_clipped(tmp_path: Path) -> None:
    error = path_error(FileNotFoundError(2, "x"), "d" * 5000)
    assert len(str(error)) < 200 and "(5000 characters)" in str(error)


def test_an_unknown_verb_or_kind_is_a_bug_not_a_message(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="verb"):
        path_error(FileNotFoundError(2, "x"), tmp_path, verb="frobnicate")
    with pytest.raises(KeyError):
        path_error(FileNotFoundError(2, "x"), tmp_path, what="bucket")


_CLOSED = """
import json, os, sys
from cachedoctor.errors import path_error
from cachedoctor.storage.files import open_regular, write_atomic
closed = sys.argv[1]
ops = {
    "read dir": ("dir", "read", os.listdir, closed),
    "read file": ("file", "read", open_regular, os.path.join(closed, "f")),
    "use dir": ("dir", "use", os.stat, os.path.join(closed, "f")),
    "write file": ("file", "write", lambda p: write_atomic(p, b"x"), os.path.join(closed, "o")),
    "create dir": ("dir", "create", os.mkdir, os.path.join(closed, "sub")),
    "remove file": ("file", "remove", os.unlink, os.path.join(closed, "f")),
    "run command": ("command", "run", lambda p: os.execv(p, [p]), os.path.join(closed, "f")),
}
said = {}
for label, (what, verb, op, path) in ops.items():
    try:
        op(path)
        said[label] = "no error"
    except OSError as exc:
        error = path_error(exc, path, what=what, verb=verb)
        said[label] = [error.slug, str(error)]
print(json.dumps(said))
"""


@pytest.mark.slow
def test_permission_denied(tmp_path: Path) -> None:
    """A mode-000 folder, met by every verb. Root reads it regardless (CAP_DAC_OVERRIDE), so as
    root the check runs under setpriv without that capability; without setpriv it is skipped."""
    closed = tmp_path / "closed"
    closed.mkdir()
    (closed / "f").write_text("x")
    closed.chmod(0o000)
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("as root, mode-000 folders are readable; setpriv (util-linux) drops that")
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]
    try:
        proc = subprocess.run(
            [*prefix, sys.executable, "-c", _CLOSED, str(closed)],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        closed.chmod(0o700)
    said = json.loads(proc.stdout)
    for label, (slug, message) in said.items():
        verb = label.split()[0]
        assert slug == "permission-denied", (label, message)
        assert message.startswith(f"cannot {verb} {closed}") and message.endswith(
            ": permission denied"
        ), (label, message)


@pytest.mark.slow
def test_running_what_is_not_a_command(tree: Path) -> None:
    """What ``check -- CMD`` meets: the kernel's exec refusing a missing name, a folder, a loop
    and a 300-character name."""
    cases = {
        "missing": ("command-not-found", "no such command: {p}"),
        "a-dir": ("permission-denied", "cannot run {p}: permission denied"),
        "loop": ("symlink-loop", "cannot run {p}: a loop of symbolic links"),
        LONG: ("name-too-long", "cannot run {p}: the name is too long"),
    }
    for name, (slug, message) in cases.items():
        path = tree / name
        exc = kernel_error(functools.partial(subprocess.Popen, [path]))
        error = path_error(exc, path, what="command", verb="run")
        expected = message.format(p=clip(str(path)))
        assert (error.slug, str(error)[: len(expected)]) == (slug, expected), (name, exc)
