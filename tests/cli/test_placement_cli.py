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


def test_plan_svg_colours_each_group_and_says_why(materialized, tmp_path, capsys):
    import xml.etree.ElementTree as ET

    root = materialized("dgx2")
    pve = tmp_path / "pve"
    (pve / "nodes" / "dgx2" / "lxc").mkdir(parents=True)
    (pve / "nodes" / "dgx2" / "lxc" / "101.conf").write_text(CONF)
    spec = tmp_path / "s.yaml"
    spec.write_text(
        SPEC.replace("{SELECTOR}", "{count: 2}")
        + "    vms:\n      mappings:\n        - {name: v100-vm, gpus: {count: 4}}\n"
    )
    svg = tmp_path / "plan.svg"
    code, out, err = run(
        capsys, "plan", "--root", str(root), "--pve-root", str(pve), "--spec", str(spec), "--svg", str(svg)
    )
    assert code == 0, err
    ns = "{http://www.w3.org/2000/svg}"
    doc = ET.parse(svg).getroot()
    groups = {g.get("data-owner"): g for g in doc.iter(f"{ns}g") if g.get("class") == "group"}
    assert set(groups) == {"container:101", "vm:v100-vm"}
    for owner, g in groups.items():
        text = " ".join(t.text or "" for t in g.iter(f"{ns}text"))  # wrapped at spaces
        assert text in [
            line.strip()[2:] for line in out.splitlines() if line.strip().startswith(f"- {owner}: ")
        ]
        fill = g.find(f"{ns}rect").get("fill")
        # the same colours as the owner's GPUs in the picture after the plan
        after = [p for p in doc.iter(f"{ns}g") if p.get("data-side") == "after"][0]
        boxes = [b for b in after.iter(f"{ns}g") if b.get("class") == "gpu" and b.get("data-owner") == owner]
        assert boxes and {b.find(f"{ns}rect").get("fill") for b in boxes} == {fill}
    assert "PIX under switch 0000:ba:00.0" in " ".join(groups["container:101"].itertext())


def test_the_spec_schema_and_init_name_locality(materialized, capsys):
    import json

    code, out, _ = run(capsys, "schema", "spec")
    assert code == 0
    policy = json.loads(out)["$defs"]["Policy"]["properties"]["locality"]
    assert policy["enum"] == ["prefer", "strict"] and policy["default"] == "prefer"
    code, out, err = run(capsys, "init", "--root", str(materialized("seed")), "--split", "auto")
    assert code == 0, err
    assert "\n  locality: prefer\n" in out
