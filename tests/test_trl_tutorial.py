"""``docs/tutorials/trl.md`` runs as written: a new user's TRL job, from nothing.

The page's fenced blocks are taken in order in an empty folder: a block with
``title="PATH"`` is the file at PATH, written there; ``bash`` blocks run there with
``set -euo pipefail`` and ``python`` blocks with the checkout's interpreter, with the
checkout's ``.venv/bin`` first on the PATH (an activated environment) and no PYTHONPATH:
the jobs find ``myjobs`` only as the page says. ``text`` blocks are output, not run. Then
both jobs must have finished every iteration, taking turns on the same two nodes, and the
page's table of settings must be the code's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "tutorials" / "trl.md"
BIN = Path(sys.executable).parent
BLOCK_TIMEOUT_S = 600
FENCE = re.compile(r"^```(\w*)(.*)$")
TABLE = re.compile(r"<!-- settings table: [^\n]*-->\n\n(.*?)\n<!-- end of settings table -->", re.S)


def blocks(text: str) -> list[tuple[str, str | None, str]]:
    """The page's fenced blocks in order: (language, title, body)."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        title = re.search(r'title="([^"]+)"', fence.group(2))
        found.append((fence.group(1), title and title.group(1), "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return found


def follow(page: str, folder: Path) -> list[str]:
    """Do what the page says in ``folder``; what each command printed."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "COLUMNS": "160"}
    printed = []
    for lang, title, body in blocks(page):
        if title is not None:
            (folder / title).parent.mkdir(parents=True, exist_ok=True)
            (folder / title).write_text(body)
            continue
        if lang == "bash":
            command = ["bash", "-c", "set -euo pipefail\n" + body]
        elif lang == "python":
            command = [str(BIN / "python"), "-c", body]
        else:
            continue
        done = subprocess.run(
            command, cwd=folder, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False
        )
        assert done.returncode == 0, f"{body}\nexit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        printed.append(done.stdout + done.stderr)
    return printed


def test_the_pages_table_of_settings_is_the_codes():
    from rollmux.jobs.trl_grpo import TRLTask, settings_table

    table = TABLE.search(PAGE.read_text())
    assert table is not None, "the page has no generated table of settings"
    assert table.group(1) == settings_table(TRLTask())
    for name in ("entropy_coef", "learning_rate", "max_completion_length", "threads", "loss_type", "max_grad_norm"):
        assert f"| `{name}` |" in table.group(1)


def test_from_another_directory_the_run_stops_before_any_job_as_the_page_shows(tmp_path):
    page = PAGE.read_text()
    for _, title, body in blocks(page):
        if title is not None:
            (tmp_path / title).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / title).write_text(body)
    (tmp_path / "myjobs" / "__init__.py").touch()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"COLUMNS": "400"}
    command = [str(BIN / "rollmux"), "run", str(tmp_path / "mine.yaml"), "--out", str(tmp_path / "out")]
    done = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120, check=False)
    said = " ".join(done.stderr.split())
    shown = next(body for lang, _, body in blocks(page) if lang == "text" and "cannot import" in body)
    claimed = " ".join(shown.split("\n", 1)[1].split())  # the error, without the command
    claimed = claimed.replace("/home/me/work/mine.yaml", str(tmp_path / "mine.yaml"))
    claimed = claimed.replace(" from /tmp ", f" from {elsewhere} ")
    assert done.returncode == 2 and said == claimed, said
    assert not (tmp_path / "out").exists()


def test_the_tutorial_runs_two_of_a_users_trl_jobs_multiplexed(tmp_path):
    page = PAGE.read_text()
    printed = follow(page, tmp_path)
    assert "PYTHONPATH" in page and "directory that holds `myjobs`" in page  # the import-path rule

    run = json.loads((tmp_path / "out" / "mine" / "run.json").read_text())
    jobs = {name: yaml_job["iterations"] for name, yaml_job in _run_file_jobs(tmp_path / "mine.yaml").items()}
    assert set(jobs) == {"letters-a", "letters-b"} and not run["errors"]
    for name, iterations in jobs.items():
        assert run["jobs"][name]["state"] == "done" and len(run["histories"][name]) == iterations
        assert "reward/next_letter_reward" in run["histories"][name][-1]
        assert run["jobs"][name]["realised_slowdown"] > 1.0
    phases = sorted(run["phases"], key=lambda p: p["granted"])
    nodes = {(p["job"], p["phase"]): tuple(p["nodes"]) for p in phases}
    assert nodes[("letters-a", "rollout")] == nodes[("letters-b", "rollout")]
    assert nodes[("letters-a", "train")] == nodes[("letters-b", "train")]
    trains = [p["job"] for p in phases if p["phase"] == "train"]
    switches = sum(a != b for a, b in zip(trains, trains[1:], strict=False))
    # Interleaved, not one job after the other:
    assert switches >= min(jobs.values()), f"the jobs did not take turns: {trains}"

    settings = (tmp_path / "out" / "mine" / "state" / "checkpoints" / "letters-b.settings.txt").read_text()
    assert re.search(r"entropy_coef +0\.0 +set", settings)
    assert re.search(r"temperature +0\.9 +trl_options\(\)", settings)
    assert any("letters-a 30 iterations" in text for text in printed)


def _run_file_jobs(path: Path) -> dict[str, dict]:
    from rollmux.inputs.runfile import load_run_file

    return {job.name: job.model_dump() for job in load_run_file(path).jobs}
