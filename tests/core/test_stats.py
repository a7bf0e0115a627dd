"""`cachedoctor stats` and the recording behind it, against real JAX processes.

JAX is the oracle: with ``JAX_LOG_COMPILES=1`` and ``JAX_EXPLAIN_CACHE_MISSES=1`` it logs one
line per persistent-cache hit and one per miss, naming the module; the records must count
exactly those.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cachedoctor.cli import main
from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.programs import program_path
from tests.support.cli import invoke
from tests.support.hookrun import MISS_RE, base_env, run_recorded

HIT_RE = re.compile(r"Persistent compilation cache hit for '([^']+)'")


def stats_json(cache: Path, *args: str) -> dict:  # type: ignore[type-arg]
    """``stats --json`` as the console script runs it, in this process (a JAX-free command: a
    fresh interpreter per call cost 0.4 s of CPU and checked nothing more)."""
    code, out, err = invoke("stats", str(cache), "--json", *args)
    assert code == 0, err
    assert "Traceback" not in err
    return json.loads(out)  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stable", "observe", "stats"])
def test_stats_count_exactly_what_jax_logs(tmp_path: Path, mode: str) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    logs = [run_recorded(cache, mode) for _ in range(3)]
    hits = Counter(m for log in logs for m in HIT_RE.findall(log))
    misses = Counter(m for log in logs for m in MISS_RE.findall(log))
    assert sum(misses.values()) >= 3  # the first run misses every module

    report = stats_json(cache)
    assert report["processes"] == 3
    by_module = {m["module"]: m for m in report["modules"]}
    assert {m: r["hits"] for m, r in by_module.items() if r["hits"]} == dict(hits)
    assert {m: r["misses"] for m, r in by_module.items() if r["misses"]} == dict(misses)
    assert report["totals"]["requests"] == sum(hits.values()) + sum(misses.values())
    records = list((cache / STATS_DIRNAME).glob("*.json"))
    assert len(records) == 3
    assert {json.loads(r.read_text())["hook"] for r in records} == {mode}
    jit_f = by_module["jit_f"]
    if mode == "stable":  # stable keys: the custom_partitioning module hits from run 2 on
        assert jit_f["hits"] == 2
    else:  # JAX's keys: it never hits, and the scan says why
        assert jit_f["never_hit"] and jit_f["reason"].startswith("unstable key")
        assert report["modules"][0]["module"] == "jit_f"  # never-hit modules come first
        assert any(f["kind"] == "never-hit" for f in report["findings"])


@pytest.mark.slow
def test_stats_mode_changes_no_key(tmp_path: Path) -> None:
    """CACHEDOCTOR_HOOK=stats keeps JAX's own keys: the entries are those of a run without it.

    Both runs use one directory (its path is hashed into the key), emptied in between.
    """
    cache = tmp_path / "cache"
    cache.mkdir()
    run_recorded(cache, "off", "plain")
    plain_keys = sorted(p.name for p in cache.glob("*-cache"))
    assert not (cache / STATS_DIRNAME).exists()
    for entry in cache.glob("*-cache"):
        entry.unlink()
    run_recorded(cache, "stats", "plain")
    assert plain_keys and plain_keys == sorted(p.name for p in cache.glob("*-cache"))
    assert list((cache / STATS_DIRNAME).glob("*.json"))


@pytest.mark.slow
def test_concurrent_processes_lose_no_record(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    env = base_env(cache, CACHEDOCTOR_HOOK="stats", JAX_LOG_COMPILES="1")  # log hits too
    procs = [
        subprocess.Popen(
            [sys.executable, str(program_path("plain"))],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    logs = [p.communicate(timeout=300)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    requests = sum(len(HIT_RE.findall(x)) + len(MISS_RE.findall(x)) for x in logs)
    assert len(list((cache / STATS_DIRNAME).glob("*.json"))) == 4
    report = stats_json(cache)
    assert report["processes"] == 4
    assert report["totals"]["requests"] == requests


@pytest.mark.slow
def test_a_failed_write_warns_once_and_never_breaks_the_program(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / STATS_DIRNAME).write_text("a file where the folder should be")
    log = run_recorded(cache, "stats", "plain")
    assert log.count("cachedoctor: stats recording") == 1
    assert "result:" in log


@pytest.mark.slow
def test_torn_and_foreign_files_are_findings(
    recorded_cache: Path, copy_of, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = copy_of(recorded_cache)
    folder = cache / STATS_DIRNAME
    good = sorted(folder.glob("*.json"))[0]
    (folder / "torn.json").write_bytes(good.read_bytes()[:40])
    (folder / "foreign.json").write_text('{"hello": "world"}')
    (folder / "huge.json").write_bytes(b" " * (2 << 20))
    main(["stats", str(cache)])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    for name in ("torn.json", "foreign.json", "huge.json"):
        assert re.search(rf"stats-record .*{name} is not a readable stats record", out.out)
    assert re.search(r"processes\s+3\b", out.out)


def _without_root_override() -> list[str]:
    """A prefix that runs a command without root's power to read any file (so a mode-000 file
    is refused as it is to any user), or nothing when this is not root."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root, and no setpriv to drop CAP_DAC_OVERRIDE: every file is readable")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def _record_findings(cache: Path) -> tuple[int, list[dict[str, str]]]:
    proc = subprocess.run(
        [*_without_root_override(), sys.executable, "-m", "cachedoctor", "stats", str(cache),
         "--json"],
        capture_output=True, text=True, env=base_env(None), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    return doc["processes"], [f for f in doc["findings"] if f["kind"] == "stats-record"]


@pytest.mark.slow
def test_a_record_that_cannot_be_read_is_not_torn_and_the_advice_works(
    recorded_cache: Path, copy_of
) -> None:
    """Permission denied (the system's own refusal) and a link the reader will not follow: not
    called torn, and following each advice gets the record counted again."""
    cache = copy_of(recorded_cache)
    folder = cache / STATS_DIRNAME
    first = sorted(folder.glob("*.json"))[0]
    first.chmod(0)
    processes, found = _record_findings(cache)
    assert processes == 2, found
    (finding,) = found
    assert "cannot be read (permission denied)" in finding["message"], finding
    assert "torn" not in finding["advice"] + finding["message"], finding
    assert "`chmod a+r` the file" in finding["advice"], finding
    first.chmod(0o644)  # the advice, followed
    assert _record_findings(cache) == (3, [])

    link = folder / "20990101T000000-vm-1-00000000.json"
    link.symlink_to(first)
    processes, (finding,) = _record_findings(cache)
    assert processes == 3 and "symbolic link" in finding["message"], finding
    assert "remove the link" in finding["advice"] and "chmod" not in finding["advice"], finding
    link.unlink()  # the advice, followed
    assert _record_findings(cache) == (3, [])


@pytest.mark.slow
def test_records_that_break_a_rule_are_findings_not_totals(recorded_cache: Path, copy_of) -> None:
    """Issue 29 (8): beside the records of 3 real processes, a record claiming more hits than
    requests, one with a negative compile time and a file that is no record: stats and lint
    name each with its rule, and the totals are the real records' sums (read here with json)."""
    cache = copy_of(recorded_cache)
    folder = cache / STATS_DIRNAME
    real = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    assert len(real) == 3
    want: Counter[str] = Counter()
    for doc in real:
        for counters in doc["modules"].values():
            want.update({k: counters[k] for k in ("requests", "hits", "misses", "writes")})
    forged = json.loads(json.dumps(real[0]))
    module = next(iter(forged["modules"]))
    forged["modules"][module].update(requests=10, hits=20, misses=0)
    (folder / "forged-hits.json").write_text(json.dumps(forged))
    negative = json.loads(json.dumps(real[0]))
    negative["modules"][module]["compile_secs"] = -1.5
    (folder / "negative-time.json").write_text(json.dumps(negative))
    (folder / "notes.txt").write_text("not a record")

    report = stats_json(cache)
    totals = report["totals"]
    assert report["processes"] == 3
    assert {k: totals[k] for k in want} == dict(want)
    assert 0 <= totals["hit_rate"] <= 1 and totals["compile_secs"] >= 0
    rules = {
        "forged-hits.json": "hits 20 > requests 10",
        "negative-time.json": "compile_secs -1.5 is negative",
        "notes.txt": "is not a stats record",
    }
    lint = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "lint", str(cache), "--format", "json"],
        capture_output=True,
        text=True,
        env=base_env(None),
        timeout=300,
    )
    assert "Traceback" not in lint.stderr
    lint_findings = json.loads(lint.stdout)["findings"]
    for findings, files in ((report["findings"], "files"), (lint_findings, "entries")):
        named = {
            f[files][0].removeprefix(f"{STATS_DIRNAME}/"): f["message"]
            for f in findings
            if f["kind"] == "stats-record"
        }
        assert set(named) == set(rules), findings
        for name, rule in rules.items():
            assert rule in named[name], named[name]


