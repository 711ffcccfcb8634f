"""Renderer tests: Proxmox files pass Proxmox's rules (gputopo.formats.lxcrules, gputopo.formats.pcicfg), the TP flag, overrides."""

from __future__ import annotations

import pytest

from gputopo.actions import WriteHostFile, WriteServiceDropin
from gputopo.errors import ConfigError
from gputopo.formats.lxcrules import validate_lxc_conf
from gputopo.formats.pcicfg import parse_pci_cfg, validate_pci_cfg
from gputopo.formats.systemctl import parse_tp, set_tp
from gputopo.plan.planner import plan
from gputopo.plan.render import (
    render,
    render_dropin,
    render_pci_cfg,
)
from helpers.hosts import SEED_SPEC, seed_current, seed_facts, seed_spec


@pytest.mark.parametrize(
    "command, flag, want",
    [
        (
            "python3 -m sglang.launch_server --tp 8 --port 30000",
            "--tp",
            "python3 -m sglang.launch_server --tp 4 --port 30000",
        ),
        ("python3 -m sglang.launch_server --tp=8", "--tp", "python3 -m sglang.launch_server --tp=4"),
        (
            "vllm serve m --tensor-parallel-size 8 --max-model-len 8192",
            "--tensor-parallel-size",
            "vllm serve m --tensor-parallel-size 4 --max-model-len 8192",
        ),
        ("vllm serve m", "--tensor-parallel-size", "vllm serve m --tensor-parallel-size 4"),
        (
            "python3 -m sglang.launch_server --tp-size 2",
            "--tp",
            "python3 -m sglang.launch_server --tp-size 4",
        ),
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
    assert on.splitlines()[1:5] == [
        "[Service]",
        "ExecStart=",
        "ExecStart=serve --tp 4",
        "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID",
    ]
    assert "Environment=NCCL_P2P_DISABLE=1" in on and "NCCL_P2P_DISABLE" not in off
    i = on.splitlines().index("Environment=NCCL_P2P_DISABLE=1")
    assert on.splitlines()[i - 1].startswith("# SEV-SNP")


def test_seed_render_files_are_valid_proxmox():
    facts = seed_facts()
    p = plan(facts, seed_spec(), seed_current())
    files = render(p, seed_spec(), facts)
    assert sorted(files) == [
        "ct/101/etc/systemd/system/sglang.service.d/gputopo.conf",
        "etc/modprobe.d/gputopo-vfio.conf",
        "etc/modules-load.d/gputopo-vfio.conf",
        "etc/udev/rules.d/90-gputopo-vfio.rules",
        "pve/lxc/101.devices.conf",
        "pve/mapping/pci.cfg",
    ]
    conf = files["pve/lxc/101.devices.conf"]
    assert validate_lxc_conf(conf) == []
    assert not any(line.startswith("#") for line in conf.splitlines())
    assert conf.splitlines()[:4] == [
        "dev0: /dev/nvidia0,mode=0666",
        "dev1: /dev/nvidia1,mode=0666",
        "dev2: /dev/nvidia3,mode=0666",
        "dev3: /dev/nvidia2,mode=0666",
    ]
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
    assert (
        'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="0000:81:00.0", ATTR{driver_override}="vfio-pci"' in rules
    )
    assert "0000:01:00.0" not in rules  # a container GPU of the same model
    assert files["etc/modules-load.d/gputopo-vfio.conf"].split("\n")[1:4] == [
        "vfio",
        "vfio_iommu_type1",
        "vfio_pci",
    ]


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
    text = render_pci_cfg(
        [
            {"id": "zeta", "map": ["id=10de:2bb5,node=pve1,path=0000:81:00.0"], "description": "z"},
            {
                "id": "alpha",
                "map": [
                    "id=10de:2bb5,node=pve1,path=0000:01:00.0",
                    "id=10de:2bb5,node=pve1,path=0000:11:00.0",
                ],
            },
        ]
    )
    assert text == (
        "alpha\n\tmap id=10de:2bb5,node=pve1,path=0000:01:00.0\n\tmap id=10de:2bb5,node=pve1,path=0000:11:00.0\n"
        "\nzeta\n\tmap id=10de:2bb5,node=pve1,path=0000:81:00.0\n\tdescription z\n\n"
    )
    assert validate_pci_cfg(text) == []


def test_template_override_by_name(tmp_path):
    (tmp_path / "modules-vfio.conf.j2").write_text("{% for m in modules %}{{ m }} # custom\n{% endfor %}")
    facts = seed_facts()
    p = plan(facts, seed_spec(), seed_current(), templates=str(tmp_path))
    files = render(p, seed_spec(), facts, str(tmp_path))
    assert (
        files["etc/modules-load.d/gputopo-vfio.conf"]
        == "vfio # custom\nvfio_iommu_type1 # custom\nvfio_pci # custom\n"
    )
    # the other templates still come from the built-ins
    assert files["etc/udev/rules.d/90-gputopo-vfio.rules"].startswith("# Managed by gputopo")
    assert any(isinstance(a, WriteHostFile) and a.content.endswith("vfio_pci # custom\n") for a in p.actions)


def test_strict_undefined_in_user_template(tmp_path):
    (tmp_path / "modules-vfio.conf.j2").write_text("{{ nonexistent }}\n")
    facts = seed_facts()
    with pytest.raises(ConfigError) as e:
        plan(facts, seed_spec(), seed_current(), templates=str(tmp_path))
    assert "modules-vfio.conf.j2" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "command, flag, want",
    [
        (
            "python3 -m sglang.launch_server --model-path /m --tp 8",
            "--tp",
            "python3 -m sglang.launch_server --model-path /m --tp 2",
        ),
        (
            "python3 -m sglang.launch_server --model-path /m --tp=8",
            "--tp",
            "python3 -m sglang.launch_server --model-path /m --tp=2",
        ),
        (
            "vllm serve /m --tensor-parallel-size 8",
            "--tensor-parallel-size",
            "vllm serve /m --tensor-parallel-size 2",
        ),
        (
            "vllm serve /m --tensor-parallel-size=8",
            "--tensor-parallel-size",
            "vllm serve /m --tensor-parallel-size=2",
        ),
    ],
)
def test_dropin_for_sglang_and_vllm(command, flag, want):
    text = render_dropin(command, flag, 2, False)
    assert text == (
        "# Managed by gputopo: tensor parallelism follows the container's 2 GPU(s).\n"
        f"[Service]\nExecStart=\nExecStart={want}\nEnvironment=CUDA_DEVICE_ORDER=PCI_BUS_ID\n"
    )


def test_dropin_escapes_percent_for_systemd():
    # systemctl show prints the command with specifiers resolved: a literal % must be written %%
    text = render_dropin("serve --tp 8 --chat-template '%s'", "--tp", 4, False)
    assert "ExecStart=serve --tp 4 --chat-template '%%s'\n" in text


def test_pci_cfg_template_writes_what_proxmox_writes():
    from gputopo.formats.pcicfg import PciMapping, write_pci_cfg

    facts = seed_facts()
    p = plan(facts, seed_spec(), seed_current())
    text = render(p, seed_spec(), facts)["pve/mapping/pci.cfg"]
    mappings = sorted({**p.kept_mappings, **p.mappings}.items())
    assert text == write_pci_cfg(
        [PciMapping(id=mid, maps=m.map, description=m.description) for mid, m in mappings]
    )


# Each rule of docs proxmox.md broken in a rendered file: the validator must catch it.
BREAK_LXC = [
    (lambda t: "# generated by gputopo\n" + t, "'#' line"),
    (lambda t: t.replace("mode=0666", "mode=666", 1), "mode"),
    (lambda t: t.replace("dev0: /dev/nvidia0", "dev0: nvidia0", 1), "not a valid device path"),
    (lambda t: t.replace("dev0:", "dev256:", 1), "dev256"),
    (lambda t: t.replace("dev0:", "gpu0:", 1), "unknown setting 'gpu0'"),
]
BREAK_PCI = [
    (lambda t: t.replace("pro6000-vm\n", "pci: pro6000-vm\n", 1), "bare id"),
    (lambda t: t.replace("\tmap ", "    map ", 1), "tab"),
    (lambda t: t.replace("id=10de:2bb5", "id=10de:2bbg", 1), "id:"),
    (lambda t: t.replace("path=0000:", "path=", 1), "path:"),
    (lambda t: t.replace("\n\npro6000-vm", "\npro6000-vm", 1), "no blank line"),
    (lambda t: "# managed\n" + t, "dropped"),
]


@pytest.mark.parametrize("breaker, needle", BREAK_LXC)
def test_rendered_devices_conf_broken_is_rejected(breaker, needle):
    facts = seed_facts()
    good = render(plan(facts, seed_spec(), seed_current()), seed_spec(), facts)["pve/lxc/101.devices.conf"]
    assert validate_lxc_conf(good, allow_description=False) == []
    bad = breaker(good)
    assert bad != good
    assert any(needle in p for p in validate_lxc_conf(bad, allow_description=False))


@pytest.mark.parametrize("breaker, needle", BREAK_PCI)
def test_rendered_pci_cfg_broken_is_rejected(breaker, needle):
    facts = seed_facts()
    good = render(plan(facts, seed_spec(), seed_current()), seed_spec(), facts)["pve/mapping/pci.cfg"]
    bad = breaker(good)
    assert bad != good
    assert any(needle in p for p in validate_pci_cfg(bad))


def test_legacy_form_has_every_node_and_no_description_lines():
    text = SEED_SPEC.replace(
        "mapping: pro6000\n",
        "mapping: pro6000\n        device_mode: legacy\n"
        "        legacy_majors: {nvidia-uvm: 508, nvidia-caps: 236}\n",
    )
    facts = seed_facts()
    conf = render(plan(facts, seed_spec(text), seed_current()), seed_spec(text), facts)[
        "pve/lxc/101.devices.conf"
    ]
    assert validate_lxc_conf(conf, allow_description=False) == []
    lines = conf.splitlines()
    assert lines[:3] == [
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow: c 508:* rwm",
        "lxc.cgroup2.devices.allow: c 236:* rwm",
    ]
    mounted = [ln.split()[1] for ln in lines if ln.startswith("lxc.mount.entry:")]
    assert mounted == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidia3",
        "/dev/nvidia2",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    ]


