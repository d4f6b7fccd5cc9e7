"""``rollmux run`` end to end on local Ray, and its input validation."""

from __future__ import annotations

import json

import pytest
import ray
from typer.testing import CliRunner

from rollmux.cli.main import app
from rollmux.inputs.errors import InputError
from rollmux.inputs.runfile import load_run_file

runner = CliRunner()
TINY = """
cluster: {rollout_nodes: 1, train_nodes: 1}
jobs:
  - name: a
    iterations: 3
    slo: 2.0
    grpo: {prompts_per_iteration: 32, train_groups: 16}
  - name: b
    iterations: 3
    slo: 2.0
    grpo: {seed: 1, prompts_per_iteration: 32, train_groups: 16}
"""


def test_run_writes_trace_gantt_and_reward_curves_and_a_second_run_reports_done(tmp_path):
    example = tmp_path / "run.yaml"
    example.write_text(TINY)
    out = tmp_path / "out"
    try:
        result = runner.invoke(app, ["run", str(example), "--out", str(out)])
        assert result.exit_code == 0, result.output
        trace = json.loads((out / "timeline.json").read_text())
        slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] in ("rollout", "train")]
        assert len(slices) == 2 * 2 * 3  # two jobs, two phases, three iterations, one node each
        first = json.loads((out / "run.json").read_text())
        assert [len(first["histories"][j]) for j in ("a", "b")] == [3, 3]
        assert (out / "state" / "checkpoints" / "a.pt").exists() and (out / "state" / "checkpoints" / "b.pt").exists()
        for picture in ("gantt.png", "rewards.png"):
            assert (out / picture).read_bytes()[:4] == b"\x89PNG"

        again = runner.invoke(app, ["run", str(example), "--out", str(out)])
        assert again.exit_code == 0, again.output
        second = json.loads((out / "run.json").read_text())
        assert second["histories"] == first["histories"] and second["phase_log"] == first["phase_log"]
        assert {j["state"] for j in second["jobs"].values()} == {"done"}

        example.write_text(TINY.replace("iterations: 3", "iterations: 4", 1))
        changed = runner.invoke(app, ["run", str(example), "--out", str(out)])
        assert changed.exit_code == 2 and "already submitted with another spec" in changed.output
    finally:
        ray.shutdown()


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("jobs:\n  - name: a\n    iterations: 3\n    kind: ppo\n", 4, "jobs.0.kind"),
        ("jobs:\n  - name: a\n    iterations: 0\n", 3, "jobs.0.iterations"),
        ("jobs:\n  - name: a\n    iterations: 3\n    grpo: {d_model: 30, heads: 4}\n", 4, "jobs.0.grpo"),
        ("policy: fastest\njobs:\n  - name: a\n    iterations: 3\n", 1, "policy"),
        ("jobs:\n  - name: a b\n    iterations: 3\n", 2, "jobs.0.name"),
    ],
)
def test_bad_run_files_are_named(tmp_path, text, line, field):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_run_file(path)
    assert (caught.value.line, caught.value.field) == (line, field)


def test_run_command_refuses_bad_files_with_exit_code_2(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("jobs: []\n")
    result = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "field 'jobs'" in result.output
    assert not (tmp_path / "out").exists()
