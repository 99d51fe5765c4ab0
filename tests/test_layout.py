"""The layout's rule that no dependency runs both ways, checked on the code: no circle among
torchneuron's Python modules (imports at any depth, lazy ones included, since a lazy import still ties
the two modules together), nor among the C++ core's folders (csrc/aten, csrc/fused, csrc/runtime, ...)
by their quoted includes.

An edge goes from a module to the module it imports; ``from package import submodule`` is an edge to
the submodule, not to the package. KNOWN lists the circles not yet taken apart, each with its reason:
a new circle fails, and so does a listed one that is gone (take it off the list).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("torchneuron", "torch_neuronx")
EXTENSIONS = ("torchneuron._C", "torchneuron._gloo_exit")  # compiled modules (setup.py): leaves of the graph

KNOWN: dict[frozenset[str], str] = {}

KNOWN_CPP: dict[frozenset[str], str] = {}  # aten owns the held-work table fused eager plugs into (aten/held_work.h)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for top in PACKAGES for p in (ROOT / top).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in EXTENSIONS}
    known = set(files) | set(EXTENSIONS)
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # `from a import b`: the submodule a.b where it is one, else a itself
                targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in known:  # `import a.b.c` depends on a.b.c (or the nearest module)
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_of_every_form():
    graph = import_graph()
    assert "torchneuron.compile.inductor" in graph["torchneuron.compile.aoti"]          # from . import inductor
    assert "torchneuron.compile.aoti" in graph["torchneuron.compile.registration"]
    assert "torchneuron.projection.counting" in graph["torchneuron.projection.model"]   # from pkg import submodule
    assert "torchneuron.projection" not in graph["torchneuron.projection.model"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    # Python modules; lib*.so is a shared library (the runtime's), which no Python code imports.
    built = {"torchneuron." + p.name.split(".")[0] for p in (ROOT / "torchneuron").glob("*.so")
             if not p.name.startswith("lib")}
    assert built <= set(EXTENSIONS), f"compiled modules missing from EXTENSIONS: {sorted(built - set(EXTENSIONS))}"


def test_no_python_import_circle():
    found = set(circles(import_graph()))
    new = found - set(KNOWN)
    assert not new, "import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    gone = set(KNOWN) - found
    assert not gone, f"no longer circles, take them off KNOWN: {[sorted(c) for c in gone]}"


def include_graph() -> dict[str, set[str]]:
    """csrc's folders (and its top-level files, each a node of its own) and the folders they include from."""
    csrc = ROOT / "csrc"
    node = lambda p: p.relative_to(csrc).parts[0] if len(p.relative_to(csrc).parts) > 1 else p.stem  # noqa: E731
    graph: dict[str, set[str]] = {}
    for path in sorted(csrc.rglob("*")):
        if path.suffix not in (".h", ".cpp", ".inl"):
            continue
        edges = graph.setdefault(node(path), set())
        for line in path.read_text().splitlines():
            if line.startswith("#include \""):
                target = (path.parent / line.split('"')[1]).resolve()
                if target.is_relative_to(csrc) and target.exists() and node(target) != node(path):
                    edges.add(node(target))
    return graph


def test_the_include_graph_sees_relative_includes():
    graph = include_graph()
    assert {"aten", "runtime", "fused", "distributed", "profiler"} <= set(graph)
    assert "runtime" in graph["aten"] and "aten" in graph["module"]
    assert not graph["runtime"], "the runtime includes nothing of the layers above it"
    assert "fused" not in graph["aten"], "aten knows fused eager only through its held-work table (aten/held_work.h)"


def test_no_cpp_include_circle():
    found = set(circles(include_graph()))
    new = found - set(KNOWN_CPP)
    assert not new, "include circles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    gone = set(KNOWN_CPP) - found
    assert not gone, f"no longer circles, take them off KNOWN_CPP: {[sorted(c) for c in gone]}"
