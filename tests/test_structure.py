"""The import graph: geometry at the bottom, models never reach into data, no private names across modules."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "srforge"


def _loaded_after(statement: str) -> set[str]:
    """srforge modules in sys.modules after running ``statement`` in a fresh interpreter."""
    code = f"{statement}; import sys; print(' '.join(m for m in sys.modules if m.startswith('srforge')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_models_do_not_import_the_data_layer():
    loaded = _loaded_after("import srforge.models")
    assert "srforge.models.unet" in loaded  # the probe itself works
    assert not any(m.startswith("srforge.data") for m in loaded), sorted(loaded)


def test_geometry_is_at_the_bottom():
    assert _loaded_after("import srforge.geometry") == {"srforge", "srforge.constants", "srforge.geometry"}


def test_public_names_load_lazily_and_all_resolve():
    import srforge

    assert _loaded_after("import srforge") == {"srforge"}
    for name in srforge.__all__:
        assert getattr(srforge, name).__name__ == name


def _private_uses(path: Path) -> list[str]:
    """``from srforge.x import _name`` and ``module._name`` / ``Class._name`` for names imported from srforge."""
    tree = ast.parse(path.read_text(), str(path))
    imported: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("srforge"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.name}:{node.lineno} imports {node.module}.{alias.name}")
                imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("srforge"))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
        ):
            found.append(f"{path.name}:{node.lineno} uses {node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_crosses_modules(path):
    assert _private_uses(path) == []


def test_the_private_name_check_catches_both_forms(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from srforge.data.entry import _kind, Entry\nEntry._index(None, 0)\n")
    assert len(_private_uses(bad)) == 2


def _srforge_imports(path: Path) -> set[str]:
    """Every srforge module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("srforge"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("srforge"))
    return found


# (package, packages it must never import): the layers, imports running downward only (cli at the top; train,
# predict, evaluate and export beside each other; runtime, models and data below them; geometry at the bottom).
NEVER = [
    ("train", ("srforge.predict", "srforge.evaluate", "srforge.export", "srforge.cli")),
    ("predict", ("srforge.train", "srforge.export", "srforge.cli")),
    ("export", ("srforge.train", "srforge.predict", "srforge.cli")),
    ("evaluate", ("srforge.train", "srforge.export", "srforge.cli")),
    ("models", ("srforge.data", "srforge.train", "srforge.predict", "srforge.runtime", "srforge.config")),
    ("runtime", ("srforge.train", "srforge.predict", "srforge.export", "srforge.cli", "srforge.config")),
    ("data", ("srforge.train", "srforge.predict", "srforge.export", "srforge.cli", "srforge.runtime")),
    ("config", ("srforge.train", "srforge.predict", "srforge.export", "srforge.cli")),
]


@pytest.mark.parametrize("package, forbidden", NEVER, ids=[p for p, _ in NEVER])
def test_layers_import_downward_only(package, forbidden):
    crossing = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for name in sorted(_srforge_imports(path))
        if name.startswith(forbidden)
    ]
    assert crossing == []


def test_the_layer_check_sees_imports_inside_functions(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from srforge.predict import Predictor\n")
    assert "srforge.predict" in _srforge_imports(bad)


MAX_LINES, MAX_PARAMETERS = 60, 10


def _too_long_or_wide(path: Path) -> list[str]:
    """Functions over MAX_LINES lines (``def`` to the last line) or with more than MAX_PARAMETERS parameters
    (self and cls not counted; a public class's ``__init__`` may take more, but only as keyword-only options)."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        if positional and positional[0].arg in ("self", "cls"):
            positional = positional[1:]
        counted = len(positional) if node.name == "__init__" else len(positional) + len(args.kwonlyargs)
        lines = node.end_lineno - node.lineno + 1
        if lines > MAX_LINES:
            found.append(f"{path.name}:{node.lineno} {node.name} is {lines} lines long")
        if counted > MAX_PARAMETERS:
            found.append(f"{path.name}:{node.lineno} {node.name} takes {counted} parameters")
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_functions_are_short_and_take_few_parameters(path):
    assert _too_long_or_wide(path) == []


def test_the_length_check_counts_lines_and_parameters(tmp_path):
    bad = tmp_path / "bad.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    params = ", ".join(f"a{i}" for i in range(MAX_PARAMETERS + 1))
    options = "class C:\n    def __init__(self, *, " + params + "):\n        pass\n"  # keyword-only: allowed
    bad.write_text(f"def long():\n{body}\n\ndef wide({params}):\n    pass\n\n{options}")
    assert _too_long_or_wide(bad) == [
        f"bad.py:1 long is {MAX_LINES + 1} lines long",
        f"bad.py:{MAX_LINES + 3} wide takes {MAX_PARAMETERS + 1} parameters",
    ]


@pytest.mark.parametrize("package", sorted({p.parent for p in PACKAGE.rglob("*.py")}), ids=lambda p: p.name)
def test_every_package_names_its_public_api(package):
    init = package / "__init__.py"
    assert init.is_file(), f"{package} has no __init__.py"
    tree = ast.parse(init.read_text())
    assert ast.get_docstring(tree), f"{init} has no docstring"
    assigned = [node for node in tree.body if isinstance(node, ast.Assign)]
    names = [target.id for node in assigned for target in node.targets if isinstance(target, ast.Name)]
    assert "__all__" in names, f"{init} defines no __all__"