@pytest.mark.slow
def test_since_module_and_zero(recorded_cache: Path, copy_of) -> None:
    cache = copy_of(recorded_cache)
    assert stats_json(cache, "--module", "jit_iota")["modules"][0]["module"] == "jit_iota"
    assert [m["module"] for m in stats_json(cache, "--module", "jit_i*")["modules"]] == ["jit_iota"]
    assert stats_json(cache, "--since", "1d")["processes"] == 3
    assert stats_json(cache, "--since", "2999-01-01")["processes"] == 0
    dry = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "stats", str(cache), "--zero"],
        capture_output=True,
        text=True,
        env=base_env(None),
    )
    assert "would archive and remove 3 records" in dry.stdout
    assert stats_json(cache)["processes"] == 3
    applied = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "stats", str(cache), "--zero", "--apply"],
        capture_output=True,
        text=True,
        env=base_env(None),
    )
    assert "archived 3 records" in applied.stdout, applied.stderr
    assert stats_json(cache)["processes"] == 0
    (archive,) = (cache / STATS_DIRNAME).glob("archive-*.jsonl")
    assert len(archive.read_text().splitlines()) == 3


@pytest.mark.slow
def test_bad_since_is_one_line_usage_error(recorded_cache: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "stats", str(recorded_cache), "--since", "soon"],
        capture_output=True,
        text=True,
        env=base_env(None),
    )
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()[-1]  # click's usage line, then the error
    assert "'--since': not a time: 'soon'" in err and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_lint_reports_a_module_that_never_hit(recorded_cache: Path) -> None:
    """jit_f (custom_partitioning, JAX's keys) compiled in 3 processes and never hit."""
    proc = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "lint", str(recorded_cache), "--format", "json"],
        capture_output=True,
        text=True,
        env=base_env(None),
    )
    findings = json.loads(proc.stdout)["findings"]
    never = [f for f in findings if f["kind"] == "never-hit"]
    assert [f["module"] for f in never] == ["jit_f"], proc.stdout
    assert "3 processes" in never[0]["message"] and "unstable key" in never[0]["message"]
    failing = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "lint", str(recorded_cache), "--fail-on", "warning"],
        capture_output=True,
        text=True,
        env=base_env(None),
    )
    assert failing.returncode == 1


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="needs Debian's chromium to render the page (`apt-get install -y chromium`; .ci/run "
    "installs it when it runs as root)",
)
def test_html_page_renders_in_headless_chromium(recorded_cache: Path, tmp_path: Path) -> None:
    page = tmp_path / "stats.html"
    report = stats_json(recorded_cache, "--html", str(page))
    html_text = page.read_text()
    assert not re.search(r"""(src|href)=["']?https?:""", html_text)  # nothing fetched
    proc = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    dom = proc.stdout
    assert "<svg" in dom, proc.stderr[-2000:]
    rate = f"{report['totals']['hit_rate']:.0%}"
    assert re.search(rf'id="kpi-processes"><b>{report["processes"]}</b>', dom)
    assert re.search(rf'id="kpi-hit-rate"><b>{rate}</b>', dom)
    bars = re.findall(r'<rect class="day" data-day="([\d-]+)" data-rate="(\d+%)"', dom)
    assert bars == [(d["name"], f"{d['hit_rate']:.0%}") for d in report["days"]]
    never = re.findall(r'<tr class="never"><td[^>]*>([^<]+)</td>', dom)
    assert never == [m["module"] for m in report["modules"] if m["never_hit"]] == ["jit_f"]


