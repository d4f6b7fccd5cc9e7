"""MkDocs hooks: the reference pages generated from the code at build time.

A page holds a marker such as ``<!-- generated: cli -->`` where the generated text goes:

- ``cli``: every ``rollmux`` command with its usage and options, from the Typer app;
- ``http-api``: every endpoint and schema of the control plane's HTTP API, from the
  OpenAPI schema of ``rollmux.service.api.create_app`` (built over a throw-away SQLite
  store and no executor: nothing is started, no Ray);
- ``inputs``: every field of the job spec, plan, run file, job file, trace record and
  profile, from their pydantic models (type, default, bounds, description);
- ``metrics``: every metric ``GET /metrics`` exposes, from an answer of that app;
- ``layers``: the package import graph of ``rollmux/``, parsed from the source;
- ``failpoints``: every ``failpoint(...)`` call under ``rollmux/``, found by parsing the
  source, with the variables that arm them.

The same functions are imported by ``tests/test_docs.py``. The OpenAPI schema is also
published beside the page as ``reference/openapi.json``.
"""

from __future__ import annotations

import ast
import enum
import json
import re
import tempfile
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rollmux"
MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")


def _cell(text: Any) -> str:
    """Text safe inside a Markdown table cell."""
    text = " ".join(str(text).split())
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: Any) -> str:
    """Inline code safe inside a Markdown table cell."""
    text = " ".join(str(text).split())
    return f"`` {text} ``" if "`" in text else f"`{text}`"


# --- the CLI -------------------------------------------------------------------------


def cli_markdown() -> str:
    """Every command of the ``rollmux`` Typer app: usage, help and options as ``--help`` shows them."""
    import typer

    from rollmux.cli.main import app

    root = typer.main.get_command(app)
    context = root.context_class(root, info_name="rollmux")
    lines = [_first_paragraph(root.help or ""), ""]
    for name in root.list_commands(context):
        command = root.get_command(context, name)
        if command is None or command.hidden:
            continue
        sub = command.context_class(command, info_name=name, parent=context)
        usage = " ".join(["rollmux", name, *command.collect_usage_pieces(sub)])
        lines += [f"## rollmux {name}", "", "```text", usage, "```", "", _prose(command.help or ""), ""]
        rows = []
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            record = param.get_help_record(sub)
            if record is None:
                continue
            opts, text = record
            kind = "argument" if param.param_type_name == "argument" else "option"
            rows.append(f"| {_code(opts)} | {kind} | {_cell(text)} |")
        if rows:
            lines += ["| name | kind | what it does |", "| --- | --- | --- |", *rows, ""]
    return "\n".join(lines)


def _first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n")[0].split())


def _prose(text: str) -> str:
    """A docstring's paragraphs, each joined into one line."""
    return "\n\n".join(" ".join(p.split()) for p in text.strip().split("\n\n"))


# --- the HTTP API ----------------------------------------------------------------------


@cache
def _service_documents() -> tuple[dict[str, Any], str]:
    """The OpenAPI schema and a ``/metrics`` answer of the control plane's app, built over a
    throw-away SQLite store with no executor, and never started: nothing is served, no Ray."""
    from fastapi.testclient import TestClient

    from rollmux.service.api import create_app
    from rollmux.service.control import ControlOptions, ControlPlane
    from rollmux.service.store import Store

    with tempfile.TemporaryDirectory() as folder:
        store = Store(f"sqlite:///{Path(folder) / 'docs.db'}")
        try:
            control = ControlPlane(store, ControlOptions(checkpoint_dir=Path(folder) / "checkpoints"))
            app = create_app(control, token="docs")
            fastapi_app = getattr(app, "app", app)  # create_app wraps the app in its request guard
            client = TestClient(app)  # not entered as a context: the control plane is not started
            metrics = client.get("/metrics", headers={"Authorization": "Bearer docs"})
            metrics.raise_for_status()
            return fastapi_app.openapi(), metrics.text
        finally:
            store.engine.dispose()


def openapi_schema() -> dict[str, Any]:
    """The OpenAPI schema of the control plane's app."""
    return _service_documents()[0]


