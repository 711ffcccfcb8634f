"""Spec loading: strict, one SpecError line naming file, field path and what was expected."""

from __future__ import annotations

import json

import pytest

from gputopo.errors import SpecError
from gputopo.plan.spec import Spec, load_spec, parse_spec
from gputopo.plan.starter import init_spec, spec_from_split
from helpers.cli import run_cli
from helpers.hosts import SPLIT_SPEC as BASE
from helpers.hosts import gpu, host, seed_facts


def err(text: str) -> str:
    with pytest.raises(SpecError) as e:
        parse_spec(text, "s.yaml")
    msg = str(e.value)
    assert "\n" not in msg and e.value.exit_code == 2
    return msg


@pytest.mark.parametrize(
    "old, new, want",
    [
        (
            "gpus: {numa: [0]}",
            "gpus: {numa: [0]}\n        colour: red",
            "s.yaml: nodes[0].containers[0].colour: unknown key",
        ),
        (
            "numa: [0]",
            "numa: [zero]",
            "s.yaml: nodes[0].containers[0].gpus.numa[0]: Input should be a valid integer",
        ),
        (
            "{numa: [0]}",
            "{numa: [0], count: 2}",
            "s.yaml: nodes[0].containers[0].gpus: exactly one of numa, addresses, count expected (got numa, count)",
        ),
        (
            "gpus: {numa: [1]}",
            "gpus: all",
            "s.yaml: nodes[0].vms.mappings[0].gpus: 'rest' or a selector with numa, addresses or count expected (got 'all')",
        ),
        (
            "gpus: {numa: [1]}",
            "gpus: {numa: [1], foo: 1}",
            "s.yaml: nodes[0].vms.mappings[0].gpus.foo: unknown key",
        ),
        (
            "{numa: [0]}",
            "{addresses: ['zz:00.0']}",
            "s.yaml: nodes[0].containers[0].gpus.addresses: not a PCI address: 'zz:00.0'",
        ),
        (
            "gpus: {numa: [0]}",
            "gpus: {numa: [0]}\n        mode: '666'",
            "s.yaml: nodes[0].containers[0].mode: String should match",
        ),
        ("gputopo/v1", "gputopo/v2", "s.yaml: apiVersion: 'gputopo/v1' expected (got 'gputopo/v2')"),
        (
            "vmid: 101",
            "vmid: 5",
            "s.yaml: nodes[0].containers[0].vmid: Input should be greater than or equal to 100",
        ),
        (
            "    vms:",
            "      - vmid: 101\n        gpus: {count: 1}\n    vms:",
            "s.yaml: nodes[0].containers[1].vmid: container 101 is listed twice",
        ),
        (
            "name: pro6000-vm",
            "name: 9bad",
            "s.yaml: nodes[0].vms.mappings[0].name: String should match pattern",
        ),
        (
            "gpus: {numa: [0]}",
            "gpus: {numa: [0]}\n        service: {unit: sglang, tp_flag: 'tp 4'}",
            "s.yaml: nodes[0].containers[0].service.tp_flag: String should match pattern",
        ),
    ],
)
def test_errors_name_the_field(old, new, want):
    assert old in BASE
    assert err(BASE.replace(old, new)).startswith(want)


def test_yaml_syntax_error_has_line():
    assert err(BASE.replace("gpus: {numa: [0]}", "gpus: {numa: [0]")).startswith(
        "s.yaml: YAML syntax error at line 8, column 5:"
    )


def test_load_spec_missing_file(tmp_path):
    with pytest.raises(SpecError) as e:
        load_spec(tmp_path / "none.yaml")
    assert str(e.value).startswith(f"{tmp_path / 'none.yaml'}: cannot read")


def test_defaults_and_normalised_addresses():
    s = parse_spec(BASE.replace("{numa: [0]}", "{addresses: ['01:00.0', '00000000:11:00.0']}"))
    ct = s.nodes[0].containers[0]
    assert ct.gpus.addresses == ["0000:01:00.0", "0000:11:00.0"]
    assert (ct.device_mode, ct.mode, ct.gid) == ("devN", "0666", None)
    assert s.policy.keep_driver_override is True and s.policy.tp_check == "error"
    assert s.verify.memory_spread_pct == 5


def test_schema_forbids_extra_keys():
    schema = Spec.model_json_schema()
    assert schema["additionalProperties"] is False
    json.dumps(schema)


def test_init_spec_parses_and_splits_by_lowest_numa(tmp_path):
    text = init_spec(seed_facts(), container=105, vm_mapping="gpuvm")
    body = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    # every setting line is explained by a comment before it or on it
    assert text.count("#") >= 20
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    s = load_spec(path)
    node = s.nodes[0]
    assert node.name == "pve1" and node.containers[0].vmid == 105
    assert node.containers[0].gpus.numa == [0] and node.vms.mappings[0].gpus.numa == [1]
    assert node.containers[0].service.unit == "sglang.service"
    assert "# TP will be 4." in text and body


def test_split_needs_known_numa():
    facts = host([gpu("01", None, 0, 1), gpu("02", None, 1, 2)])
    with pytest.raises(SpecError) as e:
        spec_from_split(facts)
    assert "no GPU has a known NUMA node" in str(e.value)
    s = spec_from_split(facts, split="half")
    assert s.nodes[0].containers[0].gpus.addresses == ["0000:01:00.0"]
    assert s.nodes[0].vms.mappings[0].gpus.addresses == ["0000:02:00.0"]


