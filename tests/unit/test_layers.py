"""The package's wings follow the flow: a wing imports only itself and the wings below it.

scenario -> fabric -> ranks -> measurements -> verdicts -> projections -> reports -> runs, on a
ground of shared helpers; the two front ends (cli, plugin) and the package's own entry sit on
top. An import that runs against the flow (also inside a function, also for type checking only)
is where a responsibility sits in the wrong place: move the code, not the rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import netsim_ddp

PACKAGE = Path(netsim_ddp.__file__).parent

# Lowest first. Each wing may import its own modules and any wing before it in this list.
WINGS = ("common", "precision", "scenario", "fabric", "workload", "measure", "verdicts",
         "projection", "report", "run")
TOP = ("__init__", "_moved", "cli", "plugin")  # may import everything


def _wing(module: str) -> str:
    """`netsim_ddp.fabric.core` -> `fabric`; `netsim_ddp.cli` -> `cli`; a name of the package
    itself (`netsim_ddp.Scenario`) -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in WINGS + TOP else "__init__"


def _module_name(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every netsim_ddp module `path` imports, with its line, relative imports resolved."""
    module, is_package = _module_name(path)
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from netsim_ddp import cli` imports the module netsim_ddp.cli
            names = [f"{target}.{alias.name}" for alias in node.names]
            found += [(node.lineno, name if target == "netsim_ddp" else target)
                      for name in names]
    return [(line, name) for line, name in found if name.split(".")[0] == "netsim_ddp"]


def _rank(wing: str) -> int:
    return len(WINGS) if wing in TOP else WINGS.index(wing)


def against_the_flow() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module, _ = _module_name(path)
        wing = _wing(module)
        for line, target in _imports(path):
            if _rank(_wing(target)) > _rank(wing):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {wing} imports "
                             f"{target} ({_wing(target)} is above it)")
    return found


def test_every_module_belongs_to_a_wing():
    top_level = {p.stem for p in PACKAGE.iterdir()
                 if (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert top_level == set(WINGS) | set(TOP), "a module outside the wings: place it in one"


def test_no_import_runs_against_the_flow():
    assert against_the_flow() == []


def test_the_check_sees_an_import_against_the_flow(tmp_path, monkeypatch):
    """The check itself: a fabric module importing a verdict is caught, also when the import
    is relative and inside a function."""
    fake = tmp_path / "netsim_ddp"
    (fake / "fabric").mkdir(parents=True)
    (fake / "verdicts").mkdir()
    for init in (fake / "__init__.py", fake / "fabric" / "__init__.py",
                 fake / "verdicts" / "__init__.py"):
        init.write_text("")
    (fake / "verdicts" / "gate.py").write_text("from ..fabric import core\n")
    (fake / "fabric" / "core.py").write_text("def f():\n    from ..verdicts import gate\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", fake)
    found = against_the_flow()
    assert len(found) == 1
    assert "fabric/core.py:2: fabric imports netsim_ddp.verdicts " in found[0]