def metrics_markdown() -> str:
    """Every metric ``GET /metrics`` exposes, from an answer of the app itself."""
    helps, kinds, labels = {}, {}, {}
    for line in _service_documents()[1].splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[7:].partition(" ")
            helps[name] = text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            kinds[name] = kind
        elif line and not line.startswith("#"):
            sample = line.split(" ")[0]
            name, _, rest = sample.partition("{")
            keys = sorted({pair.split("=")[0] for pair in rest.rstrip("}").split(",") if pair})
            labels.setdefault(name, set()).update(keys)
    lines = ["| metric | type | labels | what |", "| --- | --- | --- | --- |"]
    for name, text in helps.items():
        exposed = sorted(n for n in labels if n == name or n.startswith(name + "_"))
        shown = ", ".join(f"`{n}`" for n in exposed) or f"`{name}`"
        keys = ", ".join(f"`{k}`" for n in exposed for k in sorted(labels[n])) or "—"
        lines.append(f"| {shown} | {kinds.get(name, '')} | {keys} | {_cell(text)} |")
    return "\n".join(lines) + "\n"


def _schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_schema_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " or ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type")
    if kind == "array":
        return f"list of {_schema_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map to {_schema_type(schema['additionalProperties'])}"
    return str(kind or "any")


def _bounds(schema: dict[str, Any]) -> str:
    marks = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<"}
    found = [f"{sign} {schema[key]}" for key, sign in marks.items() if key in schema]
    if "pattern" in schema:
        found.append(f"matches {_code(schema['pattern'])}")
    if "maxLength" in schema:
        found.append(f"at most {schema['maxLength']} characters")
    return ", ".join(found)


def http_api_markdown() -> str:
    """Every endpoint (parameters, body, answers) and every schema of the OpenAPI document."""
    schema = openapi_schema()
    info = schema["info"]
    lines = [f"{info['description']} (OpenAPI document version {info['version']}.)", ""]
    lines += ["| method | path | what |", "| --- | --- | --- |"]
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            anchor = _operation_anchor(method, path)
            lines.append(f"| {method.upper()} | [{_code(path)}](#{anchor}) | {_cell(operation.get('summary', ''))} |")
    lines += ["", "## Endpoints", ""]
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            lines += _operation(method, path, operation)
    lines += ["## Schemas", ""]
    for name, body in schema.get("components", {}).get("schemas", {}).items():
        lines += _component(name, body)
    return "\n".join(lines)


