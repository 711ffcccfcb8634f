"""Bad input through the real entry point (``gputopo.cli.main``): every expected error is ONE line
on stderr with a documented exit code (docs/exit-codes.md: 2 bad input, 1 a failure, 130
interrupted), no traceback, and an apply that is refused leaves the simulated host exactly as it was."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import click
import pytest

from gputopo.cli import COMMANDS, LazyGroup, main
from helpers.applysim import copy_host, fingerprint, seed_spec_text, template  # noqa: F401 (fixtures)
from helpers.cli import one_line, run


@pytest.fixture
def seed(materialized) -> Path:
    return materialized("seed")


@pytest.fixture
def spec_file(tmp_path, seed) -> Path:
    from gputopo.facts.discover import discover
    from gputopo.plan.starter import init_spec

    p = tmp_path / "spec.yaml"
    p.write_text(init_spec(discover(str(seed))))
    return p


@pytest.fixture
def sim(template, tmp_path):
    return copy_host(template, tmp_path / "sim")


# --- the command line itself -------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, command, culprit",
    [
        (["plan", "--bogus"], "gputopo plan", "--bogus"),
        (["render", "--spec", "x.yaml"], "gputopo render", "--out"),
        (["schema"], "gputopo schema", "'NAME'"),
        (["schema", "nope"], "gputopo schema", "'nope'"),
        (["sim", "create"], "gputopo sim create", "DIR"),
        (["discover", "extra"], "gputopo discover", "'extra'"),
        (["fixtures", "bogus"], "gputopo fixtures", "bogus"),
        (["recover", "--sim", "x", "foo"], "gputopo recover", "foo"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_command_and_the_culprit(capsys, argv, command, culprit):
    code, _, err = run(capsys, *argv)
    line = one_line(err)
    assert code == 2
    sub = command.removeprefix("gputopo").strip()
    assert line.startswith(f"gputopo: error: {sub}: ")
    assert culprit in line and line.endswith(f"(see '{command} --help')")


def test_gputopo_alone_lists_every_command(capsys):
    code, out, err = run(capsys)
    assert code == 0, err
    listed = out.split("Commands:", 1)[1]
    for name in COMMANDS:
        assert f"\n  {name} " in listed, name


def test_the_lazy_group_lists_only_commands_that_import(capsys, monkeypatch):
    import importlib

    real = importlib.import_module

    def fake(name, *a, **kw):
        if name == "gputopo.cli._needs_missing_dep":
            raise ModuleNotFoundError("No module named 'somedep'", name="somedep")
        return real(name, *a, **kw)

    monkeypatch.setattr(importlib, "import_module", fake)
    monkeypatch.setitem(COMMANDS, "broken", "_needs_missing_dep:broken")
    monkeypatch.setitem(COMMANDS, "absent", "_not_shipped:absent")
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert "broken" not in out and "absent" not in out and "discover" in out

    code, _, err = run(capsys, "broken")
    assert code == 1
    assert one_line(err) == "gputopo: error: command 'broken' is unavailable: No module named 'somedep'"
    code, _, err = run(capsys, "absent")
    assert code == 2 and "No such command 'absent'" in one_line(err)


def _command_raising(monkeypatch, exc: BaseException) -> None:
    @click.command()
    def boom():
        raise exc

    monkeypatch.setattr(LazyGroup, "get_command", lambda self, ctx, name: boom)


def test_ctrl_c_exits_130_with_one_line(capsys, monkeypatch):
    _command_raising(monkeypatch, KeyboardInterrupt())
    code, _, err = run(capsys, "boom")
    assert code == 130
    assert err.strip() == "gputopo: interrupted"


def test_an_eof_error_inside_a_command_is_not_a_declined_prompt(capsys, monkeypatch):
    # click reports any EOFError as Abort ("aborted", exit 1), which would hide a real bug
    _command_raising(monkeypatch, EOFError("stream ended"))
    with pytest.raises(EOFError):
        main(["boom"])


@pytest.mark.parametrize(
    "command, text",
    [
        ("apply", "Exit codes"),
        ("recover", "Exit codes"),
        ("verify", "Exit codes"),
        ("plan", "Exit codes"),
        ("diff", "Exit codes"),
        ("discover", "Exit codes"),
        ("render", "Exit codes"),
        ("init", "Exit codes"),
    ],
)
def test_help_states_the_exit_codes(capsys, command, text):
    code, out, _ = run(capsys, command, "--help")
    assert code == 0 and text in " ".join(out.split())


def test_init_options_all_have_help(capsys):
    code, out, _ = run(capsys, "init", "--help")
    assert code == 0
    for option in (
        "--root",
        "--split",
        "--container ",
        "--vm-mapping",
        "--container-mapping",
        "--node",
        "--service-unit",
        "--tp-flag",
    ):
        row = next(ln for ln in out.splitlines() if ln.strip().startswith(option.strip()))
        assert len(row.split()) > 2, row  # option, metavar, then words of help


# --- spec files ----------------------------------------------------------------------------------


def _variant(spec_file: Path, old: str, new: str, name: str) -> Path:
    text = spec_file.read_text()
    assert old in text, old
    p = spec_file.parent / name
    p.write_text(text.replace(old, new, 1))
    return p


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "missing.yaml: cannot read: No such file or directory"),
        ("", "bad.yaml: a mapping with apiVersion: gputopo/v1 and kind: GpuTopology expected"),
        ("- a\n- b\n", "bad.yaml: a mapping with apiVersion"),
        ("foo: [\n", "bad.yaml: YAML syntax error at line 2, column 1"),
        (
            "apiVersion: gputopo/v1\nkind: GpuTopology\nnodes:\n\t- name: x\n",
            "bad.yaml: YAML syntax error at line 4, column 1: found character '\\t'",
        ),
        (
            "apiVersion: gputopo/v2\nkind: GpuTopology\nnodes: []\n",
            "bad.yaml: apiVersion: 'gputopo/v1' expected (got 'gputopo/v2')",
        ),
    ],
)
def test_a_spec_file_that_is_not_a_spec(capsys, tmp_path, seed, content, expected):
    name = "missing.yaml" if content is None else "bad.yaml"
    if content is not None:
        (tmp_path / name).write_text(content)
    code, _, err = run(capsys, "plan", "--root", str(seed), "--spec", str(tmp_path / name))
    assert code == 2
    assert expected in one_line(err)


@pytest.mark.parametrize(
    "anchor, field",
    [
        ("policy:\n", "bogus"),
        ("    containers:\n", "nodes[0].bogus"),
        ("        device_mode: devN\n", "nodes[0].containers[0].bogus"),
        ("          unit: sglang.service\n", "nodes[0].containers[0].service.bogus"),
        ("          numa: [0]\n", "nodes[0].containers[0].gpus.bogus"),
        ("      guests: []\n", "nodes[0].vms.bogus"),
        ("  tp_check: error\n", "policy.bogus"),
        ("  timeout: 120\n", "verify.bogus"),
    ],
)
def test_an_unknown_key_names_its_path_at_every_level(capsys, seed, spec_file, anchor, field):
    indent = " " * (len(anchor) - len(anchor.lstrip()))
    if anchor == "policy:\n":
        bad = _variant(spec_file, anchor, "bogus: 1\npolicy:\n", "unknown.yaml")
    elif anchor.rstrip().endswith(":"):
        bad = _variant(spec_file, anchor, f"{indent}bogus: 1\n{anchor}", "unknown.yaml")
    else:
        bad = _variant(spec_file, anchor, f"{anchor}{indent}bogus: 1\n", "unknown.yaml")
    code, _, err = run(capsys, "plan", "--root", str(seed), "--spec", str(bad))
    assert code == 2
    assert one_line(err) == f"gputopo: error: {bad}: {field}: unknown key"


@pytest.mark.parametrize(
    "old, new, expected",
    [
        (
            "keep_driver_override: true",
            "keep_driver_override: maybe",
            "policy.keep_driver_override: Input should be a valid boolean",
        ),
        ("name: pro6000-vm", "name: 1abc", "nodes[0].vms.mappings[0].name: String should match pattern"),
        ("name: pro6000-vm", "name: a", "(got 'a')"),
        ("name: pro6000-vm", "name: has space", "(got 'has space')"),
        (
            'mode: "0666"',
            "mode: 0666",
            'nodes[0].containers[0].mode: a quoted mode such as "0666" expected '
            "(unquoted, YAML reads it as the number 438)",
        ),
        ("numa: [0]", 'addresses: ["0000:81:00"]', "gpus.addresses: not a PCI address: '0000:81:00'"),
    ],
)
def test_a_wrong_value_names_the_field_and_the_value(capsys, seed, spec_file, old, new, expected):
    bad = _variant(spec_file, old, new, "wrong.yaml")
    code, _, err = run(capsys, "plan", "--root", str(seed), "--spec", str(bad))
    assert code == 2
    assert expected in one_line(err)


@pytest.mark.parametrize("written", ["0000:01:00.0", "01:00.0", "00000000:01:00.0", "0000:01:00.0".upper()])
def test_an_address_unquoted_or_in_another_form_is_the_address(written):
    # YAML 1.1 reads an unquoted 0000:01:00.0 as the base-60 number 60.0
    from gputopo.plan.spec import parse_spec

    text = (
        "apiVersion: gputopo/v1\nkind: GpuTopology\nnodes:\n  - name: pve1\n    containers:\n"
        f"      - vmid: 101\n        gpus:\n          addresses: [{written}, 0000:11:00.0]\n"
    )
    spec = parse_spec(text)
    assert spec.nodes[0].containers[0].gpus.addresses == ["0000:01:00.0", "0000:11:00.0"]


def test_numbers_and_dates_still_load_as_yaml_says():
    import yaml

    from gputopo.plan.yamlspec import _SpecLoader

    assert yaml.load("[12, 1.5, 0x10, 1:30, '7']", Loader=_SpecLoader) == [12, 1.5, 16, "1:30", "7"]


def test_an_address_that_is_no_gpu_here_is_refused(capsys, seed, spec_file):
    bad = _variant(spec_file, "numa: [0]", 'addresses: ["0000:0A:00.0"]', "addr.yaml")
    code, _, err = run(capsys, "plan", "--root", str(seed), "--spec", str(bad))
    assert code == 2
    assert one_line(err) == "gputopo: error: refused: 0000:0a:00.0: no such GPU on this host (container:101)"


def test_duplicate_keys_are_refused_not_silently_merged(capsys, seed, spec_file):
    # PyYAML keeps the last of two equal keys: a second 'containers:' would drop the first unseen
    bad = _variant(spec_file, "    vms:\n", "    containers: []\n    vms:\n", "dup.yaml")
    code, _, err = run(capsys, "plan", "--root", str(seed), "--spec", str(bad))
    assert code == 2
    line = one_line(err)
    assert line.startswith(f"gputopo: error: {bad}: YAML syntax error at line ") and line.endswith(
        "duplicate key 'containers'"
    )


def test_a_spec_file_that_is_not_text(capsys, seed, tmp_path):
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"apiVersion: \xff\xfe\n")
    code, _, err = run(capsys, "plan", "--root", str(seed), "--spec", str(bad))
    assert code == 2
    assert one_line(err) == f"gputopo: error: {bad}: not UTF-8 text (byte 12)"


def test_a_numa_node_the_host_does_not_have_is_refused(capsys, seed, spec_file):
    # numa: [7] used to plan the container down to no GPU at all, without a word
    bad = _variant(spec_file, "numa: [0]", "numa: [7]", "numa7.yaml")
    code, _, err = run(capsys, "plan", "--root", str(seed), "--spec", str(bad))
    assert code == 2
    assert (
        one_line(err) == "gputopo: error: refused: container:101: this host has no NUMA node 7 (it has 0, 1)"
    )


# --- the node must be this host -------------------------------------------------------------------


@pytest.mark.slow
def test_a_spec_for_another_node_is_refused_and_apply_changes_nothing(capsys, sim):
    spec = sim.dir / "other.yaml"
    spec.write_text(seed_spec_text(sim).replace("name: pve1", "name: pve9"))
    before = fingerprint(sim)
    for argv in (
        ["plan", "--sim", str(sim.dir)],
        ["diff", "--sim", str(sim.dir)],
        ["verify", "--sim", str(sim.dir)],
        ["apply", "--sim", str(sim.dir), "--yes"],
    ):
        code, _, err = run(capsys, *argv, "--spec", str(spec))
        assert code == 2, (argv, err)
        assert (
            one_line(err)
            == "gputopo: error: spec: nodes[0].name: node 'pve9' is not this host, which is 'pve1'"
        )
    assert fingerprint(sim) == before


def test_quick_mode_and_init_name_the_node_option(capsys, seed, tmp_path):
    for argv in (["plan", "--split", "numa"], ["init", "-o", str(tmp_path / "s.yaml")]):
        code, _, err = run(capsys, *argv, "--root", str(seed), "--node", "pve9")
        assert code == 2
        assert one_line(err) == "gputopo: error: --node: node 'pve9' is not this host, which is 'pve1'"
    assert not (tmp_path / "s.yaml").exists()


def test_a_simulated_host_named_by_node_has_that_hostname(tmp_path):
    from gputopo.facts.discover import discover
    from gputopo.sim.host import SimHost

    host = SimHost.create(tmp_path / "h", node="pve7")
    assert host.node == "pve7"
    assert discover(str(host.paths.root)).host.hostname == "pve7"


@pytest.mark.slow
def test_a_container_that_does_not_exist_is_refused(capsys, sim):
    spec = sim.dir / "ct.yaml"
    spec.write_text(seed_spec_text(sim).replace("vmid: 101", "vmid: 555"))
    before = fingerprint(sim)
    code, _, err = run(capsys, "apply", "--sim", str(sim.dir), "--spec", str(spec), "--yes")
    assert code == 2
    assert "container 555 does not exist on node pve1" in one_line(err)
    assert fingerprint(sim) == before


@pytest.mark.slow
def test_plan_refuses_a_container_that_does_not_exist_as_apply_does(capsys, sim, tmp_path):
    """Through the API and from Proxmox's files alike: exit 2, one refusal line, no plan printed.
    A pve root that holds nothing for the node cannot tell, and the plan is still made there."""
    spec = sim.dir / "ct.yaml"
    spec.write_text(seed_spec_text(sim).replace("vmid: 101", "vmid: 555"))
    for source in (
        ["--sim", str(sim.dir)],
        ["--root", str(sim.paths.root), "--pve-root", str(sim.paths.pve)],
    ):
        code, out, err = run(capsys, "plan", *source, "--spec", str(spec))
        assert code == 2 and out == "", source
        assert one_line(err) == "gputopo: error: refused: container 555 does not exist on node pve1", source
    empty = tmp_path / "pve"
    empty.mkdir()
    code, out, err = run(
        capsys, "plan", "--root", str(sim.paths.root), "--pve-root", str(empty), "--spec", str(spec)
    )
    assert code == 0 and "CT 555: set dev0=" in out, err


@pytest.mark.slow
def test_init_for_a_container_that_does_not_exist_is_one_line_and_writes_nothing(capsys, sim, tmp_path):
    """Not pct's words (``systemctl list-units ... exited 255: Configuration file ...``) as a
    warning and a spec for a container that is not there: one line naming it, exit 2."""
    out_file = tmp_path / "spec.yaml"
    code, out, err = run(capsys, "init", "--sim", str(sim.dir), "--container", "999", "-o", str(out_file))
    assert (code, out) == (2, "")
    assert one_line(err) == (
        "gputopo: error: container 999 does not exist on node pve1 (containers there: 101); "
        "give its vmid with --container"
    )
    assert not out_file.exists()
    # quick mode says it once, as the plan's refusal, without pct's words before it
    code, out, err = run(capsys, "plan", "--sim", str(sim.dir), "--split", "numa", "--container", "999")
    assert code == 2 and "container 999 does not exist on node pve1" in one_line(err)


@pytest.mark.slow
def test_init_with_its_container_stopped_says_so_in_one_line(capsys, sim):
    assert run(capsys, "sim", "guest", "stop", "101", "--sim", str(sim.dir))[0] == 0
    code, out, err = run(capsys, "init", "--sim", str(sim.dir))
    assert code == 0 and "- vmid: 101" in out
    assert one_line(err) == (
        "gputopo: warning: container 101 is stopped: its inference unit cannot be looked for; "
        "the service is not managed and its model's fit is not checked"
    )


# --- init and quick mode: options the spec would refuse -------------------------------------------


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--container", "5", "--container: Input should be greater than or equal to 100 (got 5)"),
        ("--vm-mapping", "1abc", "--vm-mapping: String should match pattern"),
        ("--container-mapping", "has space", "--container-mapping: String should match pattern"),
        ("--tp-flag", "tp", "--tp-flag: String should match pattern"),
        ("--service-unit", "a/b", "--service-unit: a systemd unit name such as sglang.service expected"),
    ],
)
def test_init_refuses_an_option_the_spec_would_refuse(capsys, seed, tmp_path, option, value, expected):
    out = tmp_path / "s.yaml"
    # a flag matters only with a service to manage, in init as in quick mode
    service = ["--service-unit", "sglang.service"] if option == "--tp-flag" else []
    code, _, err = run(capsys, "init", "--root", str(seed), option, value, *service, "-o", str(out))
    assert code == 2
    assert one_line(err).startswith(f"gputopo: error: {expected}")
    assert not out.exists()
    code, _, err = run(
        capsys,
        "plan",
        "--root",
        str(seed),
        "--split",
        "numa",
        option,
        value,
        *(["--service-unit", "sglang.service"] if option == "--tp-flag" else []),
    )
    assert code == 2 and one_line(err).startswith(f"gputopo: error: {expected}")


def test_init_writes_a_spec_that_plans(capsys, seed, tmp_path):
    out = tmp_path / "deep" / "s.yaml"
    code, _, err = run(capsys, "init", "--root", str(seed), "-o", str(out))
    assert code == 0 and out.is_file(), err
    code, _, err = run(capsys, "plan", "--root", str(seed), "--spec", str(out))
    assert code == 0, err


def test_an_output_path_that_cannot_be_written(capsys, seed, spec_file, tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    code, _, err = run(capsys, "init", "--root", str(seed), "-o", str(blocker / "s.yaml"))
    assert code == 2
    assert one_line(err).startswith(f"gputopo: error: {blocker / 's.yaml'}: cannot write: ")
    code, _, err = run(
        capsys, "render", "--root", str(seed), "--spec", str(spec_file), "--out", str(blocker / "sub")
    )
    assert code == 2
    assert ": cannot write: Not a directory" in one_line(err)


# --- roots, snapshots, simulated hosts -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["file", "empty string", "empty dir", "absent"])
def test_a_root_that_is_not_a_sysfs_tree(capsys, tmp_path, kind):
    root = {
        "file": tmp_path / "f.txt",
        "empty string": "",
        "empty dir": tmp_path / "d",
        "absent": tmp_path / "no",
    }[kind]
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "d").mkdir()
    code, _, err = run(capsys, "discover", "--root", str(root))
    assert code == 2
    shown = "''" if kind == "empty string" else str(root)
    assert one_line(err) == f"gputopo: error: {shown}: not a sysfs root (no sys/bus/pci/devices)"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_snapshot_that_is_corrupt(capsys, seed, tmp_path, damage):
    good = tmp_path / "good.tar.gz"
    assert run(capsys, "snapshot", str(good), "--root", str(seed))[0] == 0
    data = good.read_bytes()
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(
        {"garbage": b"not a tarball\n", "truncated": data[: len(data) // 3], "empty": b""}[damage]
    )
    code, _, err = run(capsys, "discover", "--root", str(bad))
    assert code == 2
    assert one_line(err).startswith(f"gputopo: error: {bad}: cannot read snapshot: ")


def test_sim_on_a_directory_that_is_not_a_simulated_host(capsys, seed, spec_file):
    for argv in (
        ["plan", "--spec", str(spec_file)],
        ["verify", "--spec", str(spec_file)],
        ["recover"],
        ["apply", "--spec", str(spec_file), "--yes"],
    ):
        code, _, err = run(capsys, *argv, "--sim", str(seed))
        assert code == 2, argv
        assert one_line(err) == (
            f"gputopo: error: {seed}: not a simulated host (no run/host.json); "
            "create one with 'gputopo sim create'"
        )


def test_a_live_source_refuses_the_options_it_would_ignore(capsys, sim, seed, spec_file):
    for argv, expected in (
        (["--root", str(seed)], "--root and --sim exclude each other"),
        (["--pve-root", str(seed)], "--pve-root reads Proxmox's files"),
    ):
        for command in ("plan", "diff"):
            code, _, err = run(capsys, command, "--sim", str(sim.dir), "--spec", str(spec_file), *argv)
            assert code == 2, (command, argv, err)
            assert expected in one_line(err)


def test_sim_create_that_fails_leaves_nothing(capsys, tmp_path):
    (tmp_path / "bad.tar.gz").write_bytes(b"garbage")
    code, _, err = run(capsys, "sim", "create", str(tmp_path / "h"), "--from", str(tmp_path / "bad.tar.gz"))
    assert code == 2 and "cannot read snapshot" in one_line(err)
    assert not (tmp_path / "h").exists()
    (tmp_path / "e").mkdir()
    code, _, err = run(capsys, "sim", "create", str(tmp_path / "e"), "--from", "nofixture")
    assert code == 2 and "nofixture: no such host" in one_line(err)
    assert list((tmp_path / "e").iterdir()) == []


def test_sim_serve_on_a_port_in_use(capsys, tmp_path):
    from gputopo.errors import SimHostError
    from gputopo.sim.host import SimHost

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        host = SimHost.create(tmp_path / "h")
        with pytest.raises(SimHostError) as e:
            host.start(port=port)
        assert (
            str(e.value)
            == f"{tmp_path / 'h'}: cannot serve the API on 127.0.0.1:{port}: Address already in use"
        )
    finally:
        busy.close()
    code, _, err = run(capsys, "sim", "serve", "--port", "70000")
    assert code == 2 and "'--port': 70000 is not in the range" in one_line(err)


# --- options with numbers ------------------------------------------------------------------------


TIMEOUTS = [
    ["apply", "--timeout", "0"],
    ["apply", "--timeout", "nan"],
    ["apply", "--timeout", "inf"],
    ["apply", "--timeout", "-1"],
    ["apply", "--api-timeout", "0"],
    ["recover", "--timeout", "nan"],
    ["verify", "--timeout", "-5"],
]


def test_a_timeout_must_be_a_finite_number_above_zero_and_nothing_changes(capsys, sim):
    # apply --timeout 0 used to run: every rebind "hung" and four GPUs were left to a human (exit 3)
    spec = sim.dir / "s.yaml"
    spec.write_text(seed_spec_text(sim))
    before = fingerprint(sim)
    for argv in TIMEOUTS:
        extra = {"apply": ["--spec", str(spec), "--yes"], "verify": ["--spec", str(spec)]}.get(argv[0], [])
        code, _, err = run(capsys, *argv, "--sim", str(sim.dir), *extra)
        assert code == 2, argv
        line = one_line(err)
        assert f"Invalid value for '{argv[1]}'" in line and "is not a finite number above 0" in line
    assert fingerprint(sim) == before


def test_demo_pace_must_not_be_negative(capsys):
    code, _, err = run(capsys, "demo", "--pace", "-1")
    assert code == 2 and "is not a finite number 0 or more" in one_line(err)


def test_diff_exit_code_keeps_2_for_differences_only(capsys, seed):
    code, _, err = run(capsys, "diff", "--exit-code", "--bogus")
    assert code == 1 and one_line(err)
    code, _, err = run(capsys, "diff", "--exit-code", "--root", str(seed), "--spec", str(seed))
    assert code == 1 and "is a directory" in one_line(err)
    code, _, err = run(capsys, "diff", "--bogus")
    assert code == 2


# --- the Proxmox API: URLs, credentials, a server that is not there ------------------------------


@pytest.mark.parametrize("url, port", [("pve1", 8006), ("https://pve1", 8006), ("https://pve1:8443/x", 8443)])
def test_parse_api_url(url, port):
    from gputopo.usecases.connect import parse_api_url

    assert parse_api_url(url) == ("pve1", port)


@pytest.mark.parametrize(
    "url, reason",
    [
        ("http://pve1:8006", "the Proxmox API is served over https"),
        ("ftp://pve1", "the Proxmox API is served over https"),
        ("https://pve1:0", "bad port"),
        ("https://pve1:65536", "bad port"),
        ("https://pve1:abc", "bad port"),
        ("https://", "no host"),
    ],
)
def test_parse_api_url_refuses(url, reason):
    from gputopo.errors import ConfigError
    from gputopo.usecases.connect import parse_api_url

    with pytest.raises(ConfigError) as e:
        parse_api_url(url)
    assert str(e.value) == f"--api-url {url}: {reason}"
    assert e.value.exit_code == 2


def test_an_unreachable_api_fails_fast_in_one_line_and_apply_changes_nothing(
    capsys, monkeypatch, seed, spec_file
):
    monkeypatch.setenv("GPUTOPO_PVE_PASSWORD", "not-the-real-one")
    t0 = time.monotonic()
    code, _, err = run(
        capsys,
        "apply",
        "--api-url",
        "https://127.0.0.1:1",
        "--root",
        str(seed),
        "--spec",
        str(spec_file),
        "--yes",
    )
    assert time.monotonic() - t0 < 10
    assert code == 2
    line = one_line(err)
    assert line.startswith("gputopo: error: cannot use the Proxmox API (connect https://127.0.0.1:1: ")
    assert "Connection refused" in line and line.endswith("nothing was changed")
    assert "not-the-real-one" not in err
    code, _, err = run(
        capsys, "plan", "--api-url", "https://127.0.0.1:1", "--root", str(seed), "--spec", str(spec_file)
    )
    assert code != 0 and "Connection refused" in one_line(err)


@pytest.fixture
def own_seed(seed, tmp_path) -> Path:
    """A copy of the seed root that a command may write to (its lock, journals)."""
    root = tmp_path / "root"
    shutil.copytree(seed, root, symlinks=True)
    return root


NO_PVESH = "pvesh: not found (the local backend runs on the Proxmox node itself)"


def test_recover_with_no_open_journal_never_asks_the_api(capsys, monkeypatch, tmp_path, own_seed):
    """--local (the default) where the API cannot be used (here no pvesh at all, as on a node
    whose pmxcfs is down after a crash): with no apply left open there is nothing to recover."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    code, out, err = run(capsys, "recover", "--root", str(own_seed))
    assert (code, out, err) == (0, "No unfinished apply: nothing to recover\n", "")
    code, out, err = run(capsys, "recover", "--root", str(own_seed), "--json")
    assert code == 0 and json.loads(out)["status"] == "nothing-to-recover", err


