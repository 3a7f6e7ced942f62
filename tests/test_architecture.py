"""The packages' boundaries hold: higher layers import lower ones only, no import cycle (imports inside functions
counted), and no private name is imported from another module."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hookcli"

#: Each layer may import its own and the layers before it.
LAYERS = [
    {
        "hookcli.errors",
        "hookcli.families",
        "hookcli.console",
        "hookcli.files",
        "hookcli.events",
        "hookcli.patterns",
        "hookcli.version",
        "hookcli.options",
    },
    {"hookcli.inputs"},
    {"hookcli.storage"},
    {"hookcli.models"},
    {"hookcli.pictures"},
    {"hookcli.run"},
    {"hookcli.api"},
    {"hookcli.cli", "hookcli.__main__", "hookcli"},
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int:
    for rank, members in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return rank
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")


def _imports(module: str):
    """``(imported module, names taken from it, line, inside a function)`` for each hookcli import of ``module``."""
    tree = ast.parse(MODULES[module].read_text())
    functions = {
        id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(f)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("hookcli"):
                    yield alias.name, [], node.lineno, id(node) in functions
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hookcli") and not node.level:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if target in MODULES:  # a module taken from its package
                    yield target, [], node.lineno, id(node) in functions
                else:
                    yield node.module, [alias.name], node.lineno, id(node) in functions


def _edges():
    return {
        module: {target for target, *_ in _imports(module) if target in MODULES and target != module}
        for module in MODULES
    }


def test_every_module_belongs_to_a_layer_and_imports_only_its_own_and_lower_layers():
    wrong = [
        f"{module} imports {target} (line {line})"
        for module in MODULES
        for target, _, line, _ in _imports(module)
        if target in MODULES and module != "hookcli" and _layer(target) > _layer(module)
    ]
    assert wrong == []


def test_no_import_cycle():
    edges, cycles = _edges(), []
    index, low, stack, on_stack, counter = {}, {}, [], set(), [0]

    def visit(module):
        index[module] = low[module] = counter[0]
        counter[0] += 1
        stack.append(module)
        on_stack.add(module)
        for target in edges[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in MODULES:
        if module not in index and module != "hookcli":  # the package's lazy public names are not a dependency
            visit(module)
    assert cycles == []


def test_no_private_name_is_imported_from_another_module():
    private = [
        f"{module}: {name} from {target}"
        for module in MODULES
        for target, names, _, _ in _imports(module)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert private == []


def test_no_module_is_over_600_lines():
    lengths = {module: len(path.read_text().splitlines()) for module, path in MODULES.items()}
    assert {module: length for module, length in lengths.items() if length > 600} == {}


def test_family_behaviour_is_read_from_the_families_table():
    """A model family's behaviour is a trait of hookcli.families, never a comparison with a family's name (a
    preprocessing's kind, named alike, is the preprocessing's own)."""
    names = "classification|detection|segmentation|video|optical_flow|quantized"
    compared = re.compile(rf"""family[\w.()]*\s*(==|!=|\bin)\s*\(?["']({names})["']""")
    found = [
        f"{module}:{number}: {line.strip()}"
        for module, path in MODULES.items()
        if module != "hookcli.families"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if compared.search(line)
    ]
    assert found == []
