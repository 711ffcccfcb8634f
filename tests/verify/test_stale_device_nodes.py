"""verify's ``container`` check flags a ``devN`` whose ``/dev/nvidiaN`` no GPU on nvidia has:
the node outlives its GPU's move to vfio-pci (the nvidia driver never made it, so its unbind
leaves it), Proxmox still passes it to the container, and it reaches no GPU."""

from __future__ import annotations

import pytest

from gputopo.usecases.apply import apply
from gputopo.usecases.verify import verify
from helpers import applysim
from helpers.applysim import host, template  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # an apply on a simulated host


def test_a_devn_left_on_the_node_of_a_gpu_now_on_vfio_fails_naming_both(host):
    spec = applysim.seed_spec(host)
    ports = host.ports()
    root = str(host.paths.root)
    assert apply(spec, ports, root=root).status == "applied"  # 0000:81:00.0 (minor 4) on vfio-pci
    assert (host.paths.root / "dev/nvidia4").exists()  # left behind by the unbind
    assert verify(spec, ports, root=root).check("container").status in ("PASS", "WARN")  # removals pending
    conf = host.paths.lxc_conf(101)
    conf.write_text(conf.read_text() + "dev12: /dev/nvidia4,mode=0666\n")
    check = verify(spec, ports, root=root).check("container")
    assert check.status == "FAIL"
    (line,) = [p for p in check.summary.split("; ") if "dev12" in p]
    assert line.startswith("CT 101: dev12 /dev/nvidia4 reaches no GPU (no GPU on nvidia has minor 4 while ")
    assert "0000:81:00.0 on vfio-pci" in line and line.endswith("remove dev12 or bind its GPU back to nvidia")
