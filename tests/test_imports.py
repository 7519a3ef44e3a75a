"""The import graph of kvplan/ and kernels/: no cycles, and every import points down the layers in LAYERS.

Every import is read from the source (ast), wherever it stands: at module level, inside a function, under
`if TYPE_CHECKING:`, in the forms `import kvplan.x`, `from kvplan.x import y`, `from .x import y`, `from . import x`,
`from kvplan.kernels.x import y`, and importlib.import_module() of a constant name or of f"{__package__}.x".
Nodes are module names: kvplan's without the package prefix (`specs.catalog`, `deployment`), the kernels as
`kernels.bench`
(installed they are kvplan.kernels; a checkout keeps them beside the package), the package itself as `kvplan`.

kvplan/__init__.py is the package's facade: it imports nothing when loaded, and its `_EXPORTS` table names the module
each public name is imported from on first use (importlib, by string). It sits alone at the top of LAYERS, and its
table is not read as edges of its own: those would all point down from the top. A module that imports a name through
the facade (`from kvplan import crossover`) gets the edge to the module that defines it, through the table; a name the
facade defines itself (`from . import __version__`) and a module's own enclosing packages are no edges, since Python
loads a package before any module inside it.

KNOWN_CYCLE_EDGES lists the imports that today close cycles; the rest of the graph is acyclic and ordered by LAYERS.
The list may only shrink: an entry whose import is gone, or that no longer closes a cycle, fails until it is deleted.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"kvplan": ROOT / "kvplan", "kernels": ROOT / "kernels"}
FACADE = "kvplan"

# The imports that close the cycles of today's code, each (importer, imported): with exactly these left out the graph
# is acyclic, and each of them closes a cycle again on its own (the fewest edges that break every cycle, chosen among
# the equally small sets as the ones pointing up LAYERS). Each is a function-local import. Cutting one (moving what it
# imports down, or its user up) means deleting it here.
KNOWN_CYCLE_EDGES: set = set()  # none left: kvplan/ and kernels/ import in one direction

# Bottom to top: a module may import from its own group and the groups below it, never from one above. Each folder of
# kvplan/ is one group, so "may I import this?" is answered by the folder order alone; a module added to a folder
# takes its place. The modules at the top of kvplan/ are named one by one.
def _folder(name: str) -> set:
    """Every module of kvplan/<name>/ (of kernels/ for 'kernels'), the folder's package included where it has an
    __init__.py (kernels/ has none: a namespace package, so that it never shadows another package named kernels)."""
    base = ROOT / "kernels" if name == "kernels" else ROOT / "kvplan" / name
    package = {name} if (base / "__init__.py").exists() else set()
    return package | {f"{name}.{p.stem}" for p in base.glob("*.py") if p.stem != "__init__"}


LAYERS = [
    ("base", {"errors", "xp", "files", "memo", "search", "units", "values"}),  # imports nothing else of kvplan
    ("specs", _folder("specs")),  # the inputs: specs and catalogs, KV formats, config.json and the Hub, profiles
    ("rules", _folder("rules")),  # what each engine release does
    ("sizing", _folder("sizing")),  # what a model costs one rank: tensors, caches, memory, step time
    ("kernels", _folder("kernels")),  # the GPU kernels and their timing harness (installed as kvplan.kernels)
    ("deployment", _folder("deployment")),  # one deployment's options resolved
    ("plan", _folder("plan")),  # the questions: capacity, crossover, throughput and its simulation, sweep
    ("api", {"api"}),  # the library's keyword functions, each building the deployment value
    ("measure", _folder("measure")),  # measuring this GPU
    ("quality", _folder("quality")),  # what a KV format costs in accuracy: a model run, synthetic K/V
    ("app", _folder("app")),  # the command line, tables, plots, gates, startup-log import
    ("main", {"__main__", "cli"}),  # `python -m kvplan` and the earlier name of the command line
    ("facade", {FACADE}),
]


def _modules() -> dict:
    """Node name -> source path, for every module of kvplan/ and kernels/ (subpackages included)."""
    found = {}
    for pkg, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(((pkg,) if pkg == "kernels" or not parts else ()) + parts)] = path
    return found


MODULES = _modules()


def _node(dotted: str) -> Optional[str]:
    """The module an absolute dotted name lands on (the longest prefix that is one), or None outside kvplan."""
    parts = dotted.split(".")
    if parts[0] == "kvplan":
        parts = parts[1:] or ["kvplan"]
    elif parts[0] != "kernels":
        return None
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in MODULES:
            return ".".join(parts[:n])
    return None


def _package(name: str) -> str:
    """The absolute dotted package a module's relative imports start from."""
    path = MODULES[name]
    dotted = name if name in ("kvplan", "kernels") or name.startswith("kernels.") else f"kvplan.{name}"
    return dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]


