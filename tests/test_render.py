"""Renderer tests: Proxmox files pass Proxmox's rules (gputopo.pvefmt), the TP flag, overrides."""

from __future__ import annotations

import pytest

from gputopo.errors import ConfigError
from gputopo.plan import WriteHostFile, WriteServiceDropin, plan
from gputopo.pvefmt import parse_pci_cfg, validate_lxc_conf, validate_pci_cfg
from gputopo.render import (
    parse_tp,
    render,
    render_dropin,
    render_pci_cfg,
    set_tp,
)
from test_plan import SEED_SPEC, seed_current, seed_facts, seed_spec


@pytest.mark.parametrize(
    "command, flag, want",
    [
        ("python3 -m sglang.launch_server --tp 8 --port 30000", "--tp", "python3 -m sglang.launch_server --tp 4 --port 30000"),
        ("python3 -m sglang.launch_server --tp=8", "--tp", "python3 -m sglang.launch_server --tp=4"),
        ("vllm serve m --tensor-parallel-size 8 --max-model-len 8192", "--tensor-parallel-size",
         "vllm serve m --tensor-parallel-size 4 --max-model-len 8192"),
        ("vllm serve m", "--tensor-parallel-size", "vllm serve m --tensor-parallel-size 4"),
        ("python3 -m sglang.launch_server --tp-size 2", "--tp", "python3 -m sglang.launch_server --tp-size 4"),
        # --tpx is another flag: not touched, the TP flag is appended
        ("serve --tpx 8", "--tp", "serve --tpx 8 --tp 4"),
    ],
)
def test_set_tp(command, flag, want):
    assert set_tp(command, flag, 4) == want
    assert parse_tp(want) == 4


def test_parse_tp_absent_or_bad():
    assert parse_tp("serve --port 8") is None
    assert parse_tp("serve --tp auto") is None


def test_dropin_p2p_only_when_sev_snp_translating():
    on = render_dropin("serve --tp 8", "--tp", 4, True)
    off = render_dropin("serve --tp 8", "--tp", 4, False)
    assert on.splitlines()[1:5] == ["[Service]", "ExecStart=", "ExecStart=serve --tp 4",
                                    "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID"]
    assert "Environment=NCCL_P2P_DISABLE=1" in on and "NCCL_P2P_DISABLE" not in off
    i = on.splitlines().index("Environment=NCCL_P2P_DISABLE=1")
    assert on.splitlines()[i - 1].startswith("# SEV-SNP")


def test_seed_render_files_are_valid_proxmox():
    facts = seed_facts()
    p = plan(facts, seed_spec(), seed_current())
    files = render(p, seed_spec(), facts)
    assert sorted(files) == [
        "ct/101/etc/systemd/system/sglang.service.d/gputopo.conf",
        "etc/modules-load.d/gputopo-vfio.conf",
        "etc/udev/rules.d/90-gputopo-vfio.rules",
        "pve/lxc/101.devices.conf",
        "pve/mapping/pci.cfg",
    ]
    conf = files["pve/lxc/101.devices.conf"]
    assert validate_lxc_conf(conf) == []
    assert not any(line.startswith("#") for line in conf.splitlines())
    assert conf.splitlines()[:4] == ["dev0: /dev/nvidia0,mode=0666", "dev1: /dev/nvidia1,mode=0666",
                                     "dev2: /dev/nvidia3,mode=0666", "dev3: /dev/nvidia2,mode=0666"]
    cfg = files["pve/mapping/pci.cfg"]
    assert validate_pci_cfg(cfg) == []
    sections = {m.id: m for m in parse_pci_cfg(cfg)}
    assert len(sections["pro6000-vm"].maps) == 4 and len(sections["pro6000"].maps) == 4
    assert cfg.startswith("pro6000\n\tmap id=10de:2bb5,")
    assert "\n\npro6000-vm\n\tmap " in cfg


def test_plan_contents_come_from_render():
    facts = seed_facts()
    p = plan(facts, seed_spec(), seed_current())
    files = render(p, seed_spec(), facts)
    for a in p.actions:
        if isinstance(a, WriteHostFile):
            assert files[a.path] == a.content
        if isinstance(a, WriteServiceDropin):
            assert files[f"ct/{a.vmid}{a.path}"] == a.content


def test_udev_rules_per_address_never_ids():
    facts = seed_facts()
    files = render(plan(facts, seed_spec(), seed_current()), seed_spec(), facts)
    rules = files["etc/udev/rules.d/90-gputopo-vfio.rules"]
    assert "ids=" not in rules and "new_id" not in rules
    assert 'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="0000:81:00.0", ATTR{driver_override}="vfio-pci"' in rules
    assert "0000:01:00.0" not in rules  # a container GPU of the same model
    assert files["etc/modules-load.d/gputopo-vfio.conf"].split("\n")[1:4] == ["vfio", "vfio_iommu_type1", "vfio_pci"]


def test_legacy_devices_file_is_valid():
    text = SEED_SPEC.replace("mapping: pro6000\n", "mapping: pro6000\n        device_mode: legacy\n")
    facts = seed_facts()
    p = plan(facts, seed_spec(text), seed_current())
    conf = render(p, seed_spec(text), facts)["pve/lxc/101.devices.conf"]
    assert validate_lxc_conf(conf) == []
    lines = conf.splitlines()
    assert lines[0] == "lxc.cgroup2.devices.allow: c 195:* rwm"
    assert "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file" in lines
    assert not any(l.startswith("dev") for l in lines)


def test_pci_cfg_sorted_keys_and_sections():
    text = render_pci_cfg([
        {"id": "zeta", "map": ["id=10de:2bb5,node=pve1,path=0000:81:00.0"], "description": "z"},
        {"id": "alpha", "map": ["id=10de:2bb5,node=pve1,path=0000:01:00.0", "id=10de:2bb5,node=pve1,path=0000:11:00.0"]},
    ])
    assert text == ("alpha\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n\tmap id=10de:2bb5,node=pve1,path=0000:11:00.0\n"
                    "\nzeta\n\tmap id=10de:2bb5,node=pve1,path=0000:81:00.0\n\tdescription z\n")
    assert validate_pci_cfg(text) == []


def test_template_override_by_name(tmp_path):
    (tmp_path / "modules-vfio.conf.j2").write_text("{% for m in modules %}{{ m }} # custom\n{% endfor %}")
    facts = seed_facts()
    p = plan(facts, seed_spec(), seed_current(), templates=str(tmp_path))
    files = render(p, seed_spec(), facts, str(tmp_path))
    assert files["etc/modules-load.d/gputopo-vfio.conf"] == "vfio # custom\nvfio_iommu_type1 # custom\nvfio_pci # custom\n"
    # the other templates still come from the built-ins
    assert files["etc/udev/rules.d/90-gputopo-vfio.rules"].startswith("# Managed by gputopo")
    assert any(isinstance(a, WriteHostFile) and a.content.endswith("vfio_pci # custom\n") for a in p.actions)


def test_strict_undefined_in_user_template(tmp_path):
    (tmp_path / "modules-vfio.conf.j2").write_text("{{ nonexistent }}\n")
    facts = seed_facts()
    with pytest.raises(ConfigError) as e:
        plan(facts, seed_spec(), seed_current(), templates=str(tmp_path))
    assert "modules-vfio.conf.j2" in str(e.value) and "\n" not in str(e.value)