def _operation_anchor(method: str, path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", f"{method} {path}".lower()).strip("-")


def _operation(method: str, path: str, operation: dict[str, Any]) -> list[str]:
    lines = [f"### {method.upper()} {path} {{#{_operation_anchor(method, path)}}}", ""]
    if operation.get("description"):
        lines += [_prose(operation["description"]), ""]
    params = operation.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | bounds | description |", "| --- " * 6 + "|"]
        for p in params:
            s = p.get("schema", {})
            default = f" (default {_code(json.dumps(s['default']))})" if "default" in s else ""
            lines.append(
                f"| `{p['name']}` | {p['in']} | {_schema_type(s)} | {'yes' if p.get('required') else 'no'} "
                f"| {_cell(_bounds(s))} | {_cell(p.get('description', s.get('description', '')))}{default} |"
            )
        lines.append("")
    body = operation.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines.append(f"Request body ({media}): {_schema_type(content.get('schema', {}))}")
            lines.append("")
    lines += ["| answer | meaning | body |", "| --- | --- | --- |"]
    for code, answer in operation.get("responses", {}).items():
        content = answer.get("content", {})
        body_type = ", ".join(_schema_type(c.get("schema", {})) for c in content.values()) or "—"
        lines.append(f"| {code} | {_cell(answer.get('description', ''))} | {body_type} |")
    return [*lines, ""]


def _component(name: str, body: dict[str, Any]) -> list[str]:
    lines = [f"### {name} {{#{name.lower()}}}", ""]
    if body.get("description"):
        lines += [_prose(body["description"]), ""]
    properties = body.get("properties", {})
    if "enum" in body:
        lines += ["One of " + ", ".join(f"`{v}`" for v in body["enum"]) + ".", ""]
    if not properties:
        return lines
    required = set(body.get("required", ()))
    lines += ["| field | type | required | default | bounds | description |", "| --- | --- | --- | --- | --- | --- |"]
    for field, s in properties.items():
        default = _code(json.dumps(s["default"])) if "default" in s else ""
        lines.append(
            f"| `{field}` | {_schema_type(s)} | {'yes' if field in required else 'no'} | {default} "
            f"| {_cell(_bounds(s))} | {_cell(s.get('description', ''))} |"
        )
    return [*lines, ""]


# --- input files -----------------------------------------------------------------------

INPUT_MODELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Job spec: `rollmux submit`, `POST /v1/jobs`",
        "A job for the control plane. Without `kind` or `entrypoint` it is `external`: its owner runs it "
        "and takes its turns through the HTTP API.",
        ("rollmux.inputs.runfile:JobSubmission", "rollmux.inputs.runfile:GRPOFields"),
    ),
    (
        "Plan: `rollmux submit` of a `jobs:` list, `POST /v1/plans`",
        "Several job specs accepted in one transaction, all or none.",
        ("rollmux.inputs.runfile:Plan",),
    ),
    (
        "Run file: `rollmux run`",
        "The cluster and the jobs of one `rollmux run`. Every job is run by RollMux.",
        ("rollmux.inputs.runfile:RunFile", "rollmux.inputs.runfile:ClusterFields", "rollmux.inputs.runfile:RunJob"),
    ),
    (
        "Job file: `rollmux plan`",
        "A set of jobs placed in order, with an optional cost model.",
        ("rollmux.inputs.jobfile:JobFile", "rollmux.inputs.jobfile:PlanJob", "rollmux.inputs.jobfile:CostFields"),
    ),
    (
        "Job trace record: `rollmux simulate`, `rollmux replay` (`.jsonl` or `.csv`)",
        "One job per JSON line or CSV row, in arrival order.",
        ("rollmux.inputs.trace:JobRecord",),
    ),
    (
        "Profile: `--profile` of a production trace",
        "Profiled solo phase times per job type, in seconds.",
        ("rollmux.inputs.trace:Profile", "rollmux.inputs.trace:PhasePair"),
    ),
)


def _load(path: str) -> type:
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def input_models() -> list[type]:
    """Every pydantic model the inputs page documents."""
    return [_load(path) for _, _, paths in INPUT_MODELS for path in paths]


def inputs_markdown() -> str:
    """One table per model: every field with its type, default, bounds and description."""
    documented = {model.__name__ for model in input_models()}
    lines: list[str] = []
    for title, intro, paths in INPUT_MODELS:
        lines += [f"## {title}", "", intro, ""]
        for path in paths:
            lines += _model_table(_load(path), documented)
    return "\n".join(lines)


def _model_table(model: type, documented: set[str]) -> list[str]:
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    name = model.__name__
    lines = [f"### {name} {{#{name.lower()}}}", "", f"`{model.__module__}.{name}`", ""]
    doc = (model.__doc__ or "").strip()
    if doc and not doc.startswith(("Usage docs:", "!!! abstract")):  # pydantic's own BaseModel docstring
        lines += [_prose(doc), ""]
    parents = [b.__name__ for b in model.__bases__ if b.__name__ in documented]
    if parents:
        lines += ["Extends " + ", ".join(f"[{p}](#{p.lower()})" for p in parents) + ": every field is listed here.", ""]
    extra = model.model_config.get("extra")
    if extra == "forbid":
        lines += ["Unknown fields are refused.", ""]
    lines += ["| field | type | default | bounds | description |", "| --- | --- | --- | --- | --- |"]
    for field, info in model.model_fields.items():
        if info.default is not PydanticUndefined:
            default = _code(_value(info.default))
        elif info.default_factory is not None:
            made = info.default_factory()
            if isinstance(made, BaseModel):
                default = f"defaults of [{type(made).__name__}](#{type(made).__name__.lower()})"
            else:
                default = _code(_value(made))
        else:
            default = "required"
        lines.append(
            f"| `{field}` | {_annotation(info.annotation, documented)} | {default} "
            f"| {_constraints(info)} | {_cell(info.description or '')} |"
        )
    return [*lines, ""]


