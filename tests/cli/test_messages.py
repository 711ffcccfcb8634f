"""Messages an operator reads at 3 a.m.: one line, the culprit first, the known fix when there is
one, and none of the slips seen: a failed step naming another GPU than its own, ``CT 101: CT
101:``, the verify summary twice, "expected driver its native driver", secrets masked inside
ordinary words. After boot persistence changed, apply says what to run, or runs it."""

from __future__ import annotations

import json

import pytest

from gputopo.adapters.credentials import Credentials
from gputopo.errors import ApplyFailed, BindError, ExecError
from gputopo.ports import ExecResult
from gputopo.sim import state
from gputopo.sim.kernel import SimKernel
from helpers.applysim import copy_host, seed_spec, seed_spec_text, template  # noqa: F401 (fixtures)
from helpers.cli import one_line, run

pytestmark = pytest.mark.slow  # every test applies on a simulated host (seconds each); the full run only


@pytest.fixture
def sim(template, tmp_path):
    return copy_host(template, tmp_path / "sim")


def test_a_secret_is_masked_only_where_it_stands_whole():
    c = Credentials("root@pam", password="on")
    assert c.scrub("connection refused on pve1: password on") == "connection refused *** pve1: password ***"
    t = Credentials("root@pam!gputopo", token_name="gputopo", token_secret="3f2a-9c")
    assert (
        t.scrub("Authorization: PVEAPIToken=root@pam!gputopo=3f2a-9c failed; 3f2a-9cX")
        == "Authorization: PVEAPIToken=root@pam!gputopo=*** failed; 3f2a-9cX"
    )
    assert Credentials("u", password="p@ss!").scrub("bad p@ss! here, xp@ss!") == "bad *** here, xp@ss!"
    # a long secret is no part of a word: masked wherever it appears
    assert Credentials("u", password="Sup3rS3cret").scrub("x=xSup3rS3cretx") == "x=x***x"


def test_a_device_no_native_driver_claims_is_named_plainly(tmp_path, materialized, monkeypatch):
    from gputopo.adapters.sysfs import Binder

    b = Binder(SimKernel(str(materialized("seed"))))
    monkeypatch.setattr(b, "driver_of", lambda address: None)
    with pytest.raises(BindError) as e:
        b._check("0000:01:00.0", None, native=True)
    assert str(e.value) == "0000:01:00.0: expected its native driver, found none: no native driver claimed it"
    with pytest.raises(BindError) as e:
        b._check("0000:99:00.0", None, native=True)
    assert str(e.value) == "0000:99:00.0: expected its native driver, found none: device is gone from the bus"
    assert (
        str(BindError("0000:01:00.0", "vfio-pci", "nvidia"))
        == "0000:01:00.0: expected driver vfio-pci, found nvidia"
    )


def test_parallel_steps_failing_together_name_the_step_whose_error_is_shown(sim):
    k = SimKernel(str(sim.paths.root))
    # the first rebind fails at once, the last one later: the last failure journaled is not the one raised
    k.inject("0000:81:00.0", "unbind", "errno", err=5)
    k.configure(address_latency={"0000:f1:00.0": {"unbind": 50.0}})
    k.inject("0000:f1:00.0", "bind", "errno", err=19)
    ports = sim.ports()
    try:
        with pytest.raises(ApplyFailed) as e:
            from gputopo.usecases.apply import apply

            apply(seed_spec(sim), ports, root=sim.paths.root)
    finally:
        ports.close()
    text = str(e.value)
    assert text.startswith(
        "apply failed at step 7 (rebind 0000:81:00.0: nvidia -> vfio-pci (override kept)): "
    )
    # the error shown is 81's (what the rollback left, f1's undo included, follows it)
    cause = text.split("): ", 1)[1].split("; NOT fully rolled back")[0].split("; rolled back")[0]
    assert "0000:81:00.0" in cause and "0000:f1:00.0" not in cause


class _HungSmi:
    """An ExecPort whose nvidia-smi never answers (pct exec times out)."""

    def __init__(self, inner):
        self.inner = inner

    def run(self, vmid, argv, timeout, input=None) -> ExecResult:
        if argv[0] == "nvidia-smi":
            raise ExecError(vmid, list(argv), None)
        return self.inner.run(vmid, argv, timeout, input)

    def push(self, *a, **k):
        return self.inner.push(*a, **k)


def test_a_container_is_named_once_in_a_check(sim):
    from gputopo.usecases.verify import verify

    ports = sim.ports()
    ports.exec = _HungSmi(ports.exec)
    try:
        report = verify(seed_spec(sim), ports, root=str(sim.paths.root))
    finally:
        ports.close()
    summary = report.check("container").summary
    # the spec is not applied: the devN check names CT 101's other GPUs first, each line once
    assert "; CT 101: nvidia-smi " in summary and summary.endswith("timed out"), summary
    assert all("CT 101: CT 101" not in c.summary for c in report.checks)


