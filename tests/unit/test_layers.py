"""The package's wings follow the flow: a wing imports only itself and the wings below it.

scenario -> fabric -> ranks -> measurements -> verdicts -> projections -> reports -> runs, on a
ground of shared helpers; the two front ends (cli, plugin) and the package's own entry sit on
top. An import that runs against the flow (also inside a function, also for type checking only)
is where a responsibility sits in the wrong place: move the code, not the rule.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import netsim_ddp

PACKAGE = Path(netsim_ddp.__file__).parent

# Lowest first. Each wing may import its own modules and any wing before it in this list.
# workload/ is three wings and a face: contract/ (torch-free: the files and signals both sides
# share) below launcher/ (torch-free: starts ranks) below ranks/ (inside a rank: torch), and the
# package's __init__ handing on their names.
WINGS = ("common", "precision", "scenario", "hostfacts", "fabric", "workload.contract",
         "workload.launcher", "workload.ranks", "workload", "measure", "verdicts", "projection",
         "report", "run")
TOP = ("__init__", "cli", "plugin")  # may import everything


def _wing(module: str) -> str:
    """`netsim_ddp.fabric.emulated_network` -> `fabric`; `netsim_ddp.workload.ranks.rank` ->
    `workload.ranks`; `netsim_ddp.cli` -> `cli`; a name of the package itself
    (`netsim_ddp.Scenario`) -> `__init__`."""
    parts = module.split(".")
    if len(parts) > 2 and ".".join(parts[1:3]) in WINGS:
        return ".".join(parts[1:3])
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
    wings = {wing.split(".")[0] for wing in WINGS}
    assert top_level == wings | set(TOP), "a module outside the wings: place it in one"
    inside = {p.stem for p in (PACKAGE / "workload").iterdir()
              if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert inside == {"__init__", "contract", "launcher", "ranks"}, \
        ("a workload module outside contract/ and launcher/ (no torch) and ranks/ (torch): "
         "place it in one")


# What runs inside a rank: the only modules that may import torch.
RANK_SIDE = ("workload.ranks",)
RANK_SIDE_MODULES = ("netsim_ddp.precision.hooks",)  # the comm hooks a rank's DDP installs


def launch_side_modules() -> list[str]:
    """Every module that does not run inside a rank: the launcher, the host facts, the fabric,
    the runner, the front ends..."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module, _ = _module_name(path)
        if (_wing(module) not in RANK_SIDE and module not in RANK_SIDE_MODULES
                and not module.endswith(".__main__")):  # runs the command when imported
            names.append(module)
    return names


def _import_without_torch(modules: list[str], cwd: Path | None = None):
    """A fresh interpreter imports `modules` one by one and fails at the first after which
    torch is loaded, naming it."""
    code = ("import sys\n"
            f"for name in {modules!r}:\n"
            "    __import__(name)\n"
            "    assert 'torch' not in sys.modules, f'{name} imported torch'\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=cwd)


def test_the_launch_side_never_imports_torch():
    """torch is imported inside a rank only (workload/ranks/): a process that imports every
    other module of the package (launcher, host facts, fabric, runner, cli...) has no torch in
    it, so launching, planning and reading results never pay for (or need) torch."""
    modules = launch_side_modules()
    out = _import_without_torch(modules)
    assert out.returncode == 0, out.stderr[-2000:]
    assert any(m.startswith("netsim_ddp.workload.launcher.") for m in modules)
    assert any(m.startswith("netsim_ddp.workload.contract.") for m in modules)
    assert not any(m.startswith("netsim_ddp.workload.ranks") for m in modules)


def test_the_torch_check_sees_a_launch_side_torch_import(tmp_path):
    """The check itself: the same probe over a module that imports torch fails, naming it."""
    (tmp_path / "leaky.py").write_text("import torch\n")
    out = _import_without_torch(["leaky"], cwd=tmp_path)
    assert out.returncode != 0 and "leaky imported torch" in out.stderr


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


def private_imports(paths: list[Path]) -> list[str]:
    """`from netsim_ddp.X import _name` anywhere in `paths`: a module's private name used by
    another module, a seam that should have a public name."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("netsim_ddp"):
                found += [f"{path}:{node.lineno}: {alias.name} from {node.module}"
                          for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_name():
    """Seams are public: what another module (or a test) needs has a public name."""
    tests = Path(__file__).resolve().parents[1]
    assert private_imports(sorted(PACKAGE.rglob("*.py")) + sorted(tests.rglob("*.py"))) == []


def test_the_private_import_count_sees_one(tmp_path):
    (tmp_path / "leaky.py").write_text("from netsim_ddp.run.probing import _hidden, public\n")
    assert private_imports([tmp_path / "leaky.py"]) == [
        f"{tmp_path / 'leaky.py'}:1: _hidden from netsim_ddp.run.probing"]


def test_no_file_name_stands_in_two_folders():
    """One name, one place: `sizing.py` in two folders makes every mention of it ambiguous."""
    names: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            names.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: where for name, where in names.items() if len(where) > 1} == {}