def _value(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return repr(value)
    return json.dumps(value) if isinstance(value, (dict, list, str, bool)) or value is None else str(value)


def _annotation(annotation: Any, documented: set[str]) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_annotation(a, documented) for a in args)
    if origin is typing.Literal:
        return " or ".join(f"`{json.dumps(a)}`" for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"list of {_annotation(args[0], documented)}" if args else "list"
    if origin is dict:
        return f"map of {_annotation(args[0], documented)} to {_annotation(args[1], documented)}"
    if annotation is type(None):
        return "`null`"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " or ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type):
        name = annotation.__name__
        plain = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "Any": "any"}
        if name in documented:
            return f"[{name}](#{name.lower()})"
        return plain.get(name, name)
    return _cell(str(annotation).replace("typing.", ""))


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else str(value)


def _constraints(info: Any) -> str:
    """The field's bounds as Markdown (a pattern as code, the rest as text)."""
    marks = {"ge": "≥", "gt": "&gt;", "le": "≤", "lt": "&lt;"}
    found = []
    for item in info.metadata:
        for key, sign in marks.items():
            if getattr(item, key, None) is not None:
                found.append(f"{sign} {_number(getattr(item, key))}")
        if getattr(item, "min_length", None) is not None:
            found.append(f"length ≥ {item.min_length}")
        if getattr(item, "max_length", None) is not None:
            found.append(f"length ≤ {item.max_length}")
        if getattr(item, "pattern", None) is not None:
            found.append(f"matches {_code(item.pattern)}")
    return ", ".join(found)


# --- failpoints ------------------------------------------------------------------------


def failpoints() -> list[dict[str, Any]]:
    """Every ``failpoint(NAME)`` call under ``rollmux/``: name, file, line, function."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        found += _Finder(path.relative_to(ROOT).as_posix()).visit_all(tree)
    return found


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str):
        self.path = path
        self.scope: list[ast.AST] = []
        self.found: list[dict[str, Any]] = []

    def visit_all(self, tree: ast.AST) -> list[dict[str, Any]]:
        self.visit(tree)
        return self.found

    def _scoped(self, node: ast.AST) -> None:
        self.scope.append(node)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if called == "failpoint" and node.args:
            name = _literal(node.args[0])
            if name is not None:
                function = next((s for s in reversed(self.scope) if not isinstance(s, ast.ClassDef)), None)
                self.found.append(
                    {
                        "name": name,
                        "path": self.path,
                        "line": node.lineno,
                        "where": ".".join(s.name for s in self.scope),  # type: ignore[attr-defined]
                        "doc": _first_sentence(ast.get_docstring(function) or "") if function else "",
                    }
                )
        self.generic_visit(node)


def _literal(node: ast.AST) -> str | None:
    """The failpoint's name: a string, or an f-string shown with its placeholders."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    return None


def _first_sentence(text: str) -> str:
    """A docstring's first sentence, its reST roles and double backticks made plain."""
    text = " ".join(text.split())
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    match = re.match(r"(.+?\.)(\s|$)", text)
    sentence = match.group(1) if match else text
    return sentence if len(sentence) <= 240 else sentence[:237].rsplit(" ", 1)[0] + " …"


def _tests_using(name: str) -> list[str]:
    """The test modules that name a failpoint (a placeholder matches anything after it)."""
    literal = re.escape(name.split("{")[0])
    rest = "[^\"']*" if "{" in name else ""
    pattern = re.compile("[\"']" + literal + rest + "[\"']")
    return sorted(p.name for p in (ROOT / "tests").glob("*.py") if pattern.search(p.read_text()))