def _ancestors(name: str) -> set:
    """The packages Python loads before this module: never edges."""
    return {FACADE} | ({"kernels"} if name.startswith("kernels") else set()) | {
        name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)}


def _facade_exports() -> dict:
    tree = ast.parse(MODULES[FACADE].read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("kvplan/__init__.py has no _EXPORTS table: update test_imports.py's facade handling")


EXPORTS = _facade_exports()


def _targets(name: str, node: ast.AST) -> list:
    """The absolute dotted names one statement (or importlib call) imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = _package(name).split(".")
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
        if _node(base) == FACADE:  # through the facade: a submodule, a name of _EXPORTS, or the facade's own
            return [f"kvplan.{EXPORTS.get(a.name, a.name)}" for a in node.names]
        return [f"{base}.{a.name}" for a in node.names]  # a submodule where there is one, else `base` itself
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module":
        arg = node.args[0] if node.args else None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and not arg.value.startswith("."):
            return [arg.value]
        if isinstance(arg, ast.JoinedStr) and len(arg.values) == 2:
            head, tail = arg.values
            if getattr(head, "value", None) and getattr(head.value, "id", None) == "__package__" \
                    and isinstance(tail, ast.Constant) and tail.value.startswith("."):
                return [_package(name) + tail.value]
    return []  # not an import, or one by a computed name (the facade's own lookup)


def import_graph() -> dict:
    """(importer, imported) -> the sorted "path:line" places the import stands."""
    edges = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for dotted in _targets(name, node):
                target = _node(dotted)
                if target is not None and target != name and target not in _ancestors(name):
                    edges.setdefault((name, target), set()).add(f"{path.relative_to(ROOT)}:{node.lineno}")
    return {edge: sorted(places, key=lambda p: (p.split(":")[0], int(p.split(":")[1])))
            for edge, places in edges.items()}


def strongly_connected(nodes, edges) -> list:
    """Tarjan's strongly connected components of more than one module, each sorted."""
    succ = {n: sorted(b for a, b in edges if a == n) for n in nodes}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            on_stack.difference_update(component)
            if len(component) > 1:
                found.append(sorted(component))

    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return found


def _reaches(edges, start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        n = todo.pop()
        if n == goal:
            return True
        if n not in seen:
            seen.add(n)
            todo += [b for a, b in edges if a == n]
    return False


def _where(edges: dict, pairs) -> str:
    return "\n".join(f"  {a} -> {b}: {', '.join(edges[(a, b)])}" for a, b in sorted(pairs))


GRAPH = import_graph()
ORDERED = {edge: places for edge, places in GRAPH.items() if edge not in KNOWN_CYCLE_EDGES}


def test_no_import_cycles():
    """Without the allow-listed edges the graph is acyclic: a new cycle names its modules and the imports closing it."""
    problems = []
    for component in strongly_connected(MODULES, ORDERED):
        inside = [e for e in ORDERED if e[0] in component and e[1] in component]
        problems.append(f"cycle among {', '.join(component)}:\n{_where(GRAPH, inside)}")
    assert not problems, "import cycles (move the imported code down, or the importing code up):\n" + \
        "\n".join(problems)


def test_known_cycle_edges_still_exist_and_close_a_cycle():
    """The allow-list only shrinks: an entry whose import is gone, or that closes no cycle any more, is deleted."""
    gone = sorted(e for e in KNOWN_CYCLE_EDGES if e not in GRAPH)
    assert not gone, f"delete {gone} from KNOWN_CYCLE_EDGES in tests/test_imports.py: the import is gone"
    idle = sorted((a, b) for a, b in KNOWN_CYCLE_EDGES if not _reaches(ORDERED, b, a))
    assert not idle, f"delete {idle} from KNOWN_CYCLE_EDGES in tests/test_imports.py: it closes no cycle any more " \
                     f"(the layer order now checks it):\n{_where(GRAPH, idle)}"


def _rank() -> dict:
    return {m: i for i, (_, group) in enumerate(LAYERS) for m in group}


def test_every_module_has_a_layer():
    rank = _rank()
    assert len(rank) == sum(len(group) for _, group in LAYERS), "a module stands in two groups of LAYERS"
    stale = sorted(set(rank) - set(MODULES))
    assert not stale, f"LAYERS names modules that do not exist: {stale}; delete them from tests/test_imports.py"
    problems = []
    for m in sorted(set(MODULES) - set(rank)):
        low = max((rank[b] for a, b in ORDERED if a == m and b in rank), default=0)
        high = min((rank[a] for a, b in ORDERED if b == m and a in rank), default=len(LAYERS) - 1)
        names = [LAYERS[i][0] for i in range(low, high + 1)] or ["none fits: it closes a cycle of layers"]
        problems.append(f"{m} ({MODULES[m].relative_to(ROOT)}): add it to one of the LAYERS groups {names}")
    assert not problems, "modules missing from LAYERS in tests/test_imports.py:\n" + "\n".join(problems)


def test_imports_point_down_the_layers():
    rank = _rank()
    up = [(a, b) for a, b in ORDERED if a in rank and b in rank and rank[a] < rank[b]]
    lines = [f"  {a} ({LAYERS[rank[a]][0]}) -> {b} ({LAYERS[rank[b]][0]}): {', '.join(GRAPH[(a, b)])}"
             for a, b in sorted(up)]
    assert not up, "imports from a lower group of LAYERS to a higher one (move the imported code down, or the " \
                   "importer up):\n" + "\n".join(lines)


def test_kernels_sit_above_the_base_and_below_their_users():
    """The kernels are one group; kvplan modules that import them stand above it."""
    rank = _rank()
    kernels = {m for m in MODULES if m == "kernels" or m.startswith("kernels.")}
    group = rank["kernels.common"]
    assert {rank.get(m) for m in kernels} == {group}, "the kernels/ modules form one group of LAYERS"
    assert group > rank["errors"]
    users = sorted(a for a, b in GRAPH if b in kernels and a not in kernels and rank.get(a, 0) <= group)
    assert not users, f"{users} import kernels: they belong in a group above 'kernels'"


def test_facade_exports_name_modules():
    """Each name of kvplan/__init__.py's _EXPORTS comes from a module of the graph (the table is read as text)."""
    missing = sorted({m for m in EXPORTS.values() if m not in MODULES})
    assert not missing, f"_EXPORTS in kvplan/__init__.py names modules that do not exist: {missing}"
    assert _rank()[FACADE] == len(LAYERS) - 1, "the facade is the top group of LAYERS"


def test_the_reader_sees_every_form():
    """Spot checks of the reader itself, one per import form, on today's code."""
    for edge, place in (
        (("plan.throughput", "plan.vllm_pool"), "kvplan/plan/throughput.py"),  # inside a function
        (("measure.run", "kernels.bench"), "kvplan/measure/run.py"),  # from kvplan.kernels.bench import
        (("kernels.layouts", "specs.kv_formats"), "kernels/layouts.py"),  # from kvplan.specs... import, at module level
        (("kernels.bench", "kernels.stream"), "kernels/bench.py"),  # from .stream import, in kernels/
        (("kernels.probe", "kernels.common"), "kernels/probe.py"),  # from . import common
        (("kernels.bench", "kernels.kivi_attention"), "kernels/bench.py"),  # import_module(f"{__package__}.x")
        (("__main__", "app.cli"), "kvplan/__main__.py"),
    ):
        # (the file, not the line: an edit above an import moves it)
        assert any(p.split(":")[0] == place for p in GRAPH.get(edge, ())), (edge, place, GRAPH.get(edge))
    assert ("app.cli", FACADE) not in GRAPH  # `from . import __version__`: the facade's own name
