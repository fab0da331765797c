"""The import rules of DESIGN.md §2, read from the source: every import of every module of compiler/ and server/
(function-level ones too, parsed with ast) must go one way down the pipeline. Each stage lists the stages it may
import; the drivers see every stage; nothing in compiler/ imports server/ but the CLI's serve command, lazily, and
`tessel compile` (or --help) never loads the server or Starlette."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Importable from every module: errors and targets.
BASE = {"compiler.errors", "compiler.target"}
# What each stage may import besides BASE: the IR it reads and the IR it writes, never a later stage.
# frontend → graph → passes → te/ops → schedules → tir → codegen → link → bundle → runtime.
ALLOWED = {
    "compiler.graph": set(),
    "compiler.frontend": {"compiler.graph"},
    "compiler.passes": {"compiler.graph"},
    "compiler.te": set(),
    "compiler.compute": {"compiler.graph", "compiler.te"},
    "compiler.schedules": {"compiler.te", "compiler.compute"},
    "compiler.tir": {"compiler.te"},
    "compiler.codegen": {"compiler.tir", "compiler.te"},
    "compiler.link": set(),
    "compiler.memory_plan": set(),
    # a bundle's dtypes are the graph's (graph/ir.ITEMSIZE), not a second table
    "compiler.bundle": {"compiler.graph"},
    # a runtime loads what link.py made: a threaded wasm module's per-thread stack size is the linker's
    "compiler.runtime": {"compiler.bundle", "compiler.link"},
    # example models: ONNX only; the real architectures reach the compiler through an exported file's path
    "compiler.zoo": set(),
    "compiler.real_zoo": set(),
    "compiler.data": set(),
}
# Drivers see every stage of compiler/ (the package itself is the public API: compiler/__init__.py).
DRIVERS = {
    "compiler.__init__",
    "compiler.__main__",
    "compiler.build",
    "compiler.backends",
    "compiler.cli",
    "compiler.torch_export",
    "compiler.tune",
    "server",
}
# The one import of server/ from compiler/: the serve command's, inside its functions.
SERVER_IMPORTERS = {"compiler.cli"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 2 else parts)


def _resolve(name: str) -> str:
    """`from compiler import te` names the module compiler.te; `from compiler import compile_model` the package."""
    path = ROOT / Path(*name.split("."))
    if path.is_dir() or path.with_suffix(".py").is_file():
        return name
    parent = name.rsplit(".", 1)[0]
    return "compiler.__init__" if parent == "compiler" else parent


def _imports(module: str, source: str, is_package: bool) -> list[tuple[str, bool]]:
    """(imported module, at module level) for every import of compiler/ or server/ in `module`'s source."""
    tree = ast.parse(source)
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = [part for part in module.split(".") if part != "__init__"]
                package = parts[: len(parts) - node.level + is_package]
                base = ".".join([*package, *([base] if base else [])])
            names = [_resolve(f"{base}.{alias.name}") for alias in node.names]
        else:
            continue
        found += [(name, id(node) in top_level) for name in names if name.split(".")[0] in ("compiler", "server")]
    return found


def _stage(name: str, stages) -> str | None:
    """The longest entry of `stages` that `name` is or lies inside."""
    matches = [stage for stage in stages if name == stage or name.startswith(stage + ".")]
    return max(matches, key=len) if matches else None


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Every import of `module` (its source given) that breaks the rules, in words."""
    found = []
    for imported, top_level in _imports(module, source, is_package):
        if imported.split(".")[0] == "server":
            if not module.startswith("server") and (module not in SERVER_IMPORTERS or top_level):
                found.append(f"{module} imports {imported}: compiler/ imports server/ only in the serve command")
            continue
        if _stage(imported, BASE) or (_stage(module, DRIVERS) and not _stage(module, BASE)):
            continue
        own, target = _stage(module, [*ALLOWED, *BASE]), _stage(imported, [*ALLOWED, *BASE, *DRIVERS])
        allowed = ALLOWED.get(own, set())
        if own != target and target not in allowed:
            found.append(f"{module} imports {imported}: {own} may import only {sorted(allowed) or 'base modules'}")
    return found


MODULES = sorted(
    path for folder in ("compiler", "server") for path in (ROOT / folder).rglob("*.py") if "pages" not in path.parts
)


def test_every_module_has_a_place():
    for path in MODULES:
        name = _module_name(path)
        assert _stage(name, [*ALLOWED, *DRIVERS, *BASE]), f"{name} is neither a stage, a driver nor a base module"


@pytest.mark.parametrize("path", MODULES, ids=[_module_name(path) for path in MODULES])
def test_imports_follow_the_pipeline(path):
    assert violations(_module_name(path), path.read_text(), path.name == "__init__.py") == []


@pytest.mark.parametrize(
    "module, source",
    [
        ("compiler.te.tensor", "from compiler.graph.ir import Graph"),
        ("compiler.graph.ir", "def f():\n    from compiler.passes import fuse_ops"),
        ("compiler.tir.lower", "import compiler.codegen.llvm"),
        ("compiler.codegen.wgsl", "from compiler.runtime.webgpu import WebGPUModel"),
        ("compiler.codegen.llvm", "from compiler import build"),
        ("compiler.runtime.native", "from ..build import Module"),
        ("compiler.build", "from server.app import create_app"),
        ("compiler.cli", "from server.app import add_arguments"),
    ],
)
def test_a_backwards_import_is_caught(module, source):
    assert violations(module, source)


def test_allowed_imports_pass():
    assert violations("compiler.cli", "def serve():\n    from server.app import run_from_args") == []
    assert (
        violations("compiler.tir.lower", "from compiler.te.expr import Var\nfrom compiler.target import Target") == []
    )
    assert violations("compiler.build", "from compiler.codegen.llvm import compile_funcs") == []


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "argv", [["--help"], ["compile", "--help"], ["compile", "model.onnx", "--target", "llvm"]], ids=str
)
def test_compile_never_loads_the_server(argv):
    code = (
        "import sys\nfrom compiler.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in ('starlette', 'server', 'uvicorn')))"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_serve_still_has_its_arguments():
    done = subprocess.run(
        [sys.executable, "-m", "compiler.cli", "serve", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "--port" in done.stdout and "--store" in done.stdout