def failpoints_markdown() -> str:
    """The variables that arm failpoints (from the module that defines ``failpoint``), then every failpoint."""
    lines: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name == "failpoint" for n in tree.body):
            module = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
            lines += [f"Defined in `{module}`:", "", _prose(ast.get_docstring(tree) or ""), ""]
            variables = [
                (t.id, n.value.value)
                for n in tree.body
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                for t in n.targets
                if isinstance(t, ast.Name) and t.id.endswith("VARIABLE")
            ]
            if variables:
                lines += ["| environment variable | constant |", "| --- | --- |"]
                lines += [f"| `{value}` | `{name}` |" for name, value in variables]
                lines.append("")
    lines += [
        "## Every failpoint",
        "",
        "| name | where | in | what that code does | tests that arm it |",
        "| --- | --- | --- | --- | --- |",
    ]
    for point in failpoints():
        tests = ", ".join(f"`{t}`" for t in _tests_using(point["name"])) or "—"
        lines.append(
            f"| `{point['name']}` | `{point['path']}:{point['line']}` | `{point['where']}` "
            f"| {_cell(point['doc'])} | {tests} |"
        )
    return "\n".join(lines) + "\n"


# --- the layers as imported --------------------------------------------------------------

LAYERS = {
    "core": 0,
    "inputs": 1,
    "wire": 2,
    "sim": 2,
    "report": 2,
    "dataplane": 3,
    "sdk": 3,
    "service": 4,
    "jobs": 4,
    "live": 5,
    "cli": 6,
}
"""The intended layering (architecture.md): a package may import only packages of a lower layer."""


def package_imports() -> dict[tuple[str, str], dict[str, bool]]:
    """``(importer, imported)`` package pairs under ``rollmux/``, each with the modules that
    import and whether every such import is inside a function (lazy)."""
    edges: dict[tuple[str, str], dict[str, bool]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) < 2:
            continue
        importer, module = parts[0], path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                bits = name.split(".")
                if len(bits) < 2 or bits[0] != "rollmux" or bits[1] == importer:
                    continue
                lazy = id(node) not in top and not _under_type_checking(tree, node)
                seen = edges.setdefault((importer, bits[1]), {})
                seen[module] = seen.get(module, True) and lazy
    return edges


def _under_type_checking(tree: ast.Module, node: ast.AST) -> bool:
    """An import in a module-level ``if TYPE_CHECKING:`` block counts as a module-level one."""
    for statement in tree.body:
        if isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.unparse(statement.test):
            if any(child is node for child in ast.walk(statement)):
                return True
    return False


def layers_markdown() -> str:
    """The package import graph as Mermaid, and the imports against the intended layering."""
    edges = package_imports()
    packages = sorted({p for pair in edges for p in pair}, key=lambda p: (LAYERS.get(p, 99), p))
    lines = ["```mermaid", "flowchart TB"]
    lines += [f'    {p}["rollmux.{p}"]' for p in packages]
    for (importer, imported), modules in sorted(edges.items()):
        arrow = "-.->" if all(modules.values()) else "-->"
        lines.append(f"    {importer} {arrow} {imported}")
    lines += ["```", ""]
    against = [
        (a, b, m) for (a, b), m in sorted(edges.items()) if a not in LAYERS or b not in LAYERS or LAYERS[b] >= LAYERS[a]
    ]
    if not against:
        return "\n".join([*lines, "Every import follows the intended layering.", ""])
    lines += [
        "Imports that do not point to a lower layer of the intended layering (or involve a package",
        "it does not place):",
        "",
        "| importer | imports | in | only inside functions |",
        "| --- | --- | --- | --- |",
    ]
    for a, b, modules in against:
        where = ", ".join(f"`{m}`" for m in sorted(modules))
        lazy = "yes" if all(modules.values()) else "no"
        lines.append(f"| `rollmux.{a}` | `rollmux.{b}` | {where} | {lazy} |")
    return "\n".join(lines) + "\n"


# --- MkDocs hook functions -----------------------------------------------------------------

GENERATORS = {
    "cli": cli_markdown,
    "http-api": http_api_markdown,
    "inputs": inputs_markdown,
    "failpoints": failpoints_markdown,
    "metrics": metrics_markdown,
    "layers": layers_markdown,
}


def on_files(files, config, **_):
    """Publish the OpenAPI document beside the HTTP API page."""
    from mkdocs.structure.files import File

    content = json.dumps(openapi_schema(), indent=2)
    files.append(File.generated(config, "reference/openapi.json", content=content))
    return files


def on_page_markdown(markdown: str, page, **_):
    """Put the generated text where a page has a ``<!-- generated: NAME -->`` marker."""

    def generated(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: no generator named {name!r} (known: {', '.join(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(generated, markdown)
