"""One-way layers (docs/architecture.md): the imports between the package's folders, read from the source
with `ast` (function-level imports included): no cycle between subpackages, core imports nothing above it,
the runtime layer only core, the load library nothing of the probes, and no product module the lab."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "vllm_acceptance"


def allowed_imports() -> dict[str, set[str]]:
    """docs/architecture.md's table between its layers markers: {layer: the layers it may import}."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("<!-- layers:begin -->", 1)[1].split("<!-- layers:end -->", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in table.strip().splitlines()[2:]]
    return {layer.strip(): {x.strip() for x in may.split(",") if x.strip()} for layer, may in rows}


def _layer(module: str) -> str:
    """`vllm_acceptance.probes.load` -> `probes`; a top-level module (cli, plan, ...) is its own layer."""
    return module.split(".")[1]


def _imports(path: Path) -> set[str]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("vllm_acceptance.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "vllm_acceptance":
                found |= {f"vllm_acceptance.{a.name}" for a in node.names}
            elif target.startswith("vllm_acceptance."):
                found.add(target)
    return {t for t in found if (PACKAGE / t.split(".")[1]).exists() or (PACKAGE / f"{t.split('.')[1]}.py").exists()}


@functools.cache
def _edges() -> dict[str, dict[str, set[str]]]:
    """{layer: {imported layer: {file, ...}}} across layers (read once; the tests only read it)."""
    edges: dict[str, dict[str, set[str]]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        source = rel.parts[0].removesuffix(".py")
        for target in _imports(path):
            layer = _layer(target)
            if layer != source:
                edges.setdefault(source, {}).setdefault(layer, set()).add(str(rel))
    return edges


def test_the_import_walk_sees_real_edges() -> None:
    edges = _edges()
    assert "probes/load/run.py" in edges["probes"]["load"] and "serve/stage.py" in edges["serve"]["runtime"]


def test_no_import_cycle_between_subpackages() -> None:
    edges = _edges()
    cycles = [(a, b, sorted(edges[a][b]), sorted(edges[b][a])) for a in edges for b in edges[a]
              if a < b and a in edges.get(b, {})]
    assert not cycles, cycles


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    file = PACKAGE.parent.joinpath(*name.split("."))
    return file.with_suffix(".py").is_file() or (file / "__init__.py").is_file()


def _module_imports(path: Path) -> set[str]:
    """The package's modules that `path` imports, function-level and `from . import x` included."""
    parts = _module_of(path).split(".")
    package = parts if path.name == "__init__.py" else parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            found |= {f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names}
    return {name for name in found if name.startswith("vllm_acceptance.") and _is_module(name)}


def test_no_import_cycle_between_modules() -> None:
    """Not even inside one folder: the modules form a tree of imports (Tarjan's strongly connected components)."""
    graph = {_module_of(path): _module_imports(path) - {_module_of(path)} for path in PACKAGE.rglob("*.py")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert "vllm_acceptance.rules.catalog" in graph["vllm_acceptance.rules"]     # the walk sees `from . import x`
    assert not cycles, cycles


def test_core_imports_nothing_above_it_and_runtime_only_core() -> None:
    edges = _edges()
    assert not edges.get("core"), edges.get("core")
    assert set(edges.get("runtime", {})) <= {"core"}, edges.get("runtime")


def test_the_load_library_never_imports_the_probes() -> None:
    assert "probes" not in _edges().get("load", {})


def test_every_layer_imports_only_what_docs_architecture_md_allows() -> None:
    allowed = allowed_imports()
    layers = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
              if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
    assert layers - set(allowed) == set(), "a folder missing from the table in docs/architecture.md"
    outside = {layer: {t: sorted(files) for t, files in targets.items() if t not in allowed[layer]}
               for layer, targets in _edges().items()}
    assert not {k: v for k, v in outside.items() if v}, outside


def test_no_product_module_imports_the_lab() -> None:
    importers = {layer: files["lab"] for layer, files in _edges().items() if "lab" in files}
    assert not importers, importers


# A hand-made path into a run directory: anything joined onto `run_dir` (`run_dir / EVENTS_FILE`), or any path
# joined onto one of the names core/rundir.py's layout owns (`base / "report.json"`, `path / "stages"`).
RUN_DIR_JOINS = re.compile(r"\brun_dir\)? / |/ f?[\"'](report\.(json|html|md)|run\.json|signoff\.json|"
                           r"findings|stages|evidence|monitoring)[\"'/]")


def _run_dir_joins(root: Path, skip: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(REPO)}:{n}" for path in sorted(root.rglob("*.py"))
            if path.relative_to(root).parts[0] not in skip and path.name not in ("rundir.py", "evidence.py")
            for n, line in enumerate(path.read_text().splitlines(), 1) if RUN_DIR_JOINS.search(line)]


def test_the_run_directory_pattern_sees_hand_joins() -> None:
    for line in ('run_dir / "report.json"', 'Path(run_dir) / "x"', 'self.run_dir / EVENTS_FILE',
                 'base_dir / "report.json"', 'args.run / "stages"',
                 'run.path / "report.html"', 'target / "monitoring" / name'):
        assert RUN_DIR_JOINS.search(line), line
    for line in ('run.report_json', 'build_dir / "lineage.json"', 'project / "accept.yml"', 'base / f"{name}.json"'):
        assert not RUN_DIR_JOINS.search(line), line


def test_run_directory_paths_come_from_rundir() -> None:
    """RunDir (core/rundir.py) is the only way to a run directory's files: no product module or collection
    plugin joins `run_dir / "..."`, or a path onto report.json, run.json, findings/, stages/, evidence/ or
    monitoring/, by hand (the lab, support that writes its own scratch files, aside)."""
    found = _run_dir_joins(PACKAGE, ("lab",)) + _run_dir_joins(REPO / "plugins", ())
    assert not found, found
