"""errors.path_error: one slug and one wording per condition, for the OSError the kernel gives."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cachedoctor.errors import CachedoctorError, path_error


def kernel_error(path: Path) -> OSError:
    try:
        os.listdir(path)
    except OSError as exc:
        return exc
    raise AssertionError(f"{path} was listed")


def test_each_condition_has_its_slug(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    os.symlink("loop", tmp_path / "loop")
    cases = {
        tmp_path / "missing": ("no-such-dir", "no such directory: "),
        tmp_path / "a-file": ("not-a-dir", "not a directory: "),
        tmp_path / "loop": ("symlink-loop", "a loop of symbolic links"),
        tmp_path / ("x" * 300): ("name-too-long", "the name is too long"),
    }
    for path, (slug, words) in cases.items():
        error = path_error(kernel_error(path), path)
        assert isinstance(error, CachedoctorError)
        assert error.slug == slug and words in str(error), (path, error.slug, error)
    as_file = path_error(kernel_error(tmp_path / "missing"), tmp_path / "missing", what="file")
    assert as_file.slug == "no-such-file"


@pytest.mark.slow
def test_permission_denied(tmp_path: Path) -> None:
    """A mode-000 folder; as root, listed without CAP_DAC_OVERRIDE (setpriv), as any user."""
    (tmp_path / "closed").mkdir(mode=0o000)
    code = (
        "import os, sys; from cachedoctor.errors import path_error\n"
        "try: os.listdir(sys.argv[1])\n"
        "except OSError as exc: print(path_error(exc, sys.argv[1]).slug)\n"
    )
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("as root, mode-000 folders are readable; setpriv (util-linux) drops that")
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]
    proc = subprocess.run(
        [*prefix, sys.executable, "-c", code, str(tmp_path / "closed")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == "permission-denied"


def test_any_other_condition_is_io_in_the_systems_words(tmp_path: Path) -> None:
    error = path_error(OSError(5, "Input/output error"), tmp_path)
    assert error.slug == "io" and str(error) == f"cannot read {tmp_path}: Input/output error"


def test_a_long_path_is_clipped(tmp_path: Path) -> None:
    error = path_error(FileNotFoundError(2, "x"), "d" * 5000)
    assert len(str(error)) < 200 and "(5000 characters)" in str(error)
