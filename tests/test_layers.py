"""docs/DESIGN.md's layer map, checked against the code's imports.

The map is the code block under "## Layers": bottom to top, one layer a line
that starts in the first column, naming its modules (``okq/model.py``), packages
(``okq/store/``, every module below) or patterns (``okq/ops*.py``), separated by
commas; indented lines describe. Modules of one layer may import each other; no
module imports one of a higher layer, at run time or for type checking alone;
every module of okq/ and compactor/ is on the map, and every name on the map
matches a module. A new layer is one more line in the doc.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "DESIGN.md"
PACKAGES = ("okq", "compactor")
#: A layer's names at the start of its line: paths and patterns, separated by commas.
NAMES = re.compile(r"[\w./*?\[\]-]+(?:, *[\w./*?\[\]-]+)*")


@dataclass(frozen=True)
class Layer:
    index: int  # 0 is the bottom
    names: tuple[str, ...]  # as the doc writes them: okq/model.py, okq/store/, okq/ops*.py

    def owns(self, path: str) -> int:
        """How closely this layer names ``path`` (a file under the root, with
        slashes): 0 not at all, more for a closer name (the closest layer wins)."""
        best = 0
        for name in self.names:
            if name.endswith("/") and path.startswith(name):
                best = max(best, len(name))
            elif path == name:
                best = max(best, 10_000)  # a module named outright beats its folder
            elif any(c in name for c in "*?[") and fnmatch.fnmatchcase(path, name):
                best = max(best, len(name))
        return best


@dataclass(frozen=True)
class Upward:
    importer: str  # a file under the root
    line: int
    imported: str  # the module name it imports
    low: Layer
    high: Layer

    def __str__(self) -> str:
        return (f"{self.importer}:{self.line} imports {self.imported}: layer "
                f"{self.low.index} ({', '.join(self.low.names)}) is below layer "
                f"{self.high.index} ({', '.join(self.high.names)}) in docs/DESIGN.md")


def read_layers(text: str) -> list[Layer]:
    """The layers of the first code block after the "## Layers" heading, bottom first."""
    section = text.split("\n## Layers\n", 1)[1]
    block = section.split("```", 2)[1].split("\n", 1)[1]
    layers: list[Layer] = []
    for line in block.splitlines():
        if not line or line[0].isspace():
            continue  # a description
        head = NAMES.match(line)
        assert head is not None, f"docs/DESIGN.md's map: no module named in {line!r}"
        names = tuple(n.strip() for n in head.group(0).split(","))
        layers.append(Layer(len(layers), names))
    return layers


def layer_of(path: str, layers: list[Layer]) -> Layer | None:
    scored = [(layer.owns(path), layer) for layer in layers]
    score, layer = max(scored, key=lambda s: s[0])
    return layer if score else None


def module_files(root: Path = ROOT) -> dict[str, str]:
    """Every module of the packages: dotted name -> file under the root."""
    found = {}
    for package in PACKAGES:
        for file in sorted((root / package).rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            parts = rel[:-3].split("/")
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = rel
    return found


def imports_of(source: str, module: str, is_package: bool,
               known: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every import of a module of ours in ``source``: at the top,
    in a function, or under ``if TYPE_CHECKING``. ``from a import b`` names ``a.b``
    when that is a module, else ``a``."""
    out: list[tuple[int, str]] = []
    for node in _statements(ast.parse(source).body):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((node.lineno, full if full in known else base))
    return [(line, name) for line, name in out if name.split(".")[0] in PACKAGES]


