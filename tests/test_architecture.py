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
        "hookcli.parsing",
    },
    {"hookcli.inputs"},
    {"hookcli.storage"},
    {"hookcli.models"},
    {"hookcli.pictures"},
    {"hookcli.statistics"},
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


#: Why a command (hookcli.run.commands) imports what it runs inside its methods.
_ENGINE = "a command's forward, writer and pictures load (torch) once its request is checked without them"

#: The only imports made inside functions, each with its reason: (module, imported module) → why.
LAZY_IMPORTS = {
    **{
        ("hookcli.run.commands." + command, module): _ENGINE
        for command, module in (
            ("base", "hookcli.run.forwards"),
            ("base", "hookcli.storage.writers"),
            ("grad", "hookcli.models.loading"),
            ("grad", "hookcli.run.gradients"),
            ("cam", "hookcli.pictures.cams"),
            ("cam", "hookcli.pictures.render"),
            ("cam", "hookcli.run.batches"),
            ("cam", "hookcli.run.gradients"),
            ("cam", "hookcli.statistics.units"),
            ("cam", "hookcli.storage.writers"),
            ("stats", "hookcli.statistics.channel_stats"),
            ("stats", "hookcli.statistics.layer"),
            ("stats", "hookcli.statistics.units"),
            ("stats", "hookcli.storage.gathering_writer"),
            ("ablate", "hookcli.storage.gathering_writer"),
            ("patch", "hookcli.storage.gathering_writer"),
            ("ablate", "hookcli.run.ablation"),
            ("ablate", "hookcli.run.edits"),
            ("ablate", "hookcli.statistics.ablation"),
            ("patch", "hookcli.run.patching"),
            ("patch", "hookcli.statistics.patching"),
        )
    },
    ("hookcli.api", "hookcli.run.request"): "models and layers answer without the run's checks (about 25 ms)",
    ("hookcli.api", "hookcli.run.execute"): "the run engine (torch) loads once the request is checked",
    ("hookcli.api", "hookcli.run.plan"): "a plan loads the model (torch) once the request is checked",
    ("hookcli.api", "hookcli.run.layer_table"): "layers loads the model (torch) after checking its names",
    ("hookcli.api", "hookcli.run.saved"): "statistics of saved features load torch once the call is checked",
    ("hookcli.api", "hookcli.run.compare"): "a comparison loads torch once the call is checked",
    ("hookcli.api", "hookcli.run.environment"): "doctor loads torch and torchvision only when it checks them",
    ("hookcli.run.environment", "torch"): "doctor imports torch inside its check: a broken install is reported",
    ("hookcli.run.environment", "torchvision"): "as torch: a mismatched torchvision fails as it is imported",
    ("hookcli.run.environment", "hookcli.inputs.decoding"): "doctor's GPU decoding check, which imports torchvision",
    ("hookcli.run.environment", "huggingface_hub"): "doctor's Hugging Face cache check, where an extra installed it",
    ("hookcli.api", "hookcli.statistics.comparison"): "how to compare is checked with torch's accumulators' module",
    ("hookcli.api", "hookcli.pictures.grids"): "the pictures (numpy, Pillow) load when grid runs",
    ("hookcli.api", "hookcli.pictures.reports"): "the pictures (numpy, Pillow) load when report runs",
    ("hookcli.api", "hookcli.pictures.summary"): "the statistics (numpy) load when info runs",
    ("hookcli.api", "hookcli.storage.shards"): "the readers (numpy) load when a command reads features",
    ("hookcli.models.catalog", "hookcli.models.sources.given"): "a module handed in: its caller has imported torch",
    ("hookcli.cli.running", "hookcli.api"): "--help and parse errors answer without the library (about 30 ms)",
    ("hookcli.cli.commands", "hookcli.models.catalog"): "models' note on an empty listing, without slowing --help",
    ("hookcli.cli.attending", "hookcli.statistics.rollout"): "a rollout loads torch once its options are parsed",
    ("hookcli.cli.running", "tqdm"): "the progress bar (about 60 ms) loads when one is drawn",
    ("hookcli.inputs.clips", "av"): "PyAV is an optional extra, loaded when a video file is opened",
    ("hookcli.run.attention", "timm"): "timm's rotary embedding, applied as a module of timm's own asks for it",
    ("hookcli.inputs.clips", "hookcli.inputs.limits"): "Pillow's limit, read when a video file is opened",
    ("hookcli.models.registry", "torchvision"): "torchvision is read only to fill a cold registry cache",
    ("hookcli.pictures.render", "matplotlib"): "matplotlib (about 0.15 s) loads when a picture is first coloured",
    ("hookcli.statistics.similarity", "scipy"): "scipy's rank correlations (about 0.3 s) load when RDMs are compared",
    ("hookcli.statistics.covariance", "scipy"): "scipy's eigensolver loads when the components are made",
    ("hookcli.statistics.covariance", "threadpoolctl"): "LAPACK's threads are limited when the components are made",
}

