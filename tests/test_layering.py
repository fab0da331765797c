"""The import rules (docs/architecture.md, "Import rules, enforced"), read from the source: every import of every module of compiler/ and server/
(function-level ones too, parsed with ast) must go one way down the pipeline. Each stage lists the stages it may
import; the drivers see every stage; nothing in compiler/ imports server/ but the CLI's serve command, lazily, and
`tessel compile` (or --help) never loads the server or Starlette."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Importable from every module: errors, targets and the compiler's version.
BASE = {"compiler.errors", "compiler.target", "compiler.version"}
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
    # `tessel quantize`: ONNX in, ONNX out by onnxruntime's tools, beside the pipeline; the frontend checks the file
    "compiler.quantize": {"compiler.frontend"},
    # the generate loop over a compiled decoder: named arrays in, tokens out, through the Module's run
    "compiler.generate": set(),
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


def _type_only(tree: ast.Module) -> set[int]:
    """The imports inside `if TYPE_CHECKING:` blocks, which never run."""
    return {
        id(child)
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for child in ast.walk(node)
    }


def _imports(module: str, source: str, is_package: bool, every: bool = False) -> list[tuple[str, bool]]:
    """(imported module, at module level) for every import of compiler/ or server/ in `module`'s source (`every`:
    third-party ones too), leaving out those only a type checker runs."""
    tree = ast.parse(source)
    top_level = {id(node) for node in tree.body}
    type_only = _type_only(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = [part for part in module.split(".") if part != "__init__"]
                package = parts[: len(parts) - node.level + is_package]
                base = ".".join([*package, *([base] if base else [])])
            names = [
                _resolve(f"{base}.{alias.name}") if base.split(".")[0] in ("compiler", "server") else base
                for alias in node.names
            ]
        else:
            continue
        found += [
            (name, id(node) in top_level) for name in names if every or name.split(".")[0] in ("compiler", "server")
        ]
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


# The function-level imports that must stay lazy, each with its reason; every other import is at module level.
# Third-party packages by their top-level name:
LAZY_PACKAGES = {
    "sklearn": "scikit-learn is a test extra: the digits data set loads only when the model is retrained",
    "torch": "the torch extra: only compile_torch and the real-architecture zoo export from torch",
    "torchvision": "the real extra: only the real-architecture zoo builds its models",
    "timm": "the real extra, as torchvision",
    "transformers": "the real extra, as torchvision",
    "cuda": "the cuda extra, and a driver, exist only on machines that run CUDA",
    "pyopencl": "the opencl extra, loaded only when an OpenCL bundle runs",
    "wgpu": "the webgpu extra, loaded only when a WebGPU bundle runs natively",
    "ray": "the ray extra: only a tuning session on a Ray cluster, or `tessel serve --ray` compiling on one",
    "xgboost": "the tune extra: only the learned cost model",
    "rich": "the tune extra: only the live tuning display",
    "matplotlib": "the tune extra: only the tuning report's plot",
    "onnxruntime": "the quantize extra: only `tessel quantize` (compiler/quantize.py) runs its quantizers",
    "wasmtime": "the binding's private call path (_ffi), used only where this wasmtime version has it",
}
# ...and imports of this project's own modules, by (importing module, imported package):
LAZY_MODULES = {("compiler.cli", "server"): "only `tessel serve` loads the server and Starlette"}


def lazy_violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Every function-level import of `module` that is not one of the lazy ones above, in words."""
    found = []
    for imported, top_level in _imports(module, source, is_package, every=True):
        package = imported.split(".")[0]
        if top_level or package in LAZY_PACKAGES or (module, package) in LAZY_MODULES:
            continue
        found.append(f"{module} imports {imported} inside a function: import it at module level")
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of compiler/ and server/ it imports, at module level or inside functions."""
    graph = {}
    for path in MODULES:
        name = _module_name(path)
        graph[name] = {imported for imported, _ in _imports(name, path.read_text(), path.name == "__init__.py")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: each strongly connected component of more than one module (or a module that
    imports itself), sorted (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_a_cycle_is_caught():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("path", MODULES, ids=[_module_name(path) for path in MODULES])
def test_function_level_imports_are_the_lazy_ones(path):
    assert lazy_violations(_module_name(path), path.read_text(), path.name == "__init__.py") == []


def test_a_needless_lazy_import_is_caught():
    assert lazy_violations("compiler.tune.report", "def f():\n    from compiler.tune.measure import flops")
    assert lazy_violations("compiler.target", "def f():\n    import llvmlite.binding as llvm")
    assert lazy_violations("compiler.tune.cost_model", "def f():\n    import xgboost") == []
    assert lazy_violations("compiler.cli", "def f():\n    from server.app import run_from_args") == []
    assert lazy_violations("compiler.x", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a") == []


# Where a target's text becomes a Target: the drivers (which take the user's text) and the bundle loader (which reads
# a manifest's), nowhere below them.
PARSERS = {"compiler.build", "compiler.cli", "compiler.torch_export", "compiler.tune", "compiler.target", "server"}


def _parses_target(source: str) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "parse"
        and getattr(node.func.value, "id", "") == "Target"
        for node in ast.walk(ast.parse(source))
    )


@pytest.mark.parametrize("path", MODULES, ids=[_module_name(path) for path in MODULES])
def test_only_drivers_parse_targets(path):
    name = _module_name(path)
    assert _stage(name, PARSERS) or not _parses_target(path.read_text()), (
        f"{name} parses a target: take a Target from the driver instead"
    )


def test_a_target_parsed_below_the_drivers_is_caught():
    assert _parses_target("def f(target):\n    target = Target.parse(target)")
    assert not _parses_target("def f(target: Target):\n    return target.kind")


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


# A module past this many lines holds more than one family of code: split it (docs/architecture.md, "Layout").
MAX_MODULE_LINES = 800


@pytest.mark.parametrize("path", MODULES, ids=[_module_name(path) for path in MODULES])
def test_modules_stay_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_module_name(path)} has {lines} lines; split it by family"
