"""A GPU back on nvidia gets the lowest free minor, not the one it had (open-gpu-kernel-modules
``kernel-open/nvidia/nv.c`` ``nv_linux_assign_minor_locked``): a saved ``devN`` line then names
whichever GPU holds that minor now. Two containers share the seed host's GPUs across NUMA nodes
(CT 101: 01, 11, 81, 91; CT 102: 61, 71, e1, f1, where e1 has minor 7 and f1 minor 6); a change
sends the four NUMA-1 GPUs to a VM mapping and fails, and the rollback must give each container
its own GPUs again, judged by what each container's nvidia-smi lists. verify names a ``devN``
that reaches another container's GPU."""

from __future__ import annotations

from typing import Any

import pytest

from gputopo.actions import StepContext, UpdateContainer
from gputopo.actions.container import ContainerBefore
from gputopo.errors import ApplyFailed
from gputopo.formats.nvsmi import normalize_bus_id, parse_query_gpu
from gputopo.plan.spec import parse_spec
from gputopo.sim import state
from gputopo.sim.container import Container, SimExec, break_container, write_unit
from gputopo.sim.files import PMXCFS_MODE
from gputopo.sim.host import SERVICE_COMMANDS, SimHost
from gputopo.sim.kernel import SimKernel
from gputopo.sim.kernel.nvidia import parse_minor
from gputopo.usecases.apply import apply
from gputopo.usecases.verify import verify
from helpers import applysim
from helpers.applysim import host, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # applies on a simulated host, seconds each

T = applysim.FAST_TIMEOUTS
CT101 = ["0000:01:00.0", "0000:11:00.0", "0000:81:00.0", "0000:91:00.0"]
CT102 = ["0000:61:00.0", "0000:71:00.0", "0000:e1:00.0", "0000:f1:00.0"]

SPEC = """\
apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: pve1
    containers:
      - vmid: 101
        gpus: {addresses: [A101]}
        service: {unit: sglang.service, tp_flag: "--tp"}
      - vmid: 102
        gpus: {addresses: [A102]}
        service: {unit: vllm.service, tp_flag: "--tensor-parallel-size"}
VMS
policy:
  container_restart: always
  allow_cross_numa: true
"""
VMS = """\
    vms:
      mappings:
        - name: pro6000-vm
          gpus: rest
"""


def _spec(ct101: list[str], ct102: list[str], vms: bool = False):
    text = SPEC.replace("A101", ", ".join(f'"{a}"' for a in ct101))
    text = text.replace("A102", ", ".join(f'"{a}"' for a in ct102))
    return parse_spec(text.replace("VMS\n", VMS if vms else ""))


def _add_container(h: SimHost, vmid: int) -> None:
    """A second container with the control nodes, no GPU and a vLLM unit."""
    conf = h.paths.lxc_conf(vmid)
    conf.write_text(
        "arch: amd64\ncores: 16\ndev0: /dev/nvidiactl,mode=0666\ndev1: /dev/nvidia-uvm,mode=0666\n"
        f"hostname: llm2\nmemory: 65536\nostype: ubuntu\nrootfs: local-lvm:vm-{vmid}-disk-0,size=100G\nswap: 0\n"
    )
    conf.chmod(PMXCFS_MODE)
    write_unit(
        h.dir,
        vmid,
        "vllm.service",
        "[Unit]\nDescription=vllm\n\n[Service]\nType=simple\nExecStart="
        + SERVICE_COMMANDS["vllm"].format(tp=1)
        + "\n\n[Install]\nWantedBy=multi-user.target\n",
        enable=False,
    )
    state.set_guest_status(h.paths.run, "lxc", vmid, "running")
    Container(h.dir, vmid).boot()


def _seen(h: SimHost, vmid: int) -> list[str]:
    """The GPUs nvidia-smi lists inside container ``vmid``, by address."""
    out = SimExec(h.dir).run(
        vmid, ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], timeout=5
    )
    return sorted(normalize_bus_id(r["pci.bus_id"]) for r in parse_query_gpu(out.stdout, ["pci.bus_id"]))


def _minor(h: SimHost, address: str) -> int | None:
    info = h.paths.root / f"proc/driver/nvidia/gpus/{address}/information"
    return parse_minor(info.read_text()) if info.exists() else None


@pytest.fixture
def shared(host):
    """The seed host with CT 101 and CT 102 each on two NUMA-0 and two NUMA-1 GPUs, serving."""
    _add_container(host, 102)
    assert apply(_spec(CT101, CT102), host.ports(), root=str(host.paths.root), timeouts=T).status == "applied"
    assert (_seen(host, 101), _seen(host, 102)) == (CT101, CT102)
    assert (_minor(host, "0000:e1:00.0"), _minor(host, "0000:f1:00.0")) == (7, 6)
    return host