@pytest.mark.slow
def test_prune_keeps_the_stats_folder_bounded(recorded_cache: Path, copy_of) -> None:
    """An old archive that takes the folder over its bound goes first; the records stay."""
    cache = copy_of(recorded_cache)
    folder = cache / STATS_DIRNAME
    records = sorted(p.name for p in folder.glob("*.json"))
    archive = folder / "archive-20200101T000000Z.jsonl"
    archive.write_bytes(b"{}\n" * (11 << 20))  # 33 MiB, over the 32 MiB bound
    os.utime(archive, (1_577_836_800, 1_577_836_800))
    dry = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "prune", str(cache), "--orphans", "--json"],
        capture_output=True,
        text=True,
        env=base_env(None),
    )
    plan = json.loads(dry.stdout)
    doc = json.dumps(plan)
    assert f"{STATS_DIRNAME}/archive-20200101T000000Z.jsonl" in doc, doc[:2000]
    assert "stats-bound" in doc and f"{STATS_DIRNAME}/: {len(records) + 1} files" in doc
    assert archive.exists()  # a dry run
    subprocess.run(
        [sys.executable, "-m", "cachedoctor", "prune", str(cache), "--orphans", "--apply"],
        capture_output=True,
        text=True,
        env=base_env(None),
        check=True,
    )
    assert not archive.exists()
    assert sorted(p.name for p in folder.glob("*.json")) == records


