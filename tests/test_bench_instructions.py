"""benchmarks/instructions.py: marginal counts per task, repeats compared; one real count.

The counting test runs valgrind (two processes at once, ~15 s on an idle 2-core
machine): skipped where valgrind is missing, unless ``TRIOEXEC_REQUIRE_VALGRIND``
is set (then it fails).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest
from bench_scripts import load_script

import trioexec

REQUIRE_ENV = "TRIOEXEC_REQUIRE_VALGRIND"


@pytest.fixture
def instructions(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_script("instructions", monkeypatch)


def test_the_marginal_count_cancels_start_up_and_a_shared_side_is_counted_once(
    instructions: ModuleType,
) -> None:
    noop = instructions.SCENARIOS["noop"]
    stored = instructions.Side("with a store", "executor", "n", {"limit": 4, "store": True})
    store = instructions.Scenario("store", "store", stored, noop.ours, 2.0)  # one side shared
    start = {"executor": 1_000_000, "channel_pool": 900_000}
    per_task = {"executor": 100, "channel_pool": 80}
    calls = []

    def counter(side: object, size: int, r: int) -> dict[str, int]:
        calls.append((side, size, r))
        case = side.case  # type: ignore[attr-defined]
        if side is store.ours:  # repeat 2 is 50 higher: still agrees
            return {"instructions": 2_000_000 + 250 * size + r * 50, "store_writes": size // 5}
        return {"instructions": start[case] + per_task[case] * size + r * 100_000}

    results = instructions.measure([noop, store], 10, 2, 1, counter)
    assert len(calls) == 2 * (2 + 2 + 2)  # executor, pool, executor with a store; N and 2N
    by = {res["scenario"]: res for res in results}
    assert by["noop"]["trioexec"]["per_unit_repeats"] == [100.0, 100.0]
    assert by["noop"]["baseline"]["per_unit"] == 80.0
    assert by["noop"]["ratio"] == 1.25
    assert by["noop"]["met"] is False  # target 1.15x
    assert by["store"]["ratio"] == 2.5
    assert by["store"]["trioexec"]["totals_n"] == [2_002_500, 2_002_550]
    assert by["store"]["trioexec"]["transactions_2n"] == [4, 4]
    assert all(res["agree"] for res in results)
    assert "1.25x  <= 1.15x NO" in instructions.table(results)


def test_repeats_that_differ_are_flagged(instructions: ModuleType) -> None:
    def counter(side: object, size: int, r: int) -> dict[str, int]:
        return {"instructions": 10**9 + size * (1000 + 10 * r)}  # 1% apart

    (res,) = instructions.measure([instructions.SCENARIOS["defer"]], 100, 2, 2, counter)
    assert res["trioexec"]["per_unit_repeats"] == [1000.0, 1010.0]
    assert res["trioexec"]["spread"] == pytest.approx(0.01)
    assert res["agree"] is False


def test_reads_callgrind_totals(instructions: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text("version: 1\ncmd: python\nevents: Ir\nsummary: 1234\nfn=x\n0 1\ntotals: 1234\n")
    assert instructions.read_total(out) == 1234
    out.write_text("events: Ir\nsummary: 77\n")
    assert instructions.read_total(out) == 77


@pytest.mark.slow  # (~15 s of valgrind: in `nox -s soak`, not the default run)
def test_a_real_count_of_the_executor(
    instructions: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if shutil.which("valgrind") is None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"valgrind is not installed and {REQUIRE_ENV} is set")
        pytest.skip("valgrind is not installed")
    # One side against itself: two counted runs (N and 2N), the whole script path.
    noop = instructions.SCENARIOS["noop"]
    smoke = instructions.Scenario("smoke", "smoke", noop.ours, noop.ours, 1.0)
    monkeypatch.setattr(instructions, "SCENARIOS", {"smoke": smoke})
    out = tmp_path / "counts.json"
    argv = ["--only", "smoke", "--n", "10", "--repeat", "1", "--jobs", "2", "--json", str(out)]
    assert instructions.main(argv) == 0

    run = json.loads(out.read_text())
    assert Path(run["trioexec"]) == Path(trioexec.__file__).resolve().parent
    (res,) = run["results"]
    ours = res["trioexec"]
    assert res["ratio"] == 1.0
    assert ours["units"] == 10
    assert ours["totals_2n"][0] > ours["totals_n"][0] > 10**8  # the imports included
    assert 20_000 < ours["per_unit"] < 2_000_000  # ~106k at a63fe7b
