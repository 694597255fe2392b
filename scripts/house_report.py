"""Measures how well a package keeps the house rules, from its source alone (nothing is imported).

    python scripts/house_report.py                  # the report for diffsynth/
    python scripts/house_report.py path/to/package  # another package folder

The rules, which ``tests/test_house.py`` asserts with the functions below: no module over
:data:`MAX_MODULE_LINES` lines, no function over :data:`MAX_FUNCTION_LINES`, no function outside
:data:`NAMESPACE_FOLDER` reads an ``argparse.Namespace``, no import circle, and code outside the families' rooms
(:data:`FAMILY_ROOMS`) names a model family at most :data:`MAX_FAMILY_MENTIONS` times in
:data:`MAX_FAMILY_FILES` files.

A family is named by an identifier, an import or a short string key (a string of one word, up to 60 characters) that
holds one of the families' name roots (:data:`FAMILY_NAMES`, case ignored); prose (docstrings, comments, strings
with spaces) does not count.

A function reads a Namespace when a parameter is annotated ``argparse.Namespace`` (alone or in a union), or when a
parameter named ``args`` (whatever its annotation) is used as ``args.<name>``, ``vars(args)``, ``getattr(args, ...)``,
``hasattr(args, ...)`` or ``partial(getattr, args)`` in its body; ``*args`` is a tuple, never a Namespace.

Import circles are those Python meets at run time. An import counts when it runs as its module is imported: at the
top level, inside a top-level ``if`` / ``try`` or in a class body, but not inside a function nor under
``if TYPE_CHECKING:``. Importing ``a.b.c`` (or ``from a.b import c``) first imports the packages ``a`` and ``a.b``,
so those count as well, except the packages the importing module sits in: Python imports them before the module's
first line runs, so naming them again runs nothing. ``from pkg import name`` imports the submodule ``pkg.name`` where
there is one, else it needs ``pkg`` itself. Each strongly connected component of more than one module is one circle.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
# The one folder (relative to the package's parent) whose functions may read the trainer's argparse Namespace.
NAMESPACE_FOLDER = "diffsynth/training/config"
LONGEST_SHOWN = 10
# Where a family may be named: its room and the tiny builders.
FAMILY_ROOMS = ("diffsynth/pipelines", "diffsynth/testing")
MAX_FAMILY_MENTIONS = 15
MAX_FAMILY_FILES = 5
# The name roots of the registered families (Qwen-Image, Wan, Z-Image, FLUX.1, FLUX.2 [klein], LTX-2); a new family
# adds its.
FAMILY_NAMES = re.compile(r"qwen|wan(?![a-z])|z[_-]?image|flux|klein|ltx", re.IGNORECASE)
_SHORT_KEY = 60
_NAMESPACE_CALLS = ("vars", "getattr", "hasattr")

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class SourceModule:
    """One ``.py`` file of the package.

    Attributes:
        name: The dotted module name (``diffsynth.lora.formats``; a package's ``__init__.py`` is the package).
        path: The file, relative to the package's parent folder (``diffsynth/lora/formats.py``).
        is_package: Whether the file is a package's ``__init__.py``.
        tree: The parsed source.
        line_count: Lines in the file.
    """

    name: str
    path: Path
    is_package: bool
    tree: ast.Module
    line_count: int


@dataclass(frozen=True)
class FunctionInfo:
    """A function or method, named by its class and enclosing functions (``Pipeline.__call__``)."""

    path: Path
    name: str
    line: int
    line_count: int


@dataclass(frozen=True)
class HouseMetrics:
    """What :func:`house_metrics` measures of one package.

    Attributes:
        folder_sizes: ``.py`` files directly in each folder, by the folder's path.
        namespace_readers: The functions that read an ``argparse.Namespace``, anywhere in the package.
        functions: Every function, longest first.
        long_modules: The modules over :data:`MAX_MODULE_LINES` lines, longest first.
        import_circles: The modules of each import circle, sorted.
        family_mentions: The modules outside the families' rooms that name a family, with how often, most first.
    """

    folder_sizes: dict[Path, int]
    namespace_readers: list[FunctionInfo]
    functions: list[FunctionInfo]
    long_modules: list[SourceModule]
    import_circles: list[list[str]]
    family_mentions: dict[Path, int]

    @property
    def long_functions(self) -> list[FunctionInfo]:
        """The functions over :data:`MAX_FUNCTION_LINES` lines, longest first."""
        return [function for function in self.functions if function.line_count > MAX_FUNCTION_LINES]

    def namespace_readers_outside(self, folder: str) -> list[FunctionInfo]:
        """The Namespace readers whose file is not under ``folder`` (relative to the package's parent)."""
        return [function for function in self.namespace_readers if not function.path.is_relative_to(folder)]


def load_modules(package_dir: Path) -> dict[str, SourceModule]:
    """Every ``.py`` file below ``package_dir``, parsed, by dotted module name."""
    modules = {}
    for file in sorted(package_dir.rglob("*.py")):
        path = file.relative_to(package_dir.parent)
        is_package = path.name == "__init__.py"
        parts = path.parent.parts if is_package else (*path.parent.parts, path.stem)
        source = file.read_text(encoding="utf-8")
        modules[".".join(parts)] = SourceModule(".".join(parts), path, is_package, ast.parse(source, str(file)),
                                                len(source.splitlines()))
    return modules


def folder_sizes(modules: Mapping[str, SourceModule]) -> dict[Path, int]:
    """The count of ``.py`` files directly in each folder that holds any."""
    sizes: dict[Path, int] = {}
    for module in modules.values():
        sizes[module.path.parent] = sizes.get(module.path.parent, 0) + 1
    return dict(sorted(sizes.items()))


# ---- functions -------------------------------------------------------------------------------------------------


def _function_nodes(node: ast.AST, scope: tuple[str, ...] = ()) -> Iterator[tuple[str, FunctionNode]]:
    """Each function below ``node`` with its qualified name, nested ones included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield ".".join((*scope, child.name)), child
            yield from _function_nodes(child, (*scope, child.name))
        elif isinstance(child, ast.ClassDef):
            yield from _function_nodes(child, (*scope, child.name))
        else:
            yield from _function_nodes(child, scope)


def _parameters(arguments: ast.arguments) -> list[ast.arg]:
    """The named parameters (``*args`` and ``**kwargs`` left out)."""
    return [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]


def _names_namespace(annotation: ast.expr) -> bool:
    """Whether an annotation (``argparse.Namespace``, ``Namespace | None``, or such a string) names ``Namespace``."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    return any((isinstance(node, ast.Name) and node.id == "Namespace")
               or (isinstance(node, ast.Attribute) and node.attr == "Namespace") for node in ast.walk(annotation))


def _is_name(node: ast.AST, names: Collection[str]) -> bool:
    """Whether ``node`` is a bare name, one of ``names``."""
    return isinstance(node, ast.Name) and node.id in names


def _is_namespace_use(node: ast.AST, name: str) -> bool:
    """Whether ``node`` is ``name.<attribute>``, ``vars(name)`` / ``getattr(name, ...)`` / ``hasattr(name, ...)``, or
    hands ``name`` on with one of those (``functools.partial(getattr, name)``)."""
    if isinstance(node, ast.Attribute):
        return _is_name(node.value, (name,))
    if not isinstance(node, ast.Call):
        return False
    if _is_name(node.func, _NAMESPACE_CALLS):
        return bool(node.args) and _is_name(node.args[0], (name,))
    return len(node.args) > 1 and _is_name(node.args[0], _NAMESPACE_CALLS) and _is_name(node.args[1], (name,))


def _uses_as_namespace(node: ast.AST, name: str) -> bool:
    """Whether code below ``node`` uses ``name`` as a Namespace, skipping nested functions that rebind ``name``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) \
                and name in {parameter.arg for parameter in _parameters(child.args)}:
            continue
        if _is_namespace_use(child, name) or _uses_as_namespace(child, name):
            return True
    return False


def reads_namespace(function: FunctionNode) -> bool:
    """Whether ``function`` reads an ``argparse.Namespace`` (see the module docstring for the rule)."""
    parameters = _parameters(function.args)
    if any(parameter.annotation is not None and _names_namespace(parameter.annotation) for parameter in parameters):
        return True
    return any(parameter.arg == "args" for parameter in parameters) \
        and any(_uses_as_namespace(statement, "args") for statement in function.body)


def function_infos(modules: Mapping[str, SourceModule]) -> list[tuple[FunctionInfo, FunctionNode]]:
    """Every function of the package with its node, in file order."""
    return [(FunctionInfo(module.path, name, node.lineno, node.end_lineno - node.lineno + 1), node)
            for module in modules.values() for name, node in _function_nodes(module.tree)]


# ---- imports ---------------------------------------------------------------------------------------------------


def _is_type_checking(test: ast.expr) -> bool:
    """Whether an ``if`` test is ``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") \
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_time_import_statements(body: Sequence[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of a module body that run when the module is imported."""
    for statement in body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            yield statement
        elif isinstance(statement, ast.If):
            if not _is_type_checking(statement.test):
                yield from _run_time_import_statements(statement.body)
            yield from _run_time_import_statements(statement.orelse)
        elif isinstance(statement, ast.ClassDef):
            yield from _run_time_import_statements(statement.body)
        elif isinstance(statement, (ast.Try, ast.TryStar)):
            for block in (statement.body, *(handler.body for handler in statement.handlers), statement.orelse,
                          statement.finalbody):
                yield from _run_time_import_statements(block)


def _parent_packages(name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``."""
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def _from_base(statement: ast.ImportFrom, importer: SourceModule) -> str:
    """The absolute module a ``from ... import`` reads from, relative levels resolved."""
    if statement.level == 0:
        return statement.module
    package = importer.name if importer.is_package else importer.name.rpartition(".")[0]
    parts = package.split(".")
    parts = parts[:max(0, len(parts) - statement.level + 1)]
    return ".".join([*parts, statement.module] if statement.module else parts)


def _imported_modules(statement: ast.Import | ast.ImportFrom, importer: SourceModule,
                      known: Collection[str]) -> set[str]:
    """The package's modules that running ``statement`` in ``importer`` may execute (see the module docstring)."""
    if isinstance(statement, ast.Import):
        targets = {alias.name for alias in statement.names}
        implied: set[str] = set()
    else:
        base = _from_base(statement, importer)
        targets = {f"{base}.{alias.name}" for alias in statement.names if f"{base}.{alias.name}" in known}
        if len(targets) < len(statement.names):  # some names are attributes of the base module itself
            targets.add(base)
        implied = {base}
    implied.update(parent for target in targets for parent in _parent_packages(target))
    implied.difference_update(_parent_packages(importer.name))
    return {name for name in targets | implied if name in known and name != importer.name}


def import_graph(modules: Mapping[str, SourceModule], run_time_only: bool = True) -> dict[str, set[str]]:
    """The package's modules each module imports.

    Args:
        modules: The package, from :func:`load_modules`.
        run_time_only: Count only the imports that run when the module is imported; False counts every import
            statement (inside functions and under ``TYPE_CHECKING`` too), for what a module depends on at all.
    """
    graph = {}
    for name, module in modules.items():
        statements = _run_time_import_statements(module.tree.body) if run_time_only else (
            node for node in ast.walk(module.tree) if isinstance(node, (ast.Import, ast.ImportFrom)))
        graph[name] = {target for statement in statements for target in _imported_modules(statement, module, modules)}
    return graph


def strongly_connected_components(graph: Mapping[str, Collection[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph``, each sorted, in the order Tarjan completes them."""
    index: dict[str, int] = {}
    low_link: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low_link[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low_link[node] = min(low_link[node], low_link[successor])
            elif successor in on_stack:
                low_link[node] = min(low_link[node], index[successor])
        if low_link[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def import_circles(graph: Mapping[str, Collection[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, sorted."""
    return sorted(component for component in strongly_connected_components(graph) if len(component) > 1)


def _docstring_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def family_mentions(source: str, tree: ast.Module) -> int:
    """How often ``source`` names a family in code: identifiers and one-word string keys, not prose."""
    docstrings, count = _docstring_lines(tree), 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME:
            count += bool(FAMILY_NAMES.search(token.string))
        elif token.type == tokenize.STRING and token.start[0] not in docstrings and len(token.string) <= _SHORT_KEY:
            count += bool(FAMILY_NAMES.search(token.string)) and " " not in token.string
    return count


def family_mentions_outside_rooms(package_dir: Path, modules: Mapping[str, SourceModule]) -> dict[Path, int]:
    """The modules outside :data:`FAMILY_ROOMS` that name a family, with how often."""
    found = {}
    for module in modules.values():
        if module.path.as_posix().startswith(FAMILY_ROOMS):
            continue
        count = family_mentions((package_dir.parent / module.path).read_text(encoding="utf-8"), module.tree)
        if count:
            found[module.path] = count
    return dict(sorted(found.items(), key=lambda item: -item[1]))


# ---- the report ------------------------------------------------------------------------------------------------


def house_metrics(package_dir: Path) -> HouseMetrics:
    """Measures the package in ``package_dir`` (e.g. ``REPO / "diffsynth"``)."""
    modules = load_modules(package_dir)
    functions = function_infos(modules)
    return HouseMetrics(
        folder_sizes=folder_sizes(modules),
        namespace_readers=[info for info, node in functions if reads_namespace(node)],
        functions=sorted((info for info, _ in functions), key=lambda info: -info.line_count),
        long_modules=sorted((module for module in modules.values() if module.line_count > MAX_MODULE_LINES),
                            key=lambda module: -module.line_count),
        import_circles=import_circles(import_graph(modules)),
        family_mentions=family_mentions_outside_rooms(package_dir, modules),
    )


def format_report(metrics: HouseMetrics) -> str:
    """The metrics as the text the script prints."""
    lines = ["files per folder:"]
    lines += [f"  {count:4d}  {folder.as_posix()}/" for folder, count in metrics.folder_sizes.items()]
    readers = metrics.namespace_readers
    files = len({info.path for info in readers})
    lines += ["", f"functions that read an argparse.Namespace: {len(readers)}, in {files} file(s)"]
    lines += [f"  {info.path.as_posix()}:{info.line}  {info.name}" for info in readers]
    lines += ["", f"the {LONGEST_SHOWN} longest functions (limit {MAX_FUNCTION_LINES} lines):"]
    lines += [f"  {info.line_count:4d}  {info.path.as_posix()}:{info.line}  {info.name}"
              for info in metrics.functions[:LONGEST_SHOWN]]
    lines += ["", f"modules over {MAX_MODULE_LINES} lines: {len(metrics.long_modules)}"]
    lines += [f"  {module.line_count:4d}  {module.path.as_posix()}" for module in metrics.long_modules]
    lines += ["", f"import circles: {len(metrics.import_circles)}"]
    lines += [f"  {' <-> '.join(circle)}" for circle in metrics.import_circles]
    mentions = metrics.family_mentions
    lines += ["", f"family names outside {', '.join(FAMILY_ROOMS)}: {sum(mentions.values())} in {len(mentions)} "
                  f"file(s) (limits {MAX_FAMILY_MENTIONS} and {MAX_FAMILY_FILES})"]
    lines += [f"  {count:4d}  {path.as_posix()}" for path, count in mentions.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package_dir", nargs="?", type=Path, default=REPO / "diffsynth",
                        help="the package folder to measure (default: diffsynth/)")
    print(format_report(house_metrics(parser.parse_args(argv).package_dir.resolve())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