def test_a_rollback_gives_each_container_its_own_gpus_back(shared):
    h = shared
    before = applysim.fingerprint(h)
    before_102 = applysim.fingerprint(h, vmid=102, unit="vllm.service")
    break_container(h.dir, 102, "service_fails", message="torch.OutOfMemoryError", tp=2)
    with pytest.raises(ApplyFailed) as e:
        apply(_spec(CT101[:2], CT102[:2], vms=True), h.ports(), root=str(h.paths.root), timeouts=T)
    assert e.value.rolled_back and e.value.exit_code == 1, str(e.value)
    # what runs: each container on its own four GPUs, its service as before
    assert (_seen(h, 101), _seen(h, 102)) == (CT101, CT102)
    # bound back in the order of their old minors, each NUMA-1 GPU has its own again
    assert {a: _minor(h, a) for a in CT101[2:] + CT102[2:]} == {
        "0000:81:00.0": 4,
        "0000:91:00.0": 5,
        "0000:e1:00.0": 7,
        "0000:f1:00.0": 6,
    }
    assert applysim.diff(before, applysim.fingerprint(h)) == []
    assert applysim.diff(before_102, applysim.fingerprint(h, vmid=102, unit="vllm.service")) == []


def _step_context(h: SimHost) -> StepContext:
    from gputopo.apply import Progress
    from gputopo.apply.stepcontext import step_context

    return step_context(h.ports(), str(h.paths.root), T, Progress())


def test_an_undo_restores_each_devn_by_its_gpus_address(shared):
    """The GPUs came back in another order (bus order: e1 gets 6, f1 gets 7): the undo of a
    container change writes each devN with the minor its GPU has now."""
    h = shared
    k = SimKernel(h.paths.root)
    cfg: dict[str, Any] = h.ports().proxmox.lxc_config(102)
    SimExec(h.dir).run(102, ["systemctl", "stop", "vllm.service"], timeout=5)  # it holds them
    for a in CT102[2:]:  # both GPUs of CT 102 leave nvidia and come back in bus order
        k.write("sys/bus/pci/drivers/nvidia/unbind", a)
    for a in CT102[2:]:
        k.write("sys/bus/pci/drivers/nvidia/bind", a)
    assert (_minor(h, "0000:e1:00.0"), _minor(h, "0000:f1:00.0")) == (6, 7)
    saved = {key: v for key, v in cfg.items() if key != "digest"}
    dev_e1 = next(key for key, v in saved.items() if str(v).startswith("/dev/nvidia7"))
    dev_f1 = next(key for key, v in saved.items() if str(v).startswith("/dev/nvidia6"))
    step = UpdateContainer(
        vmid=102, delete=[dev_e1, dev_f1], addresses={dev_e1: "0000:e1:00.0", dev_f1: "0000:f1:00.0"}
    )
    step.do(_step_context(h))
    assert dev_e1 not in h.ports().proxmox.lxc_config(102)
    step.undo(ContainerBefore(config=saved), _step_context(h))
    now = h.ports().proxmox.lxc_config(102)
    assert (now[dev_e1], now[dev_f1]) == ("/dev/nvidia6,mode=0666", "/dev/nvidia7,mode=0666")


def test_verify_fails_a_devn_that_reaches_another_containers_gpu(shared):
    h = shared
    spec = _spec(CT101, CT102)
    ports, root = h.ports(), str(h.paths.root)
    assert verify(spec, ports, root=root).check("container").status == "PASS"
    # the configs swap 81:00.0 (minor 4) and e1:00.0 (minor 7); the running containers still
    # see what they started with, so nvidia-smi inside shows nothing wrong yet
    for vmid, old, new in ((101, "/dev/nvidia4,", "/dev/nvidia7,"), (102, "/dev/nvidia7,", "/dev/nvidia4,")):
        conf = h.paths.lxc_conf(vmid)
        assert old in conf.read_text()
        conf.write_text(conf.read_text().replace(old, new))
    assert (_seen(h, 101), _seen(h, 102)) == (CT101, CT102)
    check = verify(spec, ports, root=root).check("container")
    assert check.status == "FAIL"
    lines = [p for p in check.summary.split("; ") if "reaches 0000:" in p]
    assert any(
        ln.startswith("CT 101: dev")
        and "/dev/nvidia7 reaches 0000:e1:00.0, not a GPU of CT 101 (0000:81:00.0 has no devN: set dev" in ln
        and "to /dev/nvidia4" in ln
        for ln in lines
    ), check.summary
    assert any(
        "/dev/nvidia4 reaches 0000:81:00.0, not a GPU of CT 102 (0000:e1:00.0 has no devN" in ln
        for ln in lines
    )
