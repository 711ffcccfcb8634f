"""The layer rule of docs/ARCHITECTURE.md: imports point down only."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "gputopo"

BASE = {"model", "errors", "ports", "resources"}
PURE = {"spec", "plan", "render", "diff", "pvefmt", "nvsmi"}
EDGE = {"discover", "snapshot", "bind", "proxmox", "exec", "hostfiles", "fixtures", "current"}
ORCH = {"apply", "journal", "verify", "demo"}
RANK = {**{m: 0 for m in BASE}, **{m: 1 for m in PURE}, **{m: 2 for m in EDGE}, **{m: 3 for m in ORCH}}
# Within the pure layer a module may use the ones before it: spec -> render -> plan -> diff.
# Within a layer, a fixed order keeps imports acyclic: a module may import those ranked below it.
RANK.update({"spec": 1.1, "render": 1.2, "plan": 1.3, "diff": 1.4})
RANK.update({"journal": 3.0, "verify": 3.1, "apply": 3.2, "demo": 3.3})


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gputopo"):
            found.add(node.module)
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gputopo"))
    return found


def _layer_of(module: str) -> tuple[str, int | None]:
    parts = module.split(".")
    if len(parts) < 2:
        return module, None
    if parts[1] in ("cli", "sim"):
        return parts[1], 99 if parts[1] == "cli" else 50
    return parts[1], RANK.get(parts[1])


def test_every_module_has_a_layer():
    for path in PKG.glob("*.py"):
        if path.stem in ("__init__", "__main__"):
            continue
        assert path.stem in RANK, f"{path.name} is not placed in a layer (tests/test_layers.py)"


def test_imports_point_down():
    bad = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        me = ".".join(rel.parts)
        _, my_rank = _layer_of(me)
        if my_rank is None:
            continue
        for imp in _imports(path):
            name, rank = _layer_of(imp)
            if rank is None or name == rel.parts[1]:
                continue
            if name == "cli" and my_rank != 99:
                bad.append(f"{me} imports {imp}")
            elif my_rank == 50:
                continue  # sim may use everything but cli
            elif rank >= my_rank and not (my_rank == 0 and name == "errors"):
                bad.append(f"{me} imports {imp}")
    assert not bad, "imports that point up or sideways:\n" + "\n".join(bad)