def test_the_verify_summary_is_printed_once(capsys, sim, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(seed_spec_text(sim))  # not applied: the checks fail
    code, out, err = run(capsys, "verify", "--sim", str(sim.dir), "--spec", str(spec))
    assert code == 1
    summary = [ln for ln in out.splitlines() if ln.startswith("verification failed: ")]
    assert len(summary) == 1 and summary[0] not in err and "gputopo: error" not in err


def test_an_untrusted_certificate_says_how_to_trust_it(capsys, sim, tmp_path, monkeypatch):
    spec = tmp_path / "s.yaml"
    spec.write_text(seed_spec_text(sim))
    sim.start()
    try:
        creds = sim.credentials()
        monkeypatch.setenv("GPUTOPO_PVE_PASSWORD", creds["password"])
        code, _, err = run(
            capsys,
            "plan",
            "--api-url",
            sim.api.url.split("/api2")[0],
            "--spec",
            str(spec),
            "--root",
            str(sim.paths.root),
        )
        assert code == 2
        line = one_line(err)
        assert line.startswith(f"gputopo: error: connect https://127.0.0.1:{sim.api.port}: ")
        assert line.endswith(
            "; pass --ca-bundle /etc/pve/pve-root-ca.pem (copied from the node) or --insecure"
        )
        # a refused login is exit 2 as well: nothing was changed, in every command
        monkeypatch.setenv("GPUTOPO_PVE_PASSWORD", "wrong")
        for argv in (["plan", "--spec", str(spec)], ["verify", "--spec", str(spec)]):
            code, _, err = run(
                capsys,
                *argv,
                "--api-url",
                sim.api.url.split("/api2")[0],
                "--root",
                str(sim.paths.root),
                "--ca-bundle",
                str(sim.api.ca_cert_path),
            )
            assert code == 2 and "authentication failure for root@pam" in one_line(err), argv
    finally:
        sim.stop()


def test_apply_says_what_the_next_boot_needs_or_runs_it(capsys, sim, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(seed_spec_text(sim))
    (sim.paths.root / "etc/kernel").mkdir(parents=True, exist_ok=True)
    (sim.paths.root / "etc/kernel/proxmox-boot-uuids").write_text("0000-0001\n")
    code, _, err = run(
        capsys, "apply", "--sim", str(sim.dir), "--spec", str(spec), "--yes", "--no-verify", "--dry-run"
    )
    assert code == 0 and "boot persistence" not in err
    code, _, err = run(capsys, "apply", "--sim", str(sim.dir), "--spec", str(spec), "--yes", "--no-verify")
    assert code == 0, err
    assert (
        "boot persistence changed: before the next reboot run: update-initramfs -u -k all && "
        "proxmox-boot-tool refresh (or apply with --refresh-boot)"
    ) in err
    assert state.read_state(sim.paths.run, "host-commands", []) == []  # said, not run


def test_apply_refresh_boot_runs_the_commands_through_the_host(capsys, sim, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(seed_spec_text(sim))
    code, out, err = run(
        capsys,
        "apply",
        "--sim",
        str(sim.dir),
        "--spec",
        str(spec),
        "--yes",
        "--no-verify",
        "--refresh-boot",
        "--json",
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["boot"] == {"commands": [["update-initramfs", "-u", "-k", "all"]], "ran": True}
    ran = [c["argv"] for c in state.read_state(sim.paths.run, "host-commands", [])]
    assert ran == [["update-initramfs", "-u", "-k", "all"]]  # no proxmox-boot-uuids: no boot tool
    initramfs = state.read_state(sim.paths.run, "initramfs", {})["files"]
    modprobe = "etc/modprobe.d/gputopo-vfio.conf"
    assert (
        initramfs[modprobe] == (sim.paths.root / modprobe).read_text() and "vfio-pci" in initramfs[modprobe]
    )
    assert "update-initramfs: Generating /boot/initrd.img-" in err
    # a second apply changes nothing: nothing is said or run
    code, _, err = run(
        capsys, "apply", "--sim", str(sim.dir), "--spec", str(spec), "--yes", "--no-verify", "--refresh-boot"
    )
    assert code == 0 and "boot" not in err and len(state.read_state(sim.paths.run, "host-commands", [])) == 1


def test_refresh_boot_needs_the_host_itself(tmp_path):
    from gputopo.apply.boot import refresh_boot
    from gputopo.errors import ConfigError
    from gputopo.ports import Ports

    with pytest.raises(ConfigError, match="--root is not /"):
        refresh_boot(Ports(sysfs=None, proxmox=None, exec=None, files=None, http=None))
