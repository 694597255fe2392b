"""The house rules of diffsynth, measured by ``scripts/house_report.py``: arrows point down (testing -> training ->
pipelines -> diffusion -> core, lora below training and above core; the tiny builders of ``testing`` are never
imported by the package), importing the pipelines loads no trainer, no import circle,
no module over 500 lines, no function over 80, and only ``diffsynth/training/config/`` reads the argparse Namespace
(and it imports nothing else of the trainer).
"""

import ast
import textwrap
from pathlib import Path

import pytest

from tests.conftest import load_script, python_output

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "diffsynth"
# Each layer with the layers above it, which it must not import (lazily or under TYPE_CHECKING neither).
LAYERS_ABOVE = {
    "core": ("lora", "diffusion", "pipelines", "training", "testing"),
    "lora": ("training", "testing"),
    "diffusion": ("pipelines", "training", "testing"),
    "pipelines": ("training", "testing"),
    "training": ("testing",),
}


house = load_script("scripts/house_report.py", "house_report", register=True)  # its dataclasses look it up


@pytest.fixture(scope="module")
def metrics():
    return house.house_metrics(PACKAGE)


@pytest.fixture(scope="module")
def every_import():
    """What each module imports at all (lazily or under TYPE_CHECKING too): one parse of the package for the tests
    below, which each read it."""
    return house.import_graph(house.load_modules(PACKAGE), run_time_only=False)


def _write_package(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return root / next(iter(files)).split("/")[0]


def test_importing_the_pipelines_loads_nothing_of_the_trainer():
    code = ("import diffsynth.pipelines, sys; "
            "print(sorted(m for m in sys.modules if m.startswith('diffsynth.training')))")
    assert python_output(code) == "[]"


@pytest.mark.parametrize("layer", sorted(LAYERS_ABOVE))
def test_no_layer_imports_a_layer_above_it(layer, every_import):
    above = tuple(f"diffsynth.{name}" for name in LAYERS_ABOVE[layer])
    upward = sorted(f"{module} -> {target}" for module, targets in every_import.items()
                    if module.startswith(f"diffsynth.{layer}.") or module == f"diffsynth.{layer}"
                    for target in targets if target.startswith(above))
    assert upward == []


def test_the_trainer_config_imports_nothing_else_of_the_trainer(every_import):
    # The config sits at the bottom of the trainer: every other folder reads it, it reads none of them (lazily or
    # under TYPE_CHECKING neither), so its flags parse and check without the rest of the trainer.
    config = "diffsynth.training.config"
    upward = sorted(f"{module} -> {target}" for module, targets in every_import.items()
                    if module == config or module.startswith(f"{config}.")
                    for target in targets
                    if (target == "diffsynth.training" or target.startswith("diffsynth.training."))
                    and not (target == config or target.startswith(f"{config}.")))
    assert upward == []


def test_there_is_no_import_circle(metrics):
    assert metrics.import_circles == []


def test_no_module_is_over_the_limit(metrics):
    assert [f"{module.path.as_posix()}: {module.line_count} lines" for module in metrics.long_modules] == []


def test_no_function_is_over_the_limit(metrics):
    assert [f"{info.path.as_posix()}:{info.line} {info.name}: {info.line_count} lines"
            for info in metrics.long_functions] == []


def test_code_outside_the_families_rooms_hardly_names_a_family(metrics):
    mentions = metrics.family_mentions
    assert sum(mentions.values()) <= house.MAX_FAMILY_MENTIONS and len(mentions) <= house.MAX_FAMILY_FILES, mentions


def test_family_mentions_count_code_not_prose():
    source = textwrap.dedent('''
        """Wan and FLUX.1 in a docstring do not count."""
        import diffsynth.pipelines.wan_video  # a comment on Wan does not count
        PRESET = "z_image"
        MESSAGE = "Qwen-Image is prose"
        def shift():
            """Nor FLUX here."""
            return "flux.1-dev"
    ''')
    assert house.family_mentions(source, ast.parse(source)) == 3  # the import, "z_image", "flux.1-dev"


def test_only_the_config_folder_reads_the_namespace(metrics):
    assert [f"{info.path.as_posix()}:{info.line} {info.name}"
            for info in metrics.namespace_readers_outside(house.NAMESPACE_FOLDER)] == []


def test_the_circle_analysis_counts_what_runs_at_import_time(tmp_path):
    package = _write_package(tmp_path, {
        "fake/__init__.py": "",
        # The circle: a -> b -> fake.sub (the package of the submodule b imports) -> a.
        "fake/a.py": """
            from typing import TYPE_CHECKING
            try:
                from .b import B
            except ImportError:
                B = None
            if TYPE_CHECKING:
                from .typed import Typed  # only for type checkers: typed stays out of the circle
            A = 1
        """,
        "fake/b.py": "from fake.sub.leaf import LEAF\nB = LEAF\n",
        "fake/sub/__init__.py": "from ..a import A\nfrom . import sibling\n",
        # Imported inside a function: runs later, so leaf stays out of the circle.
        "fake/sub/leaf.py": "LEAF = 1\n\n\ndef late():\n    from .. import b\n    return b\n",
        # Its own package fake.sub is imported before sibling runs: sibling stays out of the circle.
        "fake/sub/sibling.py": "from .leaf import LEAF\n",
        "fake/typed.py": "from .a import A\n\n\nclass Typed:\n    pass\n",
    })
    modules = house.load_modules(package)
    graph = house.import_graph(modules)
    assert graph["fake.b"] == {"fake.sub", "fake.sub.leaf"}
    assert graph["fake.sub.sibling"] == {"fake.sub.leaf"}
    assert house.import_circles(graph) == [["fake.a", "fake.b", "fake.sub"]]
    assert house.house_metrics(package).import_circles == [["fake.a", "fake.b", "fake.sub"]]
    # Counting every import statement (what a module depends on at all) takes in the two left out above.
    every = house.import_graph(modules, run_time_only=False)
    assert "fake.b" in every["fake.sub.leaf"] and "fake.typed" in every["fake.a"]


def test_namespace_readers_are_told_from_tuples_and_typed_configs(tmp_path):
    package = _write_package(tmp_path, {
        "fake/__init__.py": "",
        "fake/flags.py": """
            import argparse
            import functools
            from typing import Any


            def annotated(args: argparse.Namespace | None):
                return args


            def attribute(args):
                return args.rank


            def through_vars(args, other):
                return vars(args)


            def through_partial(args: Any):
                return functools.partial(getattr, args)


            def varargs(*args):
                return args.count(1)


            def hook(module, args: tuple):
                return args[0]


            def typed(options: "Config"):
                return options.rank


            def shadowed(args: tuple):
                return lambda args: args.rank  # the lambda's own args
        """,
    })
    metrics = house.house_metrics(package)
    assert [info.name for info in metrics.namespace_readers] == [
        "annotated", "attribute", "through_vars", "through_partial"]
    assert metrics.folder_sizes == {Path("fake"): 2}
    assert metrics.functions[0].line_count == 2
