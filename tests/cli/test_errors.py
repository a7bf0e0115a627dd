"""The same condition gives the same one-line error in every command that takes a cache folder
(issue 24: a NotADirectoryError was `no-such-dir` in lint and `not-a-dir` in prune)."""

from __future__ import annotations

import json
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


@pytest.mark.slow
def test_files_a_command_reads_writes_or_runs(tmp_path: Path) -> None:
    """The same conditions on the files around the cache (a baseline, a report, the config file,
    the command ``check`` runs): one line, its condition's slug, exit 2 (issue 24)."""
    assert SCRIPT, "the cachedoctor console script is not installed in this environment"
    cache, a_dir = tmp_path / "cache", tmp_path / "a-dir"
    cache.mkdir()
    a_dir.mkdir()
    missing, a_file = tmp_path / "missing", tmp_path / "a-file"
    a_file.write_text("x")
    cases: list[tuple[list[str | Path], dict[str, str], str]] = [
        (
            ["lint", cache, "--baseline", missing],
            {},
            f"no-such-file: no such baseline file: {missing}",
        ),
        (
            ["lint", cache, "--baseline", a_dir],
            {},
            f"is-a-dir: cannot read baseline {a_dir}: it is",
        ),
        (
            ["lint", cache, "-o", missing / "r.txt"],
            {},
            f"no-such-dir: cannot write {missing}/r.txt",
        ),
        (
            ["lint", cache, "--write-baseline", a_dir],
            {},
            f"is-a-dir: cannot write baseline {a_dir}",
        ),
        (
            ["status"],
            {"CACHEDOCTOR_CONFIG": str(a_dir)},
            f"is-a-dir: cannot read config file {a_dir}",
        ),
        (["check", "--", missing], {}, f"command-not-found: no such command: {missing}"),
        (["check", "--", a_dir], {}, f"permission-denied: cannot run {a_dir}: permission denied"),
        (
            ["check", "--log", missing / "l.txt", "--", "true"],
            {},
            f"no-such-dir: cannot write {missing}/l.txt: no such directory: {missing}",
        ),
        (
            ["check", "--dir", a_file / "sub", "--", "true"],
            {},
            f"not-a-dir: not a directory: {a_file}/sub",
        ),
    ]
    for args, env, line in cases:
        argv = [str(a) for a in args]
        proc = subprocess.run(
            [SCRIPT, *argv], capture_output=True, text=True, env={**cli_env(), **env}, timeout=120
        )
        said = [x for x in proc.stderr.splitlines() if not x.startswith("cachedoctor check: run")]
        assert proc.returncode == 2 and len(said) == 1, (argv, proc.stderr)
        assert said[0].startswith(f"cachedoctor: {line}"), (argv, said[0])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("credentials", "hidden"),
    [
        # gcsfs's bucket-type probe logs google-auth's "default credentials were not found"
        (None, "Could not determine bucket type"),
        # google-auth warns about gcloud user credentials without a quota project
        ("gcloud-user", "UserWarning: Your application has authenticated using end user"),
    ],
)
def test_a_bucket_command_prints_cachedoctors_line_first(
    tmp_path: Path, credentials: str | None, hidden: str
) -> None:
    """What the bucket clients print on their own comes after nothing: the user's stderr starts
    (and here ends) with cachedoctor's one line; CACHEDOCTOR_DEBUG=1 shows what was hidden."""
    pytest.importorskip("gcsfs")
    assert SCRIPT, "the cachedoctor console script is not installed in this environment"
    gcloud = tmp_path / "gcloud"
    gcloud.mkdir()
    if credentials == "gcloud-user":  # what `gcloud auth application-default login` leaves
        from google.auth import _cloud_sdk

        adc = {"type": "authorized_user", "client_id": _cloud_sdk.CLOUD_SDK_CLIENT_ID,
               "client_secret": "x", "refresh_token": "y"}  # fmt: skip
        (gcloud / "application_default_credentials.json").write_text(json.dumps(adc))
    env = {k: v for k, v in cli_env().items() if not k.startswith(("GOOGLE_", "STORAGE_EMU"))}
    env["CLOUDSDK_CONFIG"] = str(gcloud)
    env["NO_GCE_CHECK"] = "True"  # google-auth: no metadata server to ask
    argv = [SCRIPT, "scan", "gs://cachedoctor-no-such-bucket/cache"]
    # both at once: each spends its time in google-auth's backoff (no metadata server, no DNS)
    plain, debug = (
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
        for e in (env, {**env, "CACHEDOCTOR_DEBUG": "1"})
    )
    plain_err = plain.communicate(timeout=300)[1]
    debug_err = debug.communicate(timeout=300)[1]
    assert plain.returncode == 2, plain_err
    lines = plain_err.strip().splitlines()
    assert lines[0].startswith("cachedoctor: ") and len(lines) == 1, plain_err
    assert hidden in debug_err, debug_err  # what it hides shows with CACHEDOCTOR_DEBUG
