"""Entrypoints checked before any job starts: ``package.module:callable`` must name a module
the job's processes can import, with the callable's first name defined in it.

A run's job drivers and workers import the module from the Python path of the process that
started Ray, with that process's working directory first (Ray adds it): for ``rollmux run``
the directory it runs in, then ``PYTHONPATH`` and the installed packages. The check looks
the module up the same way without running it (a job's module imports torch and TRL, which
takes seconds to minutes), and reads its source for the callable's first name.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollmux.inputs.errors import InputError
from rollmux.inputs.jobfile import line_of


def entrypoint_problem(entrypoint: str, folder: Path) -> str | None:
    """Why the processes of a run started in ``folder`` could not find ``entrypoint``, as
    advice; None where they can (or where its source does not tell)."""
    module, _, attribute = entrypoint.partition(":")
    top = module.split(".")[0]
    try:
        spec = _find_module(module, folder)
    except (ImportError, ValueError) as error:
        spec, reason = None, str(error)
    else:
        reason = ""
    if spec is None:
        return (
            f"cannot import {module!r} from {folder} (where the run starts its processes) or the Python path"
            f"{f': {reason}' if reason else ''}; run from the directory that holds {top!r}, or add that "
            "directory to PYTHONPATH"
        )
    name = attribute.split(".")[0]
    if name not in _defined_names(spec):
        return f"module {module!r} ({spec.origin}) defines no {name!r} at its top level"
    return None


def check_entrypoints(path: Path | str, data: Any, folder: Path | None = None) -> None:
    """Raise an :class:`InputError` naming the file, the job and the field of the first
    entrypoint that the processes of a run started in ``folder`` (by default here) could
    not import. ``data``: the file as read, one job or a mapping with a ``jobs:`` list."""
    where = Path.cwd() if folder is None else folder
    listed = isinstance(data, dict) and isinstance(data.get("jobs"), list)
    jobs = data["jobs"] if listed else [data]
    for index, job in enumerate(jobs):
        entrypoint = job.get("entrypoint") if isinstance(job, dict) else None
        if not isinstance(entrypoint, str):
            continue
        reason = entrypoint_problem(entrypoint, where)
        if reason is not None:
            loc = ("jobs", index, "entrypoint") if listed else ("entrypoint",)
            raise InputError(
                path, f"job {job.get('name')!r}: {reason}", line=line_of(Path(path), loc), field=".".join(map(str, loc))
            )


def _find_module(module: str, folder: Path) -> importlib.machinery.ModuleSpec | None:
    """The module's spec as a process whose path starts with ``folder`` finds it, without
    running the module or its packages."""
    if module in sys.modules:
        return getattr(sys.modules[module], "__spec__", None) or importlib.machinery.ModuleSpec(module, None)
    parts = module.split(".")
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.find_spec(parts[0]) if parts[0] not in sys.modules else sys.modules[parts[0]].__spec__
    finally:
        sys.path.remove(str(folder))
    for depth in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        name = ".".join(parts[: depth + 1])
        loaded = sys.modules.get(name)
        spec = (
            loaded.__spec__
            if loaded is not None
            else importlib.machinery.PathFinder.find_spec(name, list(spec.submodule_search_locations))
        )
    return spec


def _defined_names(spec: importlib.machinery.ModuleSpec) -> _Names:
    """The names the module's source defines at its top level (everything, where it
    cannot tell: no source, a star import, a module ``__getattr__``)."""
    loaded = sys.modules.get(spec.name)
    if loaded is not None:
        return _Names(set(vars(loaded)), everything=False)
    origin = spec.origin
    if not origin or not origin.endswith(".py"):
        return _Names(set(), everything=True)
    try:
        tree = ast.parse(Path(origin).read_text(), origin)
    except (OSError, SyntaxError, ValueError):
        return _Names(set(), everything=True)  # importing it tells the driver what is wrong
    names: set[str] = set()
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return _Names(names, everything=True)
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
    return _Names(names, everything="__getattr__" in names)


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements run at import: the module's own, and those inside its ifs, trys and withs."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.With, ast.Try)):
            yield from _top_level(node.body)
            for more in (getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                yield from _top_level(more)
            for handler in getattr(node, "handlers", []):
                yield from _top_level(handler.body)


@dataclass(frozen=True)
class _Names:
    names: set[str]
    everything: bool
    """The source does not tell: every name may be there."""

    def __contains__(self, name: object) -> bool:
        return self.everything or name in self.names
