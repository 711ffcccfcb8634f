"""The command line keeps GPUs in place: a spec changed from a container's addresses to
``count`` plans nothing when the set it has is as close as any (the DGX-2 host, switches)."""

from __future__ import annotations

from helpers.cli import run

CONF = """arch: amd64
hostname: infer
ostype: debian
dev0: /dev/nvidia10,mode=0666
dev1: /dev/nvidia11,mode=0666
dev2: /dev/nvidiactl,mode=0666
dev3: /dev/nvidia-uvm,mode=0666
dev4: /dev/nvidia-uvm-tools,mode=0666
dev5: /dev/nvidia-modeset,mode=0666
dev6: /dev/nvidia-caps/nvidia-cap1,mode=0666
dev7: /dev/nvidia-caps/nvidia-cap2,mode=0666
"""

SPEC = """apiVersion: gputopo/v1
kind: GpuTopology
nodes:
  - name: dgx2
    containers:
      - vmid: 101
        gpus: {SELECTOR}
"""


def test_addresses_to_count_plans_no_changes(materialized, tmp_path, capsys):
    root = materialized("dgx2")
    pve = tmp_path / "pve"
    (pve / "nodes" / "dgx2" / "lxc").mkdir(parents=True)
    # the container holds 0000:bc:00.0 and 0000:be:00.0 (minors 10 and 11), a PIX pair
    (pve / "nodes" / "dgx2" / "lxc" / "101.conf").write_text(CONF)
    before, after = tmp_path / "before.yaml", tmp_path / "after.yaml"
    before.write_text(SPEC.replace("{SELECTOR}", '{addresses: ["0000:bc:00.0", "0000:be:00.0"]}'))
    after.write_text(SPEC.replace("{SELECTOR}", "{count: 2}"))
    for spec in (before, after):
        code, out, err = run(capsys, "plan", "--root", str(root), "--pve-root", str(pve), "--spec", str(spec))
        assert code == 0, err
        assert out.rstrip().endswith("No changes"), out
        assert "container:101: 0000:bc:00.0, be: PIX under switch 0000:ba:00.0; keeps 2 of 2 in place" in out


def test_split_auto_is_the_numa_split_on_the_seed_host(materialized, tmp_path, capsys):
    root = materialized("seed")
    pve = tmp_path / "pve"
    (pve / "nodes" / "pve1" / "lxc").mkdir(parents=True)
    (pve / "nodes" / "pve1" / "lxc" / "101.conf").write_text("arch: amd64\nhostname: infer\n")
    outs = {}
    for split in ("numa", "auto"):
        code, out, err = run(capsys, "plan", "--root", str(root), "--pve-root", str(pve), "--split", split)
        assert code == 0, err
        outs[split] = out
    assert outs["auto"] == outs["numa"]
    assert (
        "container:101: 0000:01:00.0, 11, 61, 71: NODE on NUMA node 0; keeps 0 of 4 in place" in outs["auto"]
    )
    for split in ("numa", "auto"):
        code, out, err = run(capsys, "init", "--root", str(root), "--split", split)
        assert code == 0, err
        outs[split] = out
    assert outs["auto"] == outs["numa"]