def test_apply_where_the_api_cannot_be_used_is_a_failed_preflight_in_one_line(
    capsys, monkeypatch, tmp_path, own_seed, spec_file
):
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    code, out, err = run(
        capsys, "apply", "--root", str(own_seed), "--spec", str(spec_file), "--yes", "--json"
    )
    assert code == 2
    assert one_line(err) == (
        f"gputopo: error: cannot use the Proxmox API via pvesh (--local) ({NO_PVESH}); nothing was changed"
    )
    assert json.loads(out)["status"] == "error"


def test_recover_without_the_api_goes_on_only_for_a_journal_of_this_host(
    capsys, monkeypatch, tmp_path, own_seed
):
    """After a crash the API may not answer: recover warns and goes on when the open journal's
    apply changed this host (the journal proves it); a journal of another node is refused
    without asking the API, one that does not name its node is refused naming the API; both
    refusals leave the journal as it was."""
    from gputopo.apply.journal import End, Header, Journal

    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    for node, error in (
        (
            "pve9",
            "gputopo would act on node pve9 (the Proxmox API via pvesh (--local)), but this host is pve1: ",
        ),
        (None, f"cannot use the Proxmox API via pvesh (--local) ({NO_PVESH}); nothing was changed"),
    ):
        j = Journal.create(own_seed, Header(pid=1, started=time.time(), node=node))
        code, out, err = run(capsys, "recover", "--root", str(own_seed), "--json")
        assert code == 2 and one_line(err).startswith(f"gputopo: error: {error}"), err
        doc = json.loads(out)
        assert doc["status"] == "error" and doc["journal"] == str(j.path), doc
        assert len(Journal.load(j.path).records) == 1
        j.append(End(result="rolled-back"))
    j = Journal.create(own_seed, Header(pid=1, started=time.time(), node="pve1"))
    code, out, err = run(capsys, "recover", "--root", str(own_seed))
    assert code == 0, err
    assert f"warning: cannot use the Proxmox API via pvesh (--local) ({NO_PVESH}); " in out + err
    assert out.splitlines()[-1] == f"recovered: {j.path}"
    assert Journal.load(j.path).result == "rolled-back"


def test_credentials_missing_or_in_a_file_others_can_read(capsys, monkeypatch, tmp_path, seed, spec_file):
    for var in ("GPUTOPO_PVE_PASSWORD", "GPUTOPO_PVE_TOKEN", "GPUTOPO_PVE_TOKEN_SECRET", "GPUTOPO_PVE_URL"):
        monkeypatch.delenv(var, raising=False)
    base = [
        "apply",
        "--api-url",
        "https://127.0.0.1:1",
        "--root",
        str(seed),
        "--spec",
        str(spec_file),
        "--yes",
    ]
    code, _, err = run(capsys, *base)
    assert code == 2 and "no credentials" in one_line(err)
    secret = tmp_path / "secret"
    secret.write_text("pw\n")
    secret.chmod(0o644)
    code, _, err = run(capsys, *base, "--secret-file", str(secret))
    assert code == 2
    assert one_line(err) == (
        f"gputopo: error: {secret}: secret file must be readable by its owner only (mode 0644; chmod 600 it)"
    )
    code, _, err = run(capsys, *base, "--local")
    assert code == 2 and one_line(err) == "gputopo: error: --api-url and --local exclude each other"
