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
    assert _loaded_after("import srforge.geometry") == {"srforge", "srforge.geometry"}


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
