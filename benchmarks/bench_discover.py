"""Time gputopo's start-up against its references, each pair in the same run:

* ``gputopo --version`` and ``gputopo --help`` against ``python3 -c pass`` (target 1.2x);
* ``gputopo discover --json`` against ``lspci -D -nn -vmm`` on the same built host root: the
  ``seed`` host (target 1.5x) and the ``large`` one, 2,000+ PCI functions (target 1.0x).

gputopo runs as an installed node runs it: its modules byte-compiled (the package's postinst
does that), started by a launcher like the packaged one (``import sys; from gputopo.cli import
main; sys.exit(main())``) with the same interpreter as the reference. That interpreter is a
fresh virtual environment's (``python -m venv --without-pip``, made from the one running this),
started without the caller's ``PYTHON*`` variables: a user's venv or the node package's runs no
site ``.pth`` file, whereas a system's or a developer's interpreter may import ``typing`` or
``pathlib`` from one before gputopo starts, and hide what gputopo's own imports cost. The
launcher finds gputopo where this script imported it from. Both tools name devices from the
same ``pci.ids``: the system's database is copied into each root, since lspci reads the
system's and discovery reads the root's. The roots are built on tmpfs when there is one. Where
the running interpreter's directory holds pip's ``gputopo`` script (a venv or pipx install), its
``--version`` is shown too, without a target: that script imports ``re`` before gputopo.

Each round runs every command once, in turn, so that load on the machine falls on a command and
its reference alike; the ratio of each round is gputopo's time over its reference's. Printed:
the median wall time of each, the median ratio of wall times and its spread over the rounds
(min..max), and the ratio of the median CPU times (user + system of the child). The targets are
on the CPU ratio: it is what gputopo costs, and other load on the machine moves it least.

    python benchmarks/bench_discover.py [--runs N] [--only TEXT]

``--only version`` times the pairs whose name contains ``version`` (the start-up check), and so
on. Exits 1 when a CPU ratio misses its target.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gputopo
from gputopo.sim.hostroot import materialize

LAUNCHER = "import sys\nsys.path.insert(0, {where!r})\nfrom gputopo.cli import main\nsys.exit(main())\n"
SYSTEM_PCI_IDS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")


# The children's environment: the caller's, less what would change how Python starts.
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def run(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run of ``argv``, output discarded.
    Raises CalledProcessError when it fails."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=CLEAN_ENV)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    err = p.stderr.read() if p.stderr else b""
    if status:
        raise subprocess.CalledProcessError(os.waitstatus_to_exitcode(status), argv, stderr=err)
    return wall, usage.ru_utime + usage.ru_stime


def build_root(name: str, tmp: Path) -> Path:
    """The fixture host ``name`` built under ``tmp``, with the system's pci.ids when there is one."""
    root = materialize(name, tmp / name)
    system = next((p for p in SYSTEM_PCI_IDS if os.path.isfile(p)), None)
    if system is not None:
        dest = root / "usr/share/misc/pci.ids"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(system, dest)
    return root


def fresh_venv(tmp: Path) -> str:
    """The interpreter of a new virtual environment under ``tmp``, without pip: nothing in its
    site-packages, so no ``.pth`` file imports anything before the command runs."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True)
    return str(tmp / "venv" / "bin" / "python")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21, help="rounds (default 21)")
    ap.add_argument("--only", default="", help="time only the pairs whose name contains this")
    args = ap.parse_args(argv)
    lspci = shutil.which("lspci")
    # Byte-compiled as an install leaves it (PYTHONDONTWRITEBYTECODE would otherwise make every
    # run compile every module it imports).
    compileall.compile_dir(os.path.dirname(gputopo.__file__), quiet=1)
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="gputopo-bench-", dir=base) as tmp_s:
        tmp = Path(tmp_s)
        python = fresh_venv(tmp)
        launcher = tmp / "gputopo"
        launcher.write_text(LAUNCHER.format(where=os.path.dirname(os.path.dirname(gputopo.__file__))))
        gputopo_cmd = [python, str(launcher)]
        # (name, command, reference name, reference, target ratio; 0: shown only)
        pairs: list[tuple[str, list[str], str, list[str], float]] = [
            (
                "gputopo --version",
                [*gputopo_cmd, "--version"],
                "python3 -c pass",
                [python, "-c", "pass"],
                1.2,
            ),
            ("gputopo --help", [*gputopo_cmd, "--help"], "python3 -c pass", [python, "-c", "pass"], 1.2),
        ]
        functions = {}
        for host, target in (("seed", 1.5), ("large", 1.0)):
            if args.only not in f"discover --json {host}":
                continue
            root = build_root(host, tmp)
            functions[host] = len(os.listdir(root / "sys/bus/pci/devices"))
            if lspci is None:
                print(f"no lspci: discover on {host} not compared", file=sys.stderr)
                continue
            pairs.append(
                (
                    f"discover --json {host}",
                    [*gputopo_cmd, "discover", "--json", "--root", str(root)],
                    f"lspci -D -nn -vmm {host}",
                    [lspci, "-D", "-nn", "-vmm", "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci"],
                    target,
                )
            )
        script = Path(sys.executable).parent / "gputopo"
        if script.is_file():
            # pip's console script imports re before gputopo: shown, not a target
            pairs.insert(
                1,
                (
                    "pip's gputopo --version",
                    [str(script), "--version"],
                    "its python3 -c pass",
                    [sys.executable, "-c", "pass"],
                    0.0,
                ),
            )
        pairs = [p for p in pairs if args.only in p[0]]
        for _, ours, _, theirs, _ in pairs:  # each works, and the file cache is warm
            run(ours), run(theirs)

        results: dict[str, list[tuple[tuple[float, float], tuple[float, float]]]] = {p[0]: [] for p in pairs}
        for _ in range(args.runs):
            for name, ours, _, theirs, _ in pairs:
                results[name].append((run(ours), run(theirs)))

    print(
        f"{len(pairs)} pairs, {args.runs} rounds; seed {functions.get('seed')} PCI functions, "
        f"large {functions.get('large')}; Python {sys.version.split()[0]}"
    )
    print(
        f"{'gputopo':26} {'median':>8}  {'reference':26} {'median':>8}  {'ratio':>5} {'(min..max)':>12}"
        f"  {'cpu':>5}  target"
    )
    ok = True
    for name, _, ref_name, _, target in pairs:
        rounds = results[name]
        ratios = sorted(o[0] / r[0] for o, r in rounds)
        cpu = statistics.median(o[1] for o, _ in rounds) / statistics.median(r[1] for _, r in rounds)
        ratio = statistics.median(ratios)
        met = cpu <= target
        ok = ok and (met or not target)
        verdict = f"{target:g}x {'met' if met else 'MISSED'}" if target else "(shown only)"
        print(
            f"{name:26} {statistics.median(o[0] for o, _ in rounds) * 1000:6.1f}ms  {ref_name:26} "
            f"{statistics.median(r[0] for _, r in rounds) * 1000:6.1f}ms  {ratio:5.2f} "
            f"({ratios[0]:4.2f}..{ratios[-1]:4.2f})  {cpu:5.2f}  {verdict}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
