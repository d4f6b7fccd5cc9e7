"""A real ``rollmux serve`` process for tests: started, waited for, killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class ServiceProcess:
    state_dir: Path
    port: int = field(default_factory=free_port)
    extra: tuple[str, ...] = ("--no-ray",)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return (self.state_dir / "token").read_text().strip()

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def start(self, timeout_s: float = 60.0) -> ServiceProcess:
        command = [sys.executable, "-m", "rollmux.cli.main", "serve", "--port", str(self.port)]
        command += ["--state-dir", str(self.state_dir), *self.extra]
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"service exited: {self.errors()}")
            try:
                httpx.get(self.url + "/readyz", timeout=1).raise_for_status()
                return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError("service did not come up")

    @property
    def log_path(self) -> Path:
        """The service's stderr goes to a file (a pipe nobody reads would fill and block it)."""
        return self.state_dir.parent / f"serve-{self.port}.log"

    def errors(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stacks(self) -> str:
        """The service's threads and control-plane tasks as they are now (it dumps them into
        its log on SIGUSR1 and SIGUSR2): for the message of a test that waited in vain."""
        assert self.process is not None
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            os.kill(self.process.pid, sig)
        time.sleep(1.0)
        return self.errors()[-20_000:]

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