def test_user_template_breaking_proxmox_rules_is_refused(tmp_path):
    (tmp_path / "pci.cfg.j2").write_text(
        "{% for s in sections %}pci: {{ s.id }}\n"
        "{% for e in s.map %}\tmap {{ e }}\n{% endfor %}\n{% endfor %}"
    )
    facts = seed_facts()
    p = plan(facts, seed_spec(), seed_current(), templates=str(tmp_path))
    with pytest.raises(ConfigError) as e:
        render(p, seed_spec(), facts, str(tmp_path))
    assert str(e.value) == (
        "pve/mapping/pci.cfg (from template pci.cfg.j2) breaks Proxmox's rules: "
        "line 1: section header is the bare id, not 'pci: pro6000'"
    )


def test_cli_render_templates_overrides_one(materialized, tmp_path, capsys):
    from helpers.cli import run_cli

    tpl = tmp_path / "tpl"
    tpl.mkdir()
    (tpl / "service-dropin.conf.j2").write_text(
        "[Service]\nExecStart=\nExecStart={{ command }}\nEnvironment=OMP_NUM_THREADS=8\n"
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        SEED_SPEC.replace(
            'tp_flag: "--tp"}', 'tp_flag: "--tp", command: "python3 -m sglang.launch_server --tp 8"}'
        )
    )
    out = tmp_path / "out"
    code, stdout, err = run_cli(
        [
            "render",
            "--spec",
            str(spec),
            "--root",
            str(materialized("seed")),
            "--pve-root",
            str(tmp_path / "pve"),
            "--templates",
            str(tpl),
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    dropin = (out / "ct/101/etc/systemd/system/sglang.service.d/gputopo.conf").read_text()
    assert (
        dropin
        == "[Service]\nExecStart=\nExecStart=python3 -m sglang.launch_server --tp 4\nEnvironment=OMP_NUM_THREADS=8\n"
    )
    # the others still come from the built-in templates
    assert (out / "etc/udev/rules.d/90-gputopo-vfio.rules").read_text().startswith("# Managed by gputopo")
    assert validate_pci_cfg((out / "pve/mapping/pci.cfg").read_text()) == []
    # every file render wrote, and its manifest of them
    assert sorted(stdout.split()) == sorted(
        str(q) for q in out.rglob("*") if q.is_file() and q.name != ".gputopo-render.json"
    )
    assert (out / ".gputopo-render.json").is_file()


def test_modprobe_hook_pins_only_the_vm_gpus_before_nvidia_loads():
    """The udev rule alone races a GPU add event that loads nvidia; the modprobe hook does not."""
    facts = seed_facts()
    p = plan(facts, seed_spec(), seed_current())
    text = render(p, seed_spec(), facts)["etc/modprobe.d/gputopo-vfio.conf"]
    lines = [l for l in text.splitlines() if l and not l.startswith("#")]
    # one install command and no softdep: kmod ignores an install command beside a softdep
    (install,) = lines
    assert install.startswith("install nvidia ") and install.endswith(
        "/sbin/modprobe --ignore-install nvidia $CMDLINE_OPTS"
    )
    pinned = install.split(" in ", 1)[1].split(";", 1)[0].split()
    assert pinned == sorted(p.vfio_addresses())
    # vfio-pci is loaded and the pinned GPUs probed before nvidia loads
    assert (
        install.index("/sbin/modprobe vfio-pci")
        < install.index("drivers_probe")
        < install.index("--ignore-install")
    )
    assert "0000:01:00.0" not in install  # a container GPU is never pinned
    assert "ids=" not in text and "new_id" not in text
