"""The facts are plain records (gputopo.model.record) whose schema and validation pydantic builds
from the same declarations (gputopo.model.mirror): what they print must be what pydantic prints
for the same data, and building them must behave as a pydantic model's construction does for
the data gputopo gives them."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from gputopo.facts.discover import discover
from gputopo.model.facts import Bridge, Facts, Gpu, GroupMember, Holder, Link, MemberRole
from gputopo.model.mirror import mirror
from gputopo.model.record import Field, Record
from gputopo.sim.hostroot import list_hosts

GPU = dict(address="0000:01:00.0", vendor="0x10de", device="0x2bb5", **{"class": "0x030200"})


@pytest.mark.parametrize("host", list_hosts())
@pytest.mark.slow
def test_the_json_of_every_fixture_is_pydantics(materialized, host):
    facts = discover(materialized(host), all_vendors=True)
    text = facts.to_json()
    model = mirror(Facts).model_validate_json(text)
    assert model.model_dump_json(by_alias=True, indent=2) == text
    assert json.loads(facts.model_dump_json(by_alias=True)) == json.loads(text)
    assert Facts.model_validate_json(text) == facts  # and back to the same records


def test_the_json_of_odd_text_is_pydantics():
    odd = 'Ünïcode ✓ "quoted" back\\slash\ttab\x01\x7f\u2028 end'
    facts = Facts(
        gpus=[
            Gpu(
                **GPU,
                model=odd,
                iommu_members=[
                    GroupMember(
                        address="0000:01:00.1",
                        role=MemberRole.FUNCTION,
                        vendor=None,
                        device=None,
                        **{"class": None},
                    )
                ],
            )
        ],
        warnings=[odd, ""],
    )
    text = facts.to_json()
    assert mirror(Facts).model_validate_json(text).model_dump_json(by_alias=True, indent=2) == text
    assert facts.model_dump_json() == mirror(Facts).model_validate_json(text).model_dump_json()


def test_a_record_is_built_by_name_alias_or_position_and_refuses_what_pydantic_would_not_build():
    g = Gpu(**GPU)
    assert g.class_ == "0x030200"
    assert Gpu(address="a", vendor=None, device=None, class_="0x0300").class_ == "0x0300"
    assert g.link == Link() and g.iommu_members == [] and g.readable is True
    assert Holder(1, "python3", None, 101) == Holder(pid=1, comm="python3", cmdline=None, container=101)
    with pytest.raises(TypeError, match="missing field 'vendor'"):
        Gpu(address="a", device=None, class_=None)
    with pytest.raises(TypeError, match="unexpected field 'colour'"):
        Gpu(**GPU, colour="green")
    with pytest.raises(TypeError, match="'class_' given twice"):
        Gpu(**GPU, class_="0x0300")
    with pytest.raises(TypeError, match="positional"):
        Link(1, 2, 3, 4, 5)


def test_defaults_are_fresh_for_every_record():
    a, b = Gpu(**GPU), Gpu(**GPU)
    a.iommu_members.append(
        GroupMember(
            address="0000:01:00.1", role=MemberRole.FUNCTION, vendor=None, device=None, **{"class": None}
        )
    )
    a.link.current_width = 16
    assert b.iommu_members == [] and b.link.current_width is None

    class WithList(Record):
        items: list = []  # a mutable plain default is copied, as pydantic does

    x, y = WithList(), WithList()
    x.items.append(1)
    assert y.items == []


def test_equality_hash_copy_and_frozen():
    g = Gpu(**GPU, upstream=[Bridge(address="0000:00:01.1", kind="root_port")])
    deep = g.model_copy(deep=True)
    assert deep == g and deep is not g and deep.upstream[0] is not g.upstream[0]
    deep.upstream[0].kind = "bridge"
    assert g.upstream[0].kind == "root_port" and deep != g
    shallow = g.model_copy(update={"minor": 3})
    assert shallow.minor == 3 and g.minor is None and shallow.upstream is g.upstream
    assert copy.deepcopy(g) == g
    with pytest.raises(TypeError):
        hash(g)
    h = Holder(pid=1, comm="x", cmdline=None, container=None)
    assert {h: 1}[Holder(1, "x", None, None)] == 1
    with pytest.raises(AttributeError, match="frozen"):
        h.pid = 2
    assert Gpu(**GPU) != Link() and (Gpu(**GPU) == object()) is False


def test_dump_modes():
    g = Gpu(
        **GPU,
        iommu_members=[
            GroupMember(
                address="0000:01:00.1", role=MemberRole.FUNCTION, vendor=None, device=None, **{"class": None}
            )
        ],
    )
    assert g.model_dump()["class_"] == "0x030200" and g.model_dump(by_alias=True)["class"] == "0x030200"
    assert g.model_dump()["iommu_members"][0]["role"] is MemberRole.FUNCTION
    assert g.model_dump(mode="json")["iommu_members"][0]["role"] == "function"
    assert g.model_dump() == mirror(Gpu).model_validate(g.model_dump()).model_dump()


def test_validation_is_pydantics():
    data = json.loads(Facts(gpus=[Gpu(**GPU)]).to_json())
    facts = Facts.model_validate(data)
    assert isinstance(facts.gpus[0], Gpu) and isinstance(facts.gpus[0].link, Link)
    data["gpus"][0]["numa_node"] = "zero"
    with pytest.raises(ValidationError):
        Facts.model_validate(data)
    with pytest.raises(ValidationError):
        Facts.model_validate({"gpus": [], "surplus": 1})  # extra="forbid", as declared
    with pytest.raises(ValidationError):
        Bridge.model_validate({"address": "0000:00:01.0", "kind": "hub"})  # a Literal


def test_the_schema_carries_the_declarations():
    class Thing(Record):
        """A thing."""

        model_config = {"extra": "forbid"}
        name: str
        size: int | None = Field(None, description="bytes")
        kind_: str = Field("a", alias="kind")

    schema = Thing.model_json_schema()
    assert schema["description"] == "A thing." and schema["additionalProperties"] is False
    assert schema["required"] == ["name"] and schema["properties"]["size"]["description"] == "bytes"
    assert "kind" in schema["properties"] and Thing.model_validate({"name": "x", "kind": "b"}).kind_ == "b"


HEAVY = ("click", "pydantic", "pydantic_core", "typing", "dataclasses", "rich", "yaml", "jinja2", "pathlib")


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["discover", "--json", "--root", "SEED"]])
def test_the_quick_command_lines_import_none_of_the_heavy_modules(materialized, args):
    # what keeps gputopo discover --json at lspci's pace and --version at Python's own start-up
    # (benchmarks/bench_discover.py times both); modules the interpreter itself loaded before
    # gputopo (a site .pth may import typing or pathlib on some installs) are not gputopo's doing,
    # so only what appeared after counts: CI runs this in a fresh venv, where none is loaded
    probe = (
        "import sys\nbefore = set(sys.modules)\nfrom gputopo.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        f"print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in {HEAVY!r}),"
        " file=sys.stderr)\n"
    )
    argv = [str(materialized("seed")) if a == "SEED" else a for a in args]
    p = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    if args[0] == "discover":
        assert json.loads(p.stdout)["gpus"]
    else:
        assert p.stdout.startswith("gputopo, version" if args == ["--version"] else "Usage: gputopo")
    assert p.stderr.strip().splitlines()[-1] == "[]"
