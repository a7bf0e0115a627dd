"""``benchmarks/loop.py --by-module`` puts each test's CPU on its own module (issue 55).

A small test tree, run under pytest with the testcost plugin as ``loop.py`` runs it (one xdist
worker, so both modules' tests run in one process, one after the other): one module's test
starts a child that burns a known amount of CPU, another starts nothing. The child's CPU must
land on the first module and none on the second; the count of processes likewise. No JAX
process: pytest, its worker and one child (about 2 s of CPU).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.caches import REPO
from tests.support.scripts import load_script

pytestmark = pytest.mark.slow  # it runs pytest in a subprocess

BURN_S = 0.3  # CPU the child spends, measured by itself (process_time), not by a clock

BURNS = f"""
import os, subprocess, sys

CHILD = "import time\\nwhile time.process_time() < {BURN_S}: pass"

def test_a_child_burns_cpu():
    assert "PYTEST_PLUGINS" not in os.environ  # a pytest it started would record here too
    subprocess.run([sys.executable, "-c", CHILD], check=True)
"""
IDLE = """
def test_starts_nothing():
    assert sum(range(1000)) == 499500

def test_starts_nothing_either():
    pass
"""


def test_each_module_gets_the_cpu_of_the_processes_its_tests_waited_for(tmp_path: Path) -> None:
    loop = load_script(REPO / "benchmarks" / "loop.py", "benchmarks_loop")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "test_burns.py").write_text(BURNS)
    (tree / "test_idle.py").write_text(IDLE)
    costs = tmp_path / "costs"
    costs.mkdir()
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", str(tree)]
    run = subprocess.run(
        argv, cwd=tmp_path, env=loop.plugin_env(costs), capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout[-3000:]

    documents = loop.read_costs(costs)
    assert sorted(d["worker"] for d in documents) == [
        "gw0"
    ]  # the worker's; none from the controller
    rows = {r["module"]: r for r in loop.module_costs(documents)}
    burns, idle = rows["tree/test_burns.py"], rows["tree/test_idle.py"]
    assert (burns["tests"], idle["tests"]) == (1, 2)
    assert burns["children_cpu_s"] >= BURN_S and burns["processes"] == 1
    assert idle["children_cpu_s"] == 0 and idle["processes"] == 0
    assert next(r["module"] for r in loop.module_costs(documents)) == "tree/test_burns.py"
    table = loop.module_table(list(rows.values()), 1.0, burns["cpu_s"] + idle["cpu_s"] + 2.0)
    assert "all tests" in table and table.splitlines()[-1].split()[-2:] == ["2.0", "2"]
