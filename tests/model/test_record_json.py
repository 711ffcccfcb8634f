"""A record writes its JSON itself (gputopo.model.record, so that discovery need not import json):
the text must be, byte for byte, what ``json.dumps`` gives for the record's data, for any string."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.facts.discover import discover
from gputopo.model.facts import Facts, Gpu, GroupMember, HostFacts, MemberRole
from gputopo.model.record import Field, Record, _dump
from gputopo.sim.hostroot import list_hosts


def json_dumps(record: Record, indent: int | None, by_alias: bool) -> str:
    """What the records wrote before they wrote it themselves."""
    separators = (",", ": ") if indent is not None else (",", ":")
    data = _dump(record, True, by_alias)
    return json.dumps(data, indent=indent, ensure_ascii=False, check_circular=False, separators=separators)


def assert_json_dumps(record: Record) -> None:
    for indent in (None, 0, 2, 4):
        for by_alias in (False, True):
            assert record.model_dump_json(indent=indent, by_alias=by_alias) == json_dumps(
                record, indent, by_alias
            )


@pytest.mark.parametrize("host", list_hosts())
@pytest.mark.slow
def test_every_fixture_host_is_written_as_json_dumps_writes_it(materialized, host):
    for all_vendors in (False, True):
        facts = discover(materialized(host), all_vendors=all_vendors)
        assert_json_dumps(facts)
        assert facts.to_json() == json_dumps(facts, 2, True)


# every character, lone surrogates and control characters included
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)


@given(
    model=TEXT, warnings=st.lists(TEXT, max_size=4), hostname=st.none() | TEXT, numa=st.none() | st.integers()
)
@settings(max_examples=300, deadline=None)
def test_any_text_is_written_as_json_dumps_writes_it(model, warnings, hostname, numa):
    member = GroupMember(address=model, role=MemberRole.FOREIGN, vendor=None, device=model, **{"class": "x"})
    gpu = Gpu(address="0000:01:00.0", vendor=model, device=None, class_=None, model=model, numa_node=numa)
    gpu.iommu_members = [member]
    gpu.reset_method = warnings
    facts = Facts(gpus=[gpu], host=HostFacts(hostname=hostname, cmdline=model), warnings=warnings)
    assert_json_dumps(facts)


class Odd(Record):
    """Data that facts never hold: floats, dicts, tuples, subclasses of str and int."""

    number: float = 0.0
    mapping: dict = Field(default_factory=dict)
    pair: tuple = ()
    other: object = None


class Name(str):
    pass


class Count(int):
    pass


@given(
    number=st.floats(allow_nan=True, allow_infinity=True),
    keys=st.lists(TEXT, max_size=3),
    big=st.integers(min_value=-(10**30), max_value=10**30),
)
@settings(max_examples=200, deadline=None)
def test_numbers_mappings_and_subclasses_are_written_as_json_dumps_writes_them(number, keys, big):
    odd = Odd(number=number, mapping={k: [big, None, True] for k in keys}, pair=(Name("n\n"), Count(big)))
    assert_json_dumps(odd)
    assert_json_dumps(Odd(mapping={"nested": {"empty": {}, "list": []}}, other=MemberRole.GPU))


def test_what_json_alone_writes_is_left_to_json():
    assert_json_dumps(Odd(mapping={1: "int key", None: "null key"}))  # json turns the keys to text
    with pytest.raises(TypeError, match="not JSON serializable"):
        Odd(other={1, 2}).model_dump_json()
    assert_json_dumps(Odd(other=Odd(pair=(Odd(),))))
