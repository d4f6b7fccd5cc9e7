"""The state directory is private: a real control-plane process started by a user whose
umask lets others read what it creates, on a state directory an older version left
world-readable, keeps every folder there 0700 and every file 0600 — the token, the
database with its write-ahead log and shared memory, the writer lock, the checkpoints —
while a job runs a phase."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import torch
from torch import nn

from rollmux.sdk.state import RoleState
from rollmux.wire.client import Client
from tests.service_process import ServiceProcess

SPEC = {"rollout_s": 1.0, "train_s": 1.0, "slo": 2.0}


def modes(folder: Path) -> dict[str, int]:
    """Every path under ``folder`` (itself as '.') and its permission bits."""
    found = {".": stat.S_IMODE(folder.stat().st_mode)}
    for path in folder.rglob("*"):
        found[str(path.relative_to(folder))] = stat.S_IMODE(path.stat().st_mode)
    return found


def test_every_file_of_the_state_directory_is_the_owners_only(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)  # as an older version (or a umask of 022) left it
    loose = os.umask(0o022)
    try:
        service = ServiceProcess(state, extra=("--no-ray", "--no-regroup", "--no-slo-guard")).start()
    finally:
        os.umask(loose)
    try:
        api = Client(service.url, service.token)
        api.request("POST", "/v1/jobs", json={"name": "a", **SPEC})
        with api.running("a") as turns, turns.phase("rollout"):
            turns.report({"reward": 1.0})
        found = modes(state)
    finally:
        service.stop()
    assert {"token", "rollmux.db", "rollmux.db-wal", "rollmux.db-shm", "rollmux.db.lock", "checkpoints"} <= set(found)
    for name, mode in found.items():
        expected = 0o700 if (state / name).is_dir() else 0o600
        assert mode == expected, f"{name} is {mode:03o}, not {expected:03o}"


def test_a_checkpoint_is_written_for_its_owner_only(tmp_path):
    model = nn.Linear(2, 2)
    loose = os.umask(0o022)
    try:
        role = RoleState(model, torch.optim.SGD(model.parameters(), lr=0.1), device="cpu")
        role.save(tmp_path / "checkpoints" / "a.pt")
    finally:
        os.umask(loose)
    assert stat.S_IMODE((tmp_path / "checkpoints" / "a.pt").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "checkpoints").stat().st_mode) == 0o700
