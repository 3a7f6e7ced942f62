"""Each option is declared once (hookcli.options): the Click options, the Python API's defaults and the library's
checks all agree with the declaration, and an option written by hand beside it fails here."""

import ast
import dataclasses
from pathlib import Path

import click
import pytest

from hookcli.cli import main
from hookcli.errors import UsageProblem
from hookcli.options.compare import COMPARE_OPTIONS
from hookcli.options.declaring import declared
from hookcli.options.grid import GRID_OPTIONS, GridOptions
from hookcli.options.run import COMMAND_OPTIONS, RUN_OPTIONS, RunOptions, options_of

PACKAGE = Path(__file__).resolve().parent.parent / "hookcli"

#: Options of the command line that are not keywords of the library: where the inputs and the output are given,
#: the preset file and the progress bar. Each command's own, and no more.
COMMAND_LINE_ONLY = {
    "extract": {"config", "model", "layer", "output", "quiet"},
    "grad": {"config", "model", "layer", "output", "quiet"},
    "cam": {"config", "model", "layer", "output", "quiet"},
    "ablate": {"config", "model", "layer", "output", "quiet"},
    "stats": {"config", "model", "layer", "output", "quiet"},
    "compare": {
        "config",
        "model",
        "layer",
        "model2",
        "layers2",
        "weights2",
        "seed2",
        "keys2",
        "merge",
        "output",
        "quiet",
    },
    "grid": {"output", "force", "quiet"},
    "report": {"output", "page_size", "force", "quiet"},
}


#: What --precision's help ends with, by command.
_STORED = {
    "cam": "the maps are stored as float32",
    "stats": "statistics are gathered in float64 from float32 values",
    "compare": "similarities are computed in float64",
    "ablate": "the effects are gathered in float64 from float32 outputs",
}


def _table(command: str, name: str = ""):
    """The declarations an option of ``command`` comes from: the pictures' (and ``-k``, which stats and compare take
    for saved features), how to compare, or a run's."""
    if command in ("grid", "report") or name == "keys":
        return GRID_OPTIONS
    return COMPARE_OPTIONS if command == "compare" and name in {o.name for o in COMPARE_OPTIONS} else RUN_OPTIONS


def _described(param: click.Option) -> dict:
    kind = param.type
    default = None if type(param.default).__name__ == "Sentinel" else param.default  # click 8.3: no default given
    if param.is_flag and not param.secondary_opts and default is None:
        default = False  # a flag left unset is off
    found = {
        "flags": tuple(param.opts) + tuple(param.secondary_opts),
        "default": default,
        "help": param.help,
        "multiple": param.multiple,
    }
    if isinstance(kind, click.IntRange | click.FloatRange):
        found["bounds"] = (kind.min, kind.max)
    if isinstance(kind, click.Choice):
        found["choices"] = tuple(kind.choices)
    return found


def _expected(option, command: str) -> dict:
    flags = tuple(part for flag in option.flags for part in flag.split("/"))
    expected = {
        "flags": flags,
        "help": option.help_for(command).replace("{stored}", _STORED.get(command, "what is stored is --dtype")),
        "multiple": option.multiple,
    }
    expected["default"] = option.default
    if option.kind in ("int", "float") and option.low is not None:
        expected["bounds"] = (option.low, option.high)
    if option.kind == "choice":
        expected["choices"] = option.choices
    return expected


@pytest.mark.parametrize("command", sorted(COMMAND_LINE_ONLY))
def test_every_click_option_is_its_declaration(command):
    params = [p for p in main.commands[command].params if isinstance(p, click.Option)]
    written_by_hand = {
        p.name for p in params if p.name not in {option.name for option in _table(command, p.name or "")}
    }
    assert written_by_hand == COMMAND_LINE_ONLY[command]
    for param in params:
        if param.name not in written_by_hand:
            option = declared(param.name, _table(command, param.name or ""))
            assert _described(param) == _expected(option, command), param.name
    if command in COMMAND_OPTIONS:
        own = {p.name for p in params} - COMMAND_LINE_ONLY[command] - {"keys"}
        own -= {option.name for option in COMPARE_OPTIONS} if command == "compare" else set()
        assert own == set(COMMAND_OPTIONS[command])


def test_every_option_is_declared_by_one_field_of_the_package():
    """An option is declared by one field (``name: type = option(...)``), and the classes that take options
    (StatsChoice, CompareChoice) inherit those fields rather than write them again."""
    from hookcli.statistics.comparison import CompareChoice
    from hookcli.statistics.layer import StatsChoice

    names = {option.name for option in (*RUN_OPTIONS, *GRID_OPTIONS, *COMPARE_OPTIONS)}
    written: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if (
                        isinstance(statement, ast.AnnAssign)
                        and getattr(statement.target, "id", None) in names
                        and _declares(statement.value)
                    ):
                        written.setdefault(statement.target.id, []).append(f"{path.name}:{node.name}")
    twice = {name: places for name, places in written.items() if len(places) > 1 and name not in _SHARED_NAMES}
    assert twice == {}
    assert set(written) == names
    assert [f.name for f in dataclasses.fields(StatsChoice)] == ["top", "top_by", "quantiles", "pca", "components"]
    assert [f.name for f in dataclasses.fields(CompareChoice)] == [option.name for option in COMPARE_OPTIONS]
    assert {f.name: f.default for f in dataclasses.fields(GridOptions)} == {o.name: o.default for o in GRID_OPTIONS}
    assert COMMAND_OPTIONS["cam"] == tuple(option.name for option in options_of("cam"))


def _declares(value) -> bool:
    """Whether a field's value declares an option, or takes a declared one's default as fields once did."""
    return isinstance(value, ast.Call) and getattr(value.func, "id", "") in ("option", "declared_field", "field")


#: Names two tables declare, each its own option: grid's --top (channels) is not stats' --top (examples); a
#: grid's --alpha and --cmap are its overlay's; compare's --method and --pool are not cam's and extract's.
_SHARED_NAMES = {"top", "alpha", "cmap", "method", "pool"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"frame_stride": 0}, "frame_stride must be a whole number of at least 1, not 0"),
        ({"resize": 9000}, "resize must be at most 8192, not 9000"),
        ({"decode": "gpu"}, "decode must be one of cpu, device, not 'gpu'"),
        ({"alpha": 2}, "alpha must be between 0 and 1, not 2"),
    ],
)
def test_the_library_checks_the_declared_bounds(options, message):
    with pytest.raises(UsageProblem) as caught:
        RunOptions(**options)
    assert caught.value.message == message


def test_grid_bounds_are_one_declaration_for_the_command_line_and_the_library(runner, tmp_path):
    with pytest.raises(UsageProblem, match="padding must be at most 64, not 65"):
        GridOptions(padding=65)
    result = runner.invoke(main, ["grid", str(tmp_path / "x.safetensors"), "--padding", "65"])
    assert result.exit_code == 2
    assert "Invalid value for '--padding': 65 is not in the range 0<=x<=64" in result.output


def test_an_error_ending_in_its_own_stop_gets_no_second_before_its_hint():
    from hookcli.errors import HookcliError

    assert str(HookcliError("'x' is not a valid integer range.", hint="give A:B")) == (
        "'x' is not a valid integer range. Hint: give A:B"
    )
    assert str(HookcliError("no layer 'x'", hint="see layers")) == "no layer 'x'. Hint: see layers"
