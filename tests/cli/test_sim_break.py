"""``gputopo sim break FAULT DIR`` / ``gputopo sim heal [FAULT] DIR`` on a simulated host: each
fault is put in from the command line, gputopo sees it (verify FAILs, apply rolls back or warns,
in the words that name it), it is healed, and gputopo sees the host healthy again. The specs
are docs/simulator.md's rehearsal (``split.yaml``, ``back.yaml``); what is judged is what runs (drivers,
the service's command line, guests) and the documents gputopo prints."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest

from gputopo.sim import state
from gputopo.sim.host import SimHost
from gputopo.sim.kernel import SimKernel
from helpers import TESTS
from helpers.applysim import SCALE, cleanup, copy_host, fast_tmp, fingerprint, running_service
from helpers.applysim import diff as fp_diff
from helpers.cli import one_line, run

pytestmark = pytest.mark.slow  # a simulated host per test, its API served for most commands

REHEARSAL = TESTS.parent / "docs" / "simulator.md"


def _readme_spec(name: str) -> str:
    m = re.search(rf"```yaml\n# {re.escape(name)}\n(.*?)```", REHEARSAL.read_text(), re.S)
    assert m, name
    return m[1]


@pytest.fixture(scope="module")
def templates():
    """A PVE 8 and a PVE 9 seed host, made once for the module."""
    base = Path(tempfile.mkdtemp(prefix="gputopo-break-", dir=fast_tmp()))
    for version in ("8.4.1", "9.1.2"):
        SimHost.create(base / version, pve_version=version)
        SimKernel(base / version / "root").configure(time_scale=SCALE)
    yield base
    cleanup(base)


def _host(templates: Path, tmp_path: Path, capsys, version: str = "8.4.1") -> tuple[SimHost, Path]:
    host = copy_host(templates / version, tmp_path / "sim")
    for name in ("split.yaml", "back.yaml"):
        (tmp_path / name).write_text(_readme_spec(name))
    return host, tmp_path


def _check(capsys, host: SimHost, spec: Path, name: str) -> dict:
    _, out, _ = run(capsys, "verify", "--sim", str(host.dir), "--spec", str(spec), "--json")
    return next(c for c in json.loads(out)["checks"] if c["name"] == name)


def _apply(capsys, host: SimHost, spec: Path) -> tuple[int, str, str]:
    return run(capsys, "apply", "--sim", str(host.dir), "--spec", str(spec), "--yes", "--no-verify")


def test_break_list_names_every_fault_with_what_gputopo_sees(capsys):
    code, out, _ = run(capsys, "sim", "break", "--list")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines() if not line.startswith(" ")]
    assert names == [
        "service-fails",
        "wrong-answer",
        "hung-endpoint",
        "gpu-missing",
        "hotplug-fails",
        "slow-shutdown",
        "node-unreachable",
    ]
    assert out.count("seen: ") == len(names)


def test_bad_input_is_one_line_and_breaks_nothing(capsys, templates, tmp_path):
    host, _ = _host(templates, tmp_path, capsys)
    before = fingerprint(host)
    for argv, words in (
        (["sim", "break", "melted", str(host.dir)], "melted: unknown fault (known: service-fails"),
        (["sim", "break", "node-unreachable", str(host.dir)], "only a cluster's node can be unreachable"),
        (
            ["sim", "break", "wrong-answer", "--node", "pve7", str(host.dir)],
            "--node pve7: the simulated host",
        ),
        (["sim", "break", "wrong-answer", "--seconds", "3", str(host.dir)], "--seconds is for hung-endpoint"),
        (
            ["sim", "break", "gpu-missing", "--address", "0000:09:00.0", str(host.dir)],
            "no PCI device 0000:09:00.0",
        ),
        (["sim", "heal", "melted", str(host.dir)], "melted: unknown fault"),
        (["sim", "break", "hotplug-fails", str(host.dir)], "Proxmox VE 8.4.1 does not hot-plug devN"),
        (["sim", "break", str(host.dir)], "usage: gputopo sim break FAULT [--node NODE] DIR"),
        (["sim", "break", "wrong-answer", str(tmp_path)], "not a simulated host"),
    ):
        code, _, err = run(capsys, *argv)
        assert code == 2, (argv, err)
        assert words in one_line(err), (argv, err)
    assert fp_diff(before, fingerprint(host)) == []
    code, out, _ = run(capsys, "sim", "heal", str(host.dir))
    assert (code, out.strip()) == (0, "nothing to heal")


def test_wrong_answer_fails_verify_and_heals(capsys, templates, tmp_path):
    host, d = _host(templates, tmp_path, capsys)
    assert _check(capsys, host, d / "back.yaml", "inference")["status"] == "PASS"
    code, out, _ = run(capsys, "sim", "break", "wrong-answer", str(host.dir))
    assert code == 0 and out.startswith("broke wrong-answer: CT 101")
    seen = _check(capsys, host, d / "back.yaml", "inference")
    assert seen["status"] == "FAIL" and "CT 101: wrong answer to 'What is 7 x 13?" in seen["summary"], seen
    code, out, _ = run(capsys, "sim", "heal", "wrong-answer", str(host.dir))
    assert (code, out.strip()) == (0, "healed: wrong-answer")
    assert _check(capsys, host, d / "back.yaml", "inference")["status"] == "PASS"


def test_a_hung_endpoint_fails_verify_after_its_timeout_and_heals(capsys, templates, tmp_path):
    host, d = _host(templates, tmp_path, capsys)
    spec = d / "back.yaml"
    spec.write_text(spec.read_text() + "verify: {timeout: 1}\n")
    assert run(capsys, "sim", "break", "hung-endpoint", str(host.dir))[0] == 0
    seen = _check(capsys, host, spec, "inference")
    assert seen["status"] == "FAIL" and "no answer within 1 s" in seen["summary"], seen
    assert run(capsys, "sim", "heal", str(host.dir))[2] == ""  # every fault: the one there
    assert _check(capsys, host, spec, "inference")["status"] == "PASS"


def test_a_gpu_off_the_bus_is_missed_then_a_rescan_brings_it_back(capsys, templates, tmp_path):
    host, d = _host(templates, tmp_path, capsys)
    before = fingerprint(host)
    code, out, _ = run(capsys, "sim", "break", "gpu-missing", "--address", "0000:91:00.0", str(host.dir))
    assert code == 0 and "0000:91:00.0 fell off the bus" in out
    assert not (host.paths.root / "sys/bus/pci/devices/0000:91:00.0").exists()
    _, out, _ = run(capsys, "discover", "--root", str(host.paths.root), "--json")
    assert len(json.loads(out)["gpus"]) == 7 and "0000:91:00.0" not in out
    code, out, err = run(capsys, "plan", "--sim", str(host.dir), "--spec", str(d / "split.yaml"))
    # named first, with its owner: not planned around (a mapping of NUMA 1's 3 GPUs left)
    assert code == 2 and err.strip().splitlines() == [
        "gputopo: error: refused: 0000:91:00.0: container 101's GPU (/dev/nvidia5, in mapping pro6000) "
        "left the bus: the host no longer has it; check the card and its slot, bring it back "
        "(echo 1 > /sys/bus/pci/rescan, or a reboot), then plan again"
    ], err
    assert run(capsys, "sim", "heal", "gpu-missing", str(host.dir))[1].strip() == "healed: gpu-missing"
    # back on nvidia, its driver_override unset: the host as it was
    assert fp_diff(before, fingerprint(host)) == []
    _, out, _ = run(capsys, "discover", "--root", str(host.paths.root), "--json")
    assert len(json.loads(out)["gpus"]) == 8
    _, out, _ = run(capsys, "plan", "--sim", str(host.dir), "--spec", str(d / "split.yaml"))
    assert "Mapping pro6000-vm: 4 device(s)" in out


def test_a_service_that_fails_to_start_needs_a_human_until_healed(capsys, templates, tmp_path):
    """It fails every start, the rollback's too: apply says so (exit 3) and names what to do;
    healed, recover starts the service as it was, and the apply goes through."""
    host, d = _host(templates, tmp_path, capsys)
    before = fingerprint(host)
    assert run(capsys, "sim", "break", "service-fails", str(host.dir))[0] == 0
    code, _, err = _apply(capsys, host, d / "split.yaml")
    assert code == 3, err
    assert (
        "start sglang.service" in err and "sglang.service is failed" in err and "NOT fully rolled back" in err
    )
    assert running_service(host.paths.root, 101, "sglang.service") == (None, [])
    assert run(capsys, "sim", "heal", "service-fails", str(host.dir))[0] == 0
    code, _, err = run(capsys, "recover", "--sim", str(host.dir))
    assert code == 0, err
    assert fp_diff(before, fingerprint(host)) == []  # the service runs with --tp 8 again
    code, _, err = _apply(capsys, host, d / "split.yaml")
    assert code == 0, err
    main, held = running_service(host.paths.root, 101, "sglang.service")
    assert main.endswith("--tp 4") and len(held) >= 4


def test_a_slow_vm_shutdown_times_out_the_apply_until_healed(capsys, templates, tmp_path):
    host, d = _host(templates, tmp_path, capsys)
    with state.locked(host.paths.run, "latencies"):  # one of Proxmox's seconds lasts 10 ms here
        state.write_state(host.paths.run, "latencies", {"second": 0.01})
    assert _apply(capsys, host, d / "split.yaml")[0] == 0
    assert run(capsys, "sim", "guest", "start", "201", "--sim", str(host.dir))[0] == 0
    before = fingerprint(host)
    code, out, _ = run(capsys, "sim", "break", "slow-shutdown", str(host.dir))
    assert code == 0 and "VM 201: its guest takes 600 s to shut down" in out
    code, _, err = _apply(capsys, host, d / "back.yaml")
    assert code == 1 and "VM quit/powerdown failed - got timeout" in err, err
    assert fp_diff(before, fingerprint(host)) == []  # VM 201 runs on its GPUs again
    assert run(capsys, "sim", "heal", "slow-shutdown", str(host.dir))[0] == 0
    code, _, err = _apply(capsys, host, d / "back.yaml")
    assert code == 0, err
    assert state.guest_status(host.paths.run, "qemu", 201) == "running"
    assert "hostpci" not in (host.paths.pve / "nodes/pve1/qemu-server/201.conf").read_text()


def test_a_failed_hot_plug_restarts_the_container_until_healed(capsys, templates, tmp_path):
    host, d = _host(templates, tmp_path, capsys, version="9.1.2")
    # the split restarts the container, so its devN are gone and the grow hot-plugs new ones
    (d / "split.yaml").write_text(_readme_spec("split.yaml") + "policy: {container_restart: always}\n")
    for spec in ("split.yaml", "back.yaml"):  # a grow that hot-plugs, the fault not set
        code, out, err = _apply(capsys, host, d / spec)
        assert code == 0 and "could not hot-plug" not in out + err, err
    assert _apply(capsys, host, d / "split.yaml")[0] == 0
    assert run(capsys, "sim", "break", "hotplug-fails", str(host.dir))[0] == 0
    code, out, err = _apply(capsys, host, d / "back.yaml")
    assert code == 0 and "Proxmox could not hot-plug dev4" in out + err, out + err
    assert "move_mount failed: Operation not permitted" in out + err
    assert run(capsys, "sim", "heal", "hotplug-fails", str(host.dir))[0] == 0
    assert _apply(capsys, host, d / "split.yaml")[0] == 0
    code, out, err = _apply(capsys, host, d / "back.yaml")
    assert code == 0 and "could not hot-plug" not in out + err, out + err
    main, held = running_service(host.paths.root, 101, "sglang.service")
    assert main.endswith("--tp 8") and len(held) >= 8
