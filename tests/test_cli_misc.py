"""hookcli layers, hookcli models, start-up cost, the package entry points, and the setup and docs CI builds."""

import json
import subprocess
import sys
from pathlib import Path

from hookcli.cli import main


def test_layers_json_lists_forward_order_shapes_params_and_calls(runner):
    result = runner.invoke(main, ["layers", "--model", "resnet18", "--weights", "none", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows[0] == {"path": ".", "type": "ResNet", "output": [1, 1000], "params": 11689512, "calls": 1}
    assert rows[1] == {"path": "conv1", "type": "Conv2d", "output": [1, 64, 112, 112], "params": 9408, "calls": 1}
    assert rows[-1] == {"path": "fc", "type": "Linear", "output": [1, 1000], "params": 513000, "calls": 1}
    assert next(r for r in rows if r["path"] == "layer1.0.relu")["calls"] == 2
    assert len(rows) == 68


def test_layers_table_depth_and_input_size(runner):
    result = runner.invoke(main, ["layers", "-m", "vgg11", "-w", "none", "--depth", "1", "--input-size", "64"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "path        type               output            params  calls",
        ".           VGG                [1,1000]     132,863,336      1",
        "features    Sequential         [1,512,2,2]    9,220,480      1",
        "avgpool     AdaptiveAvgPool2d  [1,512,7,7]            0      1",
        "classifier  Sequential         [1,1000]     123,642,856      1",
    ]


def test_layers_nl_is_one_object_per_line(runner):
    result = runner.invoke(main, ["layers", "-m", "resnet18", "--nl", "--depth", "1"])  # no download needed
    assert result.exit_code == 0, result.output
    paths = [json.loads(line)["path"] for line in result.stdout.splitlines()]
    assert paths == [".", "conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool", "fc"]


def test_layers_refuses_json_and_nl_together(runner):
    result = runner.invoke(main, ["layers", "-m", "resnet18", "--json", "--nl"])
    assert result.exit_code == 2
    assert result.stderr == ("Error: --json and --nl cannot be used together. Hint: see 'hookcli layers --help'\n")


def test_models_lists_every_family(runner):
    result = runner.invoke(main, ["models", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["model"]: r for r in json.loads(result.stdout)}
    assert rows["vgg16_bn"] == {
        "model": "vgg16_bn",
        "family": "classification",
        "default": "IMAGENET1K_V1",
        "weights": ["IMAGENET1K_V1"],
    }
    assert rows["resnet50"]["default"] == "IMAGENET1K_V2"
    assert {
        rows[name]["family"]
        for name in ("fasterrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn", "keypointrcnn_resnet50_fpn")
    } == {"detection"}
    assert [rows[name]["family"] for name in ("fcn_resnet50", "r3d_18", "raft_small", "quantized_resnet18")] == [
        "segmentation",
        "video",
        "optical_flow",
        "quantized",
    ]
    table = runner.invoke(main, ["models", "--family", "optical_flow"]).stdout.splitlines()
    assert table == [
        "model       family        weights",
        "raft_large  optical_flow  C_T_V1 C_T_V2 C_T_SKHT_V1 C_T_SKHT_V2 C_T_SKHT_K_V1 C_T_SKHT_K_V2 "
        "(default C_T_SKHT_V2)",
        "raft_small  optical_flow  C_T_V1 C_T_V2 (default C_T_V2)",
    ]


def test_help_does_not_import_torch():
    code = (
        "import sys, hookcli.cli; sys.argv = ['hookcli', '--help']\ntry:\n    hookcli.cli.main()\n"
        "except SystemExit:\n    pass\nprint('torch' in sys.modules, 'torchvision' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines()[-1] == "False False"
    assert "extract" in result.stdout and "layers" in result.stdout


def test_python_dash_m_and_version():
    result = subprocess.run([sys.executable, "-m", "hookcli", "--version"], capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout.startswith("hookcli, version ")


def test_contributing_setup_lines_are_what_ci_runs():
    root = Path(__file__).parent.parent
    guide = (root / "CONTRIBUTING.md").read_text().splitlines()
    fence = guide.index("```bash")
    install, test = guide[fence + 1], guide[fence + 2]
    ci = (root / ".ci" / "run").read_text().splitlines()
    assert (install, test) == ('pip install -e ".[test]"', "pytest -n auto")
    assert install in ci and test in ci


def test_ci_builds_the_docs_strictly_after_the_tests():
    root = Path(__file__).parent.parent
    ci = (root / ".ci" / "run").read_text().splitlines()
    docs = ci.index('pip install -e ".[docs]"')
    assert (
        ci.index("pytest -n auto")
        < docs
        < next(i for i, line in enumerate(ci) if line.startswith("mkdocs build --strict"))
    )
    config = (root / "mkdocs.yml").read_text().splitlines()
    assert "strict: true" in config and "use_directory_urls: false" in config


#: The order docs/commands.md takes the commands in: what to ask about first, then running, then reading, then the
#: install's check.
DOCUMENTED_ORDER = [
    "models",
    "layers",
    "extract",
    "grad",
    "cam",
    "stats",
    "compare",
    "ablate",
    "patch",
    "rollout",
    "grid",
    "report",
    "info",
    "doctor",
]


def test_the_docs_describe_every_command_and_generate_the_reference_from_main():
    docs = Path(__file__).parent.parent / "docs"
    headings = [line for line in (docs / "commands.md").read_text().splitlines() if line.startswith("## `hookcli ")]
    assert headings == [f"## `hookcli {name}`" for name in DOCUMENTED_ORDER]
    assert set(DOCUMENTED_ORDER) == set(main.commands)
    reference = (docs / "cli.md").read_text()
    assert "    :module: hookcli.cli\n    :command: main\n    :prog_name: hookcli\n" in reference


def test_the_readme_says_how_to_run_the_tests_as_ci_does():
    root = Path(__file__).parent.parent
    readme = (root / "README.md").read_text().splitlines()
    section = readme[readme.index("## Contributing") :]
    fence = section.index("```bash")
    assert section[fence + 1 : fence + 3] == ['pip install -e ".[test]"', "pytest -n auto"]
    ci = (root / ".ci" / "run").read_text().splitlines()
    assert ci.index('pip install -e ".[test]"') < ci.index("pytest -n auto")


def test_a_torchvision_built_for_another_torch_is_named_with_how_to_install_a_pair(tmp_path, make_image):
    make_image(tmp_path / "img.png")
    code = (
        "import sys, importlib.abc\n"
        "class Mismatched(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'torchvision':\n"
        "            raise RuntimeError('operator torchvision::nms does not exist')\n"
        "sys.meta_path.insert(0, Mismatched())\n"
        "from hookcli.cli import main\n"
        "main(['extract', '-m', 'resnet18', '-w', 'none', '-l', 'layer1', 'img.png'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines() == [
        "Error: RuntimeError: operator torchvision::nms does not exist. Hint: torch and torchvision are builds that "
        'do not match: install them as a pair, from one index (pip install --force-reinstall "torch" "torchvision")'
    ]


def test_a_warning_from_torch_is_one_note_without_its_cpp_source_path():
    import warnings

    from hookcli.console import notes_and_sigterm

    said = []
    with notes_and_sigterm(said.append):
        warnings.warn(
            "The given NumPy array is not writable (Triggered internally at "
            "/__w/pytorch/pytorch/torch/csrc/utils/tensor_numpy.cpp:213.)",
            UserWarning,
            stacklevel=1,
        )
    assert said == ["Note: The given NumPy array is not writable"]


def test_a_path_written_while_the_bar_shows_gets_a_line_of_its_own(capsys):
    from hookcli.cli.running import Reporter
    from hookcli.events import Wrote

    class Bar:
        def clear(self):
            print("[bar cleared]")

        def refresh(self):
            print("[bar drawn]")

    reporter = Reporter()
    reporter.bar = Bar()
    reporter(Wrote(Path("grids/a.png")))
    assert capsys.readouterr().out.splitlines() == ["[bar cleared]", "grids/a.png", "[bar drawn]"]


def test_first_line_of_an_empty_message_is_empty_text_or_the_errors_type():
    from hookcli.errors import first_line

    assert first_line("") == ""
    assert first_line(ValueError()) == "ValueError"
    assert first_line(UserWarning("(Triggered internally at /pytorch/csrc/x.cpp:1.)")) == "UserWarning"


def test_every_error_raised_on_purpose_says_what_to_do():
    """Each of hookcli's own errors made in the package is given a hint (the CLI prints it after the message)."""
    import ast

    import hookcli
    import hookcli.errors as errors

    own = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.HookcliError) and value is not errors.HookcliError
    }
    package = Path(hookcli.__file__).parent
    missing = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            called = getattr(node, "func", None)
            if isinstance(node, ast.Call) and isinstance(called, ast.Name) and called.id in own:
                if not any(keyword.arg in ("hint", None) for keyword in node.keywords):
                    missing.append(f"{path.relative_to(package)}:{node.lineno} {called.id}")
    assert missing == []