#: What the commands that answer at once (--help, models, the refusals made before a model loads) must not import.
HEAVY = {"torch", "torchvision", "numpy", "PIL", "matplotlib", "safetensors", "tqdm", "av"}


def _all_imports(module: str):
    """``(imported module, line, inside a function)`` for every import of ``module``, outside ``TYPE_CHECKING``."""
    tree = ast.parse(MODULES[module].read_text())
    functions = {
        id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(f)
    }
    checking = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for n in ast.walk(block)
    }
    for node in ast.walk(tree):
        if id(node) in checking:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, id(node) in functions
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                yield (target if target in MODULES else node.module), node.lineno, id(node) in functions


def test_imports_inside_functions_are_the_listed_few():
    found = {
        (module, target if target.startswith("hookcli") else target.split(".")[0]): line
        for module in MODULES
        for target, line, inside in _all_imports(module)
        if inside
    }
    assert sorted(found) == sorted(LAZY_IMPORTS)


def test_the_commands_that_answer_at_once_import_none_of_the_heavy_libraries():
    """hookcli.cli (every command's --help, models, the refusals of :mod:`hookcli.run.request`) and what it imports
    at the top, transitively, import none of :data:`HEAVY`; the heavier layers load through :data:`LAZY_IMPORTS`."""
    seen, todo, heavy = set(), ["hookcli.cli", "hookcli.api", "hookcli.run.request"], []
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for target, line, inside in _all_imports(module):
            if inside:
                continue
            if target in MODULES:
                todo.append(target)
            elif target.split(".")[0] in HEAVY:
                heavy.append(f"{module}:{line} imports {target}")
    assert heavy == []
    assert {"hookcli.run.request", "hookcli.models.catalog", "hookcli.inputs.discovery"} <= seen


#: What a run's code never tests by name: the commands (it asks their objects, hookcli.run.commands) and the output
#: kinds (the commands and hookcli.run.outputs' Output say what an output is).
_COMMAND_NAMES = {"extract", "grad", "cam", "stats", "compare", "ablate", "patch"}
_OUTPUT_KINDS = {"memory", "file", "folder", "stdout", "cam", "default", "stats", "compare", "ablate", "patch"}
#: Where they may be: the command objects, the output's own module, and the option tables and command line.
_NAMING_THEM = ("hookcli.run.commands", "hookcli.run.outputs", "hookcli.options", "hookcli.cli")


def _named_like(node: ast.expr, word: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == word) or (isinstance(node, ast.Attribute) and node.attr == word)


def _strings(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {s for element in node.elts for s in _strings(element) if not isinstance(element, ast.Starred)}
    return set()


def test_no_command_or_output_kind_is_tested_by_its_name_outside_the_command_objects():
    found = []
    for module, path in MODULES.items():
        if module.startswith(_NAMING_THEM):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            named = set().union(*(_strings(side) for side in sides))
            if any(_named_like(side, "command") for side in sides) and named & _COMMAND_NAMES:
                found.append(f"{module}:{node.lineno}")
            if any(_named_like(side, "kind") for side in sides) and named & _OUTPUT_KINDS:
                found.append(f"{module}:{node.lineno}")
    assert found == []