@pytest.mark.parametrize(
    "majors, want",
    [
        ("{nvidia_uvm: 508}", "legacy_majors: keys nvidia-uvm and nvidia-caps expected (got nvidia_uvm)"),
        ("{nvidia-uvm: 0}", "legacy_majors: a char major 1..4095 expected for nvidia-uvm"),
    ],
)
def test_legacy_majors_strict(majors, want):
    text = BASE.replace("gpus: {numa: [0]}", f"gpus: {{numa: [0]}}\n        legacy_majors: {majors}")
    assert err(text).startswith(f"s.yaml: nodes[0].containers[0].{want}")


# --- through the command line ------------------------------------------------------------------


def _cli(args):
    from click.testing import CliRunner

    from gputopo.cli import cli

    return CliRunner().invoke(cli, args)


def test_cli_schema_spec_is_the_spec_schema():
    r = _cli(["schema", "spec"])
    assert r.exit_code == 0, r.output
    schema = json.loads(r.output)
    assert schema == Spec.model_json_schema()
    assert set(schema["required"]) == {"apiVersion", "kind", "nodes"}
    assert schema["properties"]["apiVersion"]["const"] == "gputopo/v1"


def _comment_before(lines: list[str], key: str) -> bool:
    """True when the line setting ``key`` has a comment on it or on the line before it."""
    for i, ln in enumerate(lines):
        if ln.lstrip().lstrip("- ").startswith(f"{key}:"):
            return "#" in ln or lines[i - 1].lstrip().startswith("#")
    raise AssertionError(f"{key} not set")


def test_cli_init_writes_a_commented_spec_that_loads(materialized, tmp_path):
    import yaml

    out = tmp_path / "spec.yaml"
    r = _cli(
        [
            "init",
            "--root",
            str(materialized("seed")),
            "--split",
            "numa",
            "--container",
            "101",
            "--vm-mapping",
            "pro6000-vm",
            "--container-mapping",
            "pro6000",
            "--service-unit",
            "sglang.service",
            "-o",
            str(out),
        ]
    )
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert isinstance(yaml.safe_load(text), dict)
    s = load_spec(out)
    node = s.nodes[0]
    assert node.name == "pve1"
    (ct,) = node.containers
    assert (ct.vmid, ct.mapping, ct.gpus.numa) == (101, "pro6000", [0])
    assert [(m.name, m.gpus.numa) for m in node.vms.mappings] == [("pro6000-vm", [1])]
    assert ct.service.unit == "sglang.service" and ct.service.tp_flag == "--tp"
    lines = text.splitlines()
    # the discovered GPUs by NUMA node head the file
    assert "#   NUMA 0: 0000:01:00.0, 0000:11:00.0, 0000:61:00.0, 0000:71:00.0" in lines
    for key in (
        "apiVersion",
        "name",
        "vmid",
        "gpus",
        "mapping",
        "device_mode",
        "mode",
        "service",
        "tp_flag",
        "keep_driver_override",
        "tp_check",
        "allow_cross_numa",
        "memory_spread_pct",
    ):
        assert _comment_before(lines, key), key


def test_cli_init_vllm_flag_and_stdout(materialized):
    r = _cli(
        [
            "init",
            "--root",
            str(materialized("seed")),
            "--service-unit",
            "vllm",
            "--tp-flag",
            "--tensor-parallel-size",
        ]
    )
    assert r.exit_code == 0, r.output
    svc = parse_spec(r.output).nodes[0].containers[0].service
    assert (svc.unit, svc.tp_flag) == ("vllm.service", "--tensor-parallel-size")


def test_cli_init_refuses_a_host_it_cannot_split(materialized, capsys):
    # numa-unknown has GPUs on NUMA 0 only (the others are unknown): nothing to split by NUMA
    code, out, err_text = run_cli(
        ["init", "--root", str(materialized("numa-unknown")), "--split", "numa"], capsys
    )
    assert (code, out) == (2, "")
    assert err_text == "gputopo: error: --split: numa: all GPUs are on NUMA node 0; use --split half\n"


@pytest.mark.parametrize(
    "option, value, field",
    [
        ("vm_mapping", "bad name", "nodes[0].vms.mappings[0].name"),
        ("container", 5, "nodes[0].containers[0].vmid"),
        ("tp_flag", "x", "nodes[0].containers[0].service.tp_flag"),
    ],
)
def test_init_spec_refuses_what_the_spec_would_refuse(option, value, field):
    # the starter must parse: a name the spec refuses is an error here, not a broken file later
    with pytest.raises(SpecError) as e:
        init_spec(seed_facts(), **{option: value})
    assert e.value.field == field and len(str(e.value).splitlines()) == 1


def test_a_memory_spread_over_100_percent_is_refused_naming_the_key(tmp_path):
    """A percentage over 100 is a mistake (500 for 5.00?): one line naming the key."""
    text = init_spec(seed_facts()).replace("memory_spread_pct: 5", "memory_spread_pct: {}")
    assert "memory_spread_pct: {}" in text
    path = tmp_path / "s.yaml"
    path.write_text(text.replace("{}", "500"))
    with pytest.raises(SpecError) as e:
        load_spec(str(path))
    assert (
        str(e.value)
        == f"{path}: verify.memory_spread_pct: Input should be less than or equal to 100 (got 500)"
    )
    path.write_text(text.replace("{}", "100"))
    assert load_spec(str(path)).verify.memory_spread_pct == 100
