"""No import cycle among the modules of the `mqstore` package.

Every module of `mqstore` (the top-level `mqstore/` files and the subpackages `engine`,
`ipc`, `workers`, `pipeline`, `conf`, installed as `mqstore.<name>`) is parsed with
`ast`, without importing anything, and each import becomes an edge to the module it
names. Counted: imports at module level, in classes and under `if TYPE_CHECKING:` (a
typing-only tie is still a tie between the two modules); not counted: imports inside
functions, which run on a call, after every module is loaded. `from mqstore import
_native` is an edge to the C extension (a leaf with no imports of ours), not to the
package `mqstore`; `from a.b import c` is an edge to `a.b.c` when that is a module,
else to `a.b`. Importing `a.b.c` also runs `a/b/__init__.py`, but those files import
nothing of their children, so that tie is left out.

`find_cycle` is the check; it is tested on small graphs of its own so that a cycle in
the package would be caught.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "mqstore"
SUBPACKAGES = ("engine", "ipc", "workers", "pipeline", "conf")


def package_modules() -> dict[str, Path]:
    """Module name -> source file, for every module of the package."""
    mods = {f"{PACKAGE}.{p.stem}": p for p in (REPO / PACKAGE).glob("*.py")}
    for sub in SUBPACKAGES:
        for path in (REPO / sub).rglob("*.py"):
            parts = (PACKAGE, *path.relative_to(REPO).with_suffix("").parts)
            mods[".".join(parts)] = path
    return {name.removesuffix(".__init__"): path for name, path in mods.items()}


def extension_modules() -> set[str]:
    """The package's C extensions (`mqstore/_native*.so`): leaves of the graph."""
    return {f"{PACKAGE}.{p.name.split('.')[0]}" for p in (REPO / PACKAGE).glob("*.so")}


def _top_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is loaded: at module level, in classes, in
    `if` (TYPE_CHECKING included), `try` and `with` blocks; not inside functions."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If | ast.For | ast.While):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body)
            for handler in node.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(node.orelse)
            yield from _top_level(node.finalbody)
        elif isinstance(node, ast.With | ast.ClassDef):
            yield from _top_level(node.body)


def imports_of(name: str, path: Path, modules: Set[str]) -> set[str]:
    """The modules of `modules` that module `name` (at `path`) imports when loaded."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _top_level(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            # `from a.b import c`: the submodule a.b.c when there is one, else a.b itself
            targets = [
                f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin
                for alias in node.names
            ]
        out.update(t for t in targets if t in modules and t != name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = package_modules()
    known = mods.keys() | extension_modules()
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def find_cycle(graph: Mapping[str, Set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None when there is none. An iterative
    depth-first search (no recursion limit): a cycle is an edge back to a node on the
    current path."""
    done: set[str] = set()
    for root in sorted(graph):
        if root in done:
            continue
        path: list[str] = [root]
        on_path = {root}
        stack = [iter(sorted(graph.get(root, ())))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


# --- the finder itself --------------------------------------------------------------------


def test_find_cycle_names_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"d", "a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"z"}, "z": {"y"}}) == ["y", "z", "y"]
    assert find_cycle({"s": {"s"}}) == ["s", "s"]


def test_find_cycle_passes_a_tree_and_a_diamond() -> None:
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None
    assert find_cycle({"a": {"outside"}}) is None
    assert find_cycle({}) is None


def test_imports_of_reads_every_form(tmp_path: Path) -> None:
    """Absolute and relative imports, `from pkg import module`, TYPE_CHECKING blocks;
    `from mqstore import _native` is a tie to the extension, not to `mqstore`; imports
    inside functions are not edges."""
    src = tmp_path / "mod.py"
    src.write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import mqstore.engine.record\n"
        "from mqstore import _native\n"
        "from mqstore.ipc import control as c\n"
        "from . import reads\n"
        "from .session import Session\n"
        "if TYPE_CHECKING:\n"
        "    from mqstore.ipc.aio import AsyncStoreClient\n"
        "def later() -> None:\n"
        "    from mqstore.workers import supervisor\n"
    )
    modules = {
        "mqstore",
        "mqstore._native",
        "mqstore.engine.record",
        "mqstore.ipc",
        "mqstore.ipc.control",
        "mqstore.ipc.reads",
        "mqstore.ipc.session",
        "mqstore.ipc.aio",
        "mqstore.ipc.client",
        "mqstore.workers.supervisor",
    }
    assert imports_of("mqstore.ipc.client", src, modules) == {
        "mqstore._native",
        "mqstore.engine.record",
        "mqstore.ipc.control",
        "mqstore.ipc.reads",
        "mqstore.ipc.session",
        "mqstore.ipc.aio",
    }


def test_a_cycle_in_sources_is_found(tmp_path: Path) -> None:
    """From files to the verdict: two modules that import each other (one of them only
    for typing) make a cycle."""
    (tmp_path / "a.py").write_text("from mqstore.ipc.b import B\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mqstore.ipc import a\n"
    )
    modules = {"mqstore.ipc.a": tmp_path / "a.py", "mqstore.ipc.b": tmp_path / "b.py"}
    graph = {n: imports_of(n, p, modules.keys()) for n, p in modules.items()}
    assert find_cycle(graph) == ["mqstore.ipc.a", "mqstore.ipc.b", "mqstore.ipc.a"]


# --- the package --------------------------------------------------------------------------


def test_the_package_is_found() -> None:
    mods = package_modules()
    for name in ("mqstore", "mqstore.ipc.client", "mqstore.engine.record", "mqstore.conf"):
        assert name in mods
    assert "mqstore._native" not in mods and "mqstore._native" in extension_modules()
    graph = import_graph()
    assert "mqstore._native" in graph["mqstore.ipc.session"]
    assert "mqstore" not in graph["mqstore.ipc.session"]
    assert "mqstore.ipc.session" in graph["mqstore.ipc.reads"]


def test_no_import_cycle_in_the_package() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
