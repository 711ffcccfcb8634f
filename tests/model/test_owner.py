"""The typed owner of a plan target: its text form round-trips, and as a pydantic field it reads
and writes that text, so plans on disk keep their format."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from gputopo.model.owner import HOST, Owner, OwnerKind


@pytest.mark.parametrize("text", ["container:101", "vm:pro6000-vm", "host"])
def test_text_round_trips(text):
    assert str(Owner.parse(text)) == text


def test_constructors_and_kinds():
    assert Owner.parse("container:101") == Owner.container(101)
    assert Owner.container(101).vmid == 101 and Owner.container(101).is_container
    assert Owner.vm("a").is_vm and not Owner.vm("a").is_container
    assert Owner.host() is HOST and HOST.kind == OwnerKind.HOST
    assert Owner.container(101).label == "container 101"
    with pytest.raises(ValueError):
        _ = Owner.vm("a").vmid


@pytest.mark.parametrize(
    "text", ["", "container", "container:", "container:abc", "vm:", "host:1", "lxc:101", "free"]
)
def test_not_an_owner(text):
    with pytest.raises(ValueError):
        Owner.parse(text)


class _Doc(BaseModel):
    owner: Owner


def test_pydantic_field_reads_and_writes_the_text():
    doc = _Doc(owner="vm:gpus")
    assert doc.owner == Owner.vm("gpus")
    assert doc.model_dump() == {"owner": "vm:gpus"}
    assert json.loads(doc.model_dump_json()) == {"owner": "vm:gpus"}
    assert _Doc.model_validate_json(doc.model_dump_json()) == doc
    assert _Doc(owner=Owner.container(7)).model_dump(mode="json") == {"owner": "container:7"}
    with pytest.raises(ValueError):
        _Doc(owner="lxc:7")
    assert _Doc.model_json_schema()["properties"]["owner"]["type"] == "string"


def test_owners_are_hashable_dict_keys():
    d = {Owner.container(101): 1, Owner.vm("x"): 2}
    assert d[Owner.parse("container:101")] == 1 and d[Owner.parse("vm:x")] == 2
