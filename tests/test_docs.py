"""The documentation runs as written: a page whose command breaks fails the suite.

Every fenced block of the pages in ``PAGES`` is taken in document order, in a fresh
folder per page that holds links to the checkout's ``examples/`` and ``data/`` (the pages
run from the root of a checkout), with ``.venv/bin`` first on the PATH:

- ```` ```bash ```` blocks run with ``set -euo pipefail``, each in its own process group
  (killed when the page ends, so a service a page starts in the background never
  outlives it); what a block exports and the folder it ends in carry over to the next;
- ```` ```python ```` blocks are executed in one namespace per page;
- ```` ```yaml ```` blocks are validated by the pydantic model their marker names
  (``<!-- test: model=RunFile -->``; ``model=any`` only parses), so every job spec and run
  file shown is one RollMux accepts;
- a block with ``title="NAME"`` is first written to ``NAME``, so later commands use it;
- other blocks (``text``, ``json`` without a title, output) are not run.

An HTML comment on the line before a fence changes that: ``<!-- test: skip (why) -->``
for the few blocks that cannot run here (a multi-node cluster, kubectl), and
``<!-- test: slow (why) -->`` for blocks that run only in the slow variant (``pytest -m
slow``, ``bench/scenarios.py``). The ports 8765 and 8766 are replaced by free ones.
``docs/tutorials/trl.md`` has a test of its own. The generated reference pages are
checked against the code they are generated from.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
EXCLUDED = {"tutorials/trl.md"}
PAGES = sorted(
    path.relative_to(DOCS).as_posix()
    for pattern in ("getting-started.md", "tutorials/*.md", "concepts/*.md", "how-to/*.md")
    for path in DOCS.glob(pattern)
    if path.relative_to(DOCS).as_posix() not in EXCLUDED
)
DOC_PORTS = ("8765", "8766")
BLOCK_TIMEOUT_S = 240
MARKER = re.compile(r"^<!-- test: (.+?) -->$")
MODEL_MODULES = ("rollmux.inputs.runfile", "rollmux.inputs.jobfile", "rollmux.inputs.trace")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    title: str | None
    text: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in ("bash", "python", "yaml") or self.title is not None


def blocks(page: str, text: str | None = None) -> list[Block]:
    """The fenced blocks of a page, each with the marker on the line before it."""
    lines = (DOCS / page).read_text().splitlines() if text is None else text.splitlines()
    found, i, before = [], 0, None
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            info = line[3:].strip()
            lang = info.split()[0] if info else ""
            title = re.search(r'title="([^"]+)"', info)
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            if end is None:
                raise AssertionError(f"docs/{page}:{i + 1}: a fence that is never closed")
            marker = MARKER.match(before or "")
            body = "\n".join(lines[i + 1 : end]) + "\n"
            found.append(Block(page, i + 1, lang, title and title.group(1), body, marker and marker.group(1)))
            i, before = end + 1, None
            continue
        if line.strip():
            before = line.strip()
        i += 1
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def time_limit(seconds: float, where: str) -> Iterator[None]:
    def expired(_signum, _frame):
        raise TimeoutError(f"{where}: still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def model(name: str):
    for module in MODEL_MODULES:
        found = getattr(importlib.import_module(module), name, None)
        if found is not None:
            return found
    raise AssertionError(f"no model {name} in {', '.join(MODEL_MODULES)}")


class Page:
    """One page's run: its folder, its shell state, its Python namespace, its processes."""

    def __init__(self, page: str, folder: Path, slow: bool):
        self.page, self.slow = page, slow
        self.work = folder / "work"
        self.work.mkdir()
        for name in ("examples", "data"):
            (self.work / name).symlink_to(ROOT / name)
        self.state = folder / "shell"
        self.state.mkdir()
        (self.state / "cwd").write_text(str(self.work))
        self.ports = {port: str(free_port()) for port in DOC_PORTS}
        self.env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "160"}
        self.namespace: dict = {"__name__": "__docs__"}
        self.groups: list[int] = []

    def run(self, block: Block) -> None:
        marker = block.marker or ""
        if marker.startswith("skip") or (marker.startswith("slow") and not self.slow):
            return
        if marker and not marker.startswith(("slow", "model=")):
            raise AssertionError(f"{block.where}: unknown marker {marker!r} (skip, slow or model=NAME)")
        text = block.text
        for port, free in self.ports.items():
            text = text.replace(port, free)
        cwd = Path((self.state / "cwd").read_text().strip())
        if block.title:
            (cwd / block.title).write_text(text)
        if block.lang == "yaml":
            self.validate(block, text)
        elif block.lang == "bash":
            self.shell(block, text)
        elif block.lang == "python":
            self.python(block, text, cwd)

    def validate(self, block: Block, text: str) -> None:
        if not marker_names_model(block):
            raise AssertionError(f"{block.where}: a YAML block needs <!-- test: model=NAME --> (or skip)")
        name = block.marker.removeprefix("model=").split()[0]
        data = list(yaml.safe_load_all(text))
        if name != "any":
            assert len(data) == 1, f"{block.where}: one YAML document per block"
            model(name).model_validate(data[0])

    def shell(self, block: Block, text: str) -> None:
        env, cwd = self.state / "env.sh", self.state / "cwd"
        script = (
            f'[ -f "{env}" ] && source "{env}"\ncd "$(cat "{cwd}")"\nset -euo pipefail\n{text}\n'
            f'set +eu\nexport -p > "{env}"\npwd > "{cwd}"\n'
        )
        process = subprocess.Popen(
            ["bash", "-c", script],
            cwd=self.work,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.groups.append(process.pid)
        try:
            output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            output, _ = process.communicate()
            pytest.fail(f"{block.where}: still running after {BLOCK_TIMEOUT_S} s\n{text}\n{output[-4000:]}")
        if process.returncode != 0:
            pytest.fail(f"{block.where}: exited {process.returncode}\n{text}\n--- output ---\n{output[-4000:]}")

    def python(self, block: Block, text: str, cwd: Path) -> None:
        here = Path.cwd()
        os.chdir(cwd)
        try:
            with time_limit(BLOCK_TIMEOUT_S, block.where):
                exec(compile(text, block.where, "exec"), self.namespace)
        finally:
            os.chdir(here)

    def stop(self) -> None:
        """End every process a block left running (a service started in the background)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = []
            for group in self.groups:
                try:
                    os.killpg(group, sig)
                    alive.append(group)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while alive and time.monotonic() < deadline:
                alive = [g for g in alive if _group_alive(g)]
                time.sleep(0.1)
            if not alive:
                return


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def marker_names_model(block: Block) -> bool:
    return bool(block.marker) and (block.marker.startswith("model=") or block.marker.startswith("skip"))


def run_page(page: str, folder: Path, slow: bool = False, text: str | None = None) -> None:
    run = Page(page, folder, slow)
    try:
        for block in blocks(page, text):
            run.run(block)
    finally:
        run.stop()


@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_written(page, tmp_path):
    run_page(page, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if any((b.marker or "").startswith("slow") for b in blocks(p))])
def test_page_runs_with_its_slow_blocks(page, tmp_path):
    run_page(page, tmp_path, slow=True)


def test_the_pages_are_found_and_every_yaml_block_names_its_model():
    assert "getting-started.md" in PAGES and "tutorials/simulate.md" in PAGES and "tutorials/serve.md" in PAGES
    assert not EXCLUDED & set(PAGES)
    for page in PAGES:
        for block in blocks(page):
            if block.lang == "yaml":
                assert marker_names_model(block), f"{block.where}: say which model validates it"
    skipped = [b.where for p in PAGES for b in blocks(p) if (b.marker or "").startswith("skip") and b.runs]
    assert len(skipped) <= 12, f"too many blocks that never run: {skipped}"


def test_a_broken_command_fails_its_page(tmp_path):
    page = "\n".join(["# A page", "", "```bash", "echo this runs", "cat no-such-file", "echo this does not", "```", ""])
    with pytest.raises(pytest.fail.Exception, match="exited 1"):
        run_page("broken.md", tmp_path, text=page)


def test_a_yaml_block_that_the_model_refuses_fails_its_page(tmp_path):
    page = "\n".join(["<!-- test: model=JobSubmission -->", "```yaml", "name: x", "slo: 0.5", "```", ""])
    with pytest.raises(Exception, match="slo"):
        run_page("refused.md", tmp_path, text=page)


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_reference_covers_every_command_field_and_failpoint():
    hooks = _hooks()
    cli = hooks.cli_markdown()
    for command in ("simulate", "plan", "generate", "run", "replay", "report", "serve", "submit", "status", "cancel"):
        assert f"## rollmux {command}" in cli
    inputs = hooks.inputs_markdown()
    for model_class in hooks.input_models():
        for field in model_class.model_fields:
            assert f"| `{field}` |" in inputs, f"{model_class.__name__}.{field} is not documented"
    calls = set()
    for path in (ROOT / "rollmux").rglob("*.py"):
        calls |= set(re.findall(r"""failpoint\(f?["']([^"']+)["']\)""", path.read_text()))
    assert calls, "no failpoint found: the scan looks in the wrong place"
    assert {p["name"] for p in hooks.failpoints()} == calls
