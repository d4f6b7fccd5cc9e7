"""Seeded synthetic traces, and inputs refused before any simulation starts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollmux.cli.main import app
from rollmux.inputs.errors import InputError
from rollmux.inputs.trace import read_trace, uniform_slo
from rollmux.sim.compare import compare
from rollmux.sim.generate import BENCH_SHAPES, TraceShape, generate, write_jsonl


def test_the_same_seed_gives_the_same_trace_and_jsonl_reads_it_back(tmp_path):
    shape = TraceShape(jobs=40, mix="training-heavy", arrivals="bursty", seed=3)
    assert generate(shape) == generate(shape)
    write_jsonl(generate(shape), tmp_path / "t.jsonl")
    back = read_trace(tmp_path / "t.jsonl", None, uniform_slo(1.2, 1.5, 0))
    assert [j.spec.name for j in back.jobs] == [j.spec.name for j in generate(shape).jobs]


def test_mixes_have_the_phase_ratios_they_promise():
    heavy = generate(TraceShape(jobs=50, mix="training-heavy", seed=1))
    assert all(2.0 <= j.spec.train.mean / j.spec.rollout.mean <= 4.01 for j in heavy.jobs)
    light = generate(TraceShape(jobs=50, mix="rollout-heavy", seed=1))
    assert all(2.99 <= j.spec.rollout.mean / j.spec.train.mean <= 6.01 for j in light.jobs)


def test_bursty_arrivals_come_in_bursts():
    trace = generate(TraceShape(jobs=60, arrivals="bursty", seed=2))
    gaps = [b.arrival - a.arrival for a, b in zip(trace.jobs, trace.jobs[1:], strict=False)]
    assert max(gaps) > 3600 and sorted(gaps)[len(gaps) // 2] <= 300


def test_missing_colocated_times_are_refused_before_any_simulation(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "arrival_s": 0, "departure_s": 100, "rollout_s": 10, "train_s": 10}\n')
    trace = read_trace(path, None, uniform_slo(1.2, 1.5, 0))
    ticks: list[str] = []
    with pytest.raises(InputError, match="co-located phase times") as error:
        compare(trace, ["rollmux", "solo", "colocated"], on_event=ticks.append)
    assert error.value.field == "colo" and ticks == []


def test_absurd_times_are_refused_naming_the_field(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "arrival_s": 0, "departure_s": 1e300, "rollout_s": 10, "train_s": 10}\n')
    result = CliRunner().invoke(app, ["simulate", str(path), "--policies", "rollmux"])
    assert result.exit_code == 2 and "departure_s" in result.output


def test_generate_command_writes_a_trace(tmp_path: Path):
    out = tmp_path / "g.jsonl"
    result = CliRunner().invoke(app, ["generate", str(out), "--jobs", "12", "--seed", "4"])
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 12


def test_generate_command_writes_each_bench_mix_as_the_benches_generate_it(tmp_path: Path):
    """The five mixes of the schedule-quality benches, from the command line: the same bytes."""
    for name, shape in BENCH_SHAPES.items():
        out, expected = tmp_path / f"{name}.jsonl", tmp_path / f"{name}-bench.jsonl"
        args = ["--jobs", "20", "--mix", shape.mix, "--arrivals", shape.arrivals, "--seed", "1"]
        result = CliRunner().invoke(app, ["generate", str(out), *args, "--median-hours", str(shape.median_hours)])
        assert result.exit_code == 0, result.output
        write_jsonl(generate(replace(shape, jobs=20, seed=1)), expected)
        assert out.read_bytes() == expected.read_bytes(), name