def _statements(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every statement, nested ones too (an import is one; expressions hold none)."""
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        yield node
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            todo.extend(getattr(node, name, ()))


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not is_package:
        parts.pop()
    parts = parts[:len(parts) - node.level + 1]
    return ".".join([*parts, *([node.module] if node.module else [])])


def upward_imports(layers: list[Layer], root: Path = ROOT) -> list[Upward]:
    files = module_files(root)
    placed = {path: layer_of(path, layers) for path in files.values()}
    found = []
    for module, path in files.items():
        low = placed[path]
        if low is None:
            continue  # test_every_module_is_on_the_map names it
        source = (root / path).read_text()
        for line, imported in imports_of(source, module, path.endswith("__init__.py"),
                                         set(files)):
            high = placed[files[imported]] if imported in files else None
            if high is not None and high.index > low.index:
                found.append(Upward(path, line, imported, low, high))
    return found


def test_every_module_is_on_the_map() -> None:
    layers = read_layers(DESIGN.read_text())
    missing = [path for path in module_files().values() if layer_of(path, layers) is None]
    assert not missing, "modules on no layer of docs/DESIGN.md's map: " + ", ".join(missing)


def test_every_name_on_the_map_is_a_module() -> None:
    layers = read_layers(DESIGN.read_text())
    paths = list(module_files().values())
    stale = [name for layer in layers for name in layer.names
             if not any(Layer(0, (name,)).owns(path) for path in paths)]
    assert not stale, "docs/DESIGN.md's map names what is not there: " + ", ".join(stale)


def test_nothing_imports_upward() -> None:
    found = upward_imports(read_layers(DESIGN.read_text()))
    assert not found, "imports upward:\n" + "\n".join(map(str, found))


def test_an_upward_import_is_named(tmp_path: Path) -> None:
    """The check itself: a module that imports one of a higher layer (inside a
    function, and under TYPE_CHECKING) is reported with its line; one of the
    same layer or below is not."""
    (tmp_path / "okq" / "store").mkdir(parents=True)
    (tmp_path / "compactor").mkdir()
    for name, text in {
        "okq/__init__.py": "",
        "okq/store/__init__.py": "from okq.store.base import Store\n",
        "okq/store/base.py": "from typing import TYPE_CHECKING\n"
                             "if TYPE_CHECKING:\n    from okq import model\n",
        "okq/model.py": "from . import cell\nfrom okq.store import Store\n",
        "okq/cell.py": "def f():\n    import compactor.core\n",
        "compactor/__init__.py": "",
        "compactor/core.py": "from okq.model import x\n",
    }.items():
        (tmp_path / name).write_text(text)
    layers = read_layers("\n## Layers\n\n```\nokq/store/ the store\nokq/model.py, okq/cell.py"
                         "\n            described\nokq/__init__.py, compactor/\n```\n")
    found = sorted((u.importer, u.line, u.imported) for u in upward_imports(layers, tmp_path))
    assert found == [("okq/cell.py", 2, "compactor.core"), ("okq/store/base.py", 3, "okq.model")]


def names_used_of(source: str, module: str) -> list[tuple[int, str]]:
    """(line, name) of every name ``source`` takes from ``module``: imported from
    it, or read as an attribute of the name it is imported as."""
    tree = ast.parse(source)
    package, _, leaf = module.rpartition(".")
    aliases, used = set(), []
    for node in _statements(tree.body):
        if isinstance(node, ast.ImportFrom) and node.module == module:
            used += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == package:
            aliases |= {a.asname or a.name for a in node.names if a.name == leaf}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == module and a.asname}
    for node in ast.walk(tree) if aliases else ():
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases:
            used.append((node.lineno, node.attr))
    return used


def test_the_hot_path_is_reached_through_its_interface() -> None:
    """okq/leases.py is the unit a compiled build replaces: every other module uses
    only the names of its ``__all__``, and it imports nothing above its layer."""
    import okq.leases

    interface = set(okq.leases.__all__)
    outside = [f"{path}:{line} uses okq.leases.{name}, not in its __all__"
               for module, path in module_files().items() if module != "okq.leases"
               for line, name in names_used_of((ROOT / path).read_text(), "okq.leases")
               if name not in interface]
    assert not outside, "\n".join(outside)
    assert set(dir(okq.leases)) >= interface


def test_names_used_of_a_module_are_found() -> None:
    source = ("from okq import leases as tr\nfrom okq.leases import LEASED, _hidden\n"
              "def f(o):\n    return tr.lease(o) or tr._private\n")
    assert sorted(names_used_of(source, "okq.leases")) == [
        (2, "LEASED"), (2, "_hidden"), (4, "_private"), (4, "lease")]