@pytest.mark.slow
def test_enable_stats_only_records_through_the_config_file(tmp_path: Path) -> None:
    """`enable --stats-only` writes hook = "stats"; a process with only that file records."""
    cache, config = tmp_path / "cache", tmp_path / "config.toml"
    env = base_env(None, CACHEDOCTOR_CONFIG=str(config))
    subprocess.run(
        [sys.executable, "-m", "cachedoctor", "enable", "--dir", str(cache), "--stats-only"],
        env=env,
        check=True,
        capture_output=True,
    )
    assert 'hook = "stats"' in config.read_text()
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the config file names the cache dir
    proc = subprocess.run(
        [sys.executable, str(program_path("plain"))], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = stats_json(cache)
    assert report["processes"] == 1 and report["totals"]["requests"] >= 1
    assert not (cache / "cachedoctor-manifests").exists()  # no hook: no manifests


@pytest.mark.slow
def test_status_reports_stats_only_recording(tmp_path: Path) -> None:
    """In `stats` mode no hook is installed, yet `status` says recording is on and where to."""
    cache, config = tmp_path / "cache", tmp_path / "config.toml"
    env = base_env(None, CACHEDOCTOR_CONFIG=str(config))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cachedoctor", *args], env=env, capture_output=True, text=True
        )

    assert run("enable", "--dir", str(cache), "--stats-only").returncode == 0
    shown = run("status")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "hook active: no" in shown.stdout
    records = f"{cache}/{STATS_DIRNAME}/"
    assert f"stats recording: active (stats mode), records go to {records}" in shown.stdout
    assert json.loads(run("status", "--json").stdout)["probe"]["stats"] == {
        "mode": "stats",
        "records": records,
    }
    env["CACHEDOCTOR_HOOK"] = "off"
    assert "stats recording: no" in run("status").stdout


KEYED_HIT_RE = re.compile(r"Persistent compilation cache hit for '([^']+)' with key '([^']+)'")
KEYED_WRITE_RE = re.compile(r"Writing (\S+) to persistent compilation cache with key '([^']+)'")


@pytest.mark.slow
def test_records_name_each_key_jax_hit_and_wrote(tmp_path: Path) -> None:
    """Issue 29: per key, the records count what JAX's own log says of that key. With JAX's
    pointer flag, the seed's custom_partitioning module has one key on every run: run 1 writes
    it, run 2 hits it (stats-only recording: JAX's keys)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    flag = {"JAX_REMOVE_CUSTOM_PARTITIONING_PTR_FROM_CACHE_KEY": "1"}
    logs = []
    for _ in range(2):
        logs.append(run_recorded(cache, "stats", "seed", **flag))
    written = dict(KEYED_WRITE_RE.findall(logs[0]))
    hit = dict(KEYED_HIT_RE.findall(logs[1]))
    assert "jit_f" in written and hit.get("jit_f") == written["jit_f"], logs[1][-2000:]
    key = written["jit_f"]
    records = sorted(
        (json.loads(p.read_text()) for p in (cache / STATS_DIRNAME).glob("*.json")),
        key=lambda r: r["start"],
    )
    assert len(records) == 2
    first, second = (r["modules"]["jit_f"]["keys"] for r in records)
    assert first == {key: {"lookups": 1, "hits": 0, "writes": 1}}
    assert second == {key: {"lookups": 1, "hits": 1, "writes": 0}}
    # every module: the keys the records name are those JAX logged
    for log, record, pattern in (
        (logs[0], records[0], KEYED_WRITE_RE),
        (logs[1], records[1], KEYED_HIT_RE),
    ):
        logged = sorted(k for _, k in pattern.findall(log))
        counted = "writes" if pattern is KEYED_WRITE_RE else "hits"
        named = sorted(
            k
            for m in record["modules"].values()
            for k, n in m.get("keys", {}).items()
            if n[counted]
        )
        assert named == logged
