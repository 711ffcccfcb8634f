"""The apply journal: typed records, pure parsing of its text, durable appends, unfinished detection."""

from __future__ import annotations

import json

import pytest

from gputopo.actions import StopGuest, StopService
from gputopo.apply.journal import (
    JOURNAL_DIR,
    Begin,
    Done,
    End,
    Failed,
    Header,
    Journal,
    NeedsHuman,
    Recover,
    ServiceChanged,
    UndoBegin,
    UndoDone,
    UndoFailed,
    UndoIncomplete,
    Verifying,
    find_unfinished,
    list_journals,
    parse_journal,
)
from gputopo.errors import JournalError

STOP_SVC = {"kind": "stop_service", "phase": "stop", "vmid": 101, "unit": "sglang.service"}
STOP_CT = {"kind": "stop_guest", "phase": "stop", "guest": "lxc", "vmid": 101}
HEADER = json.dumps({"type": "header", "t": 0, "pid": 7, "started": 0, "actions": [STOP_SVC, STOP_CT]})


def _header(n: int = 1) -> Header:
    return Header(pid=7, started=1.0e9, actions=[StopService(vmid=101, unit="sglang.service")] * n)


def test_parse_journal_gives_typed_records_in_order():
    text = (
        HEADER
        + "\n"
        + json.dumps({"type": "begin", "t": 1, "step": 0, "action": STOP_SVC, "before": {"active": True}})
        + '\n{"type": "done", "t": 2, "step": 0, "seconds": 0.5}\n'
    )
    recs = parse_journal(text)
    assert [type(r) for r in recs] == [Header, Begin, Done]
    assert isinstance(recs[0].actions[1], StopGuest) and recs[0].actions[1].vmid == 101
    assert isinstance(recs[1].action, StopService) and recs[1].before == {"active": True}
    assert recs[2].seconds == 0.5


def test_parse_journal_drops_a_torn_last_line_only():
    torn = HEADER + '\n{"type": "begin", "step": 0, "act'
    assert [r.type for r in parse_journal(torn)] == ["header"]
    with pytest.raises(JournalError) as e:
        parse_journal(HEADER + '\n{"type": "beg\n{"type": "done", "step": 0, "seconds": 1}\n', "j.jsonl")
    assert str(e.value).startswith("j.jsonl:2: not a journal record")


def test_a_record_of_the_wrong_shape_is_refused_naming_the_field():
    bad = (
        HEADER
        + '\n{"type": "done", "t": 1, "step": "zero", "seconds": 1}\n'
        + '{"type": "end", "t": 2, "result": "applied"}\n'
    )
    with pytest.raises(JournalError) as e:
        parse_journal(bad, "j.jsonl")
    assert "j.jsonl:2" in str(e.value) and "step" in str(e.value)
    with pytest.raises(JournalError):
        parse_journal(
            HEADER + '\n{"type": "warp", "t": 1}\n{"type": "end", "t": 2, "result": "applied"}\n', "j"
        )


def test_parse_journal_needs_the_header_first():
    with pytest.raises(JournalError) as e:
        parse_journal('{"type": "undo-begin", "t": 0, "step": 0}\n', "x")
    assert "not the header" in str(e.value)
    with pytest.raises(JournalError):
        parse_journal("[1, 2]\n" + HEADER + "\n", "x")


def test_create_append_load_and_unfinished(tmp_path):
    assert find_unfinished(tmp_path) is None
    j = Journal.create(tmp_path, _header())
    assert j.path.parent == tmp_path / JOURNAL_DIR and j.path.name.endswith(f"-{j.header.pid}.jsonl")
    j.append(Begin(step=0, action=StopService(vmid=101, unit="sglang.service"), before={"active": True}))
    again = find_unfinished(tmp_path)
    assert again is not None and again.path == j.path
    steps = again.steps()
    assert list(steps) == [0] and steps[0].status == "begun" and steps[0].before == {"active": True}
    assert isinstance(steps[0].action, StopService)
    assert again.describe().endswith("1 of 1 step(s) begun: 1 in progress)")
    j.append(Done(step=0, seconds=0.1))
    assert find_unfinished(tmp_path).describe().endswith("1 of 1 step(s) begun: 1 done)")
    j.append(End(result="applied"))
    assert find_unfinished(tmp_path) is None
    loaded = Journal.load(j.path)
    assert loaded.result == "applied" and loaded.steps()[0].status == "done"
    # every line on disk is one JSON object ending in a newline
    lines = j.path.read_text().split("\n")
    assert lines[-1] == "" and all(json.loads(x)["type"] for x in lines[:-1])


def test_a_step_begun_again_keeps_its_first_before_state(tmp_path):
    j = Journal.create(tmp_path, _header())
    a = StopGuest(guest="lxc", vmid=101)
    j.append(Begin(step=0, action=a, before={"status": "running"}))
    j.append(Begin(step=0, action=a, before={"status": "stopped"}))
    assert j.steps()[0].before == {"status": "running"}
    assert a.load_before(j.steps()[0].before).status == "running"


def test_newest_unfinished_wins_and_finished_ones_are_skipped(tmp_path):
    old = Journal.create(tmp_path, _header(0))
    new = Journal.create(tmp_path, _header(0))
    assert list_journals(tmp_path) == [old.path, new.path]
    new.append(End(result="rolled-back"))
    assert find_unfinished(tmp_path).path == old.path
    old.append(End(result="applied"))
    assert find_unfinished(tmp_path) is None


def test_a_needs_human_record_keeps_the_journal_open_and_names_what_is_left(tmp_path):
    j = Journal.create(tmp_path, _header(3))
    for i in range(3):
        j.append(Begin(step=i, action=StopService(vmid=101, unit="sglang.service"), before={"active": True}))
        j.append(Done(step=i, seconds=0))
    j.append(UndoBegin(step=2))
    j.append(UndoDone(step=2))
    j.append(UndoBegin(step=1))
    j.append(UndoIncomplete(step=1, devices=["0000:91:00.0"]))
    j.append(UndoBegin(step=0))
    j.append(UndoFailed(step=0, error="boom"))
    j.append(NeedsHuman(needs_human=["0000:91:00.0"], pending=j.pending_undo()))
    assert j.pending_undo() == [0, 1]
    assert j.needs_human.needs_human == ["0000:91:00.0"] and j.needs_human.pending == [0, 1]
    err = Journal.load(j.path).unfinished_error()
    assert err.exit_code == 2 and "0000:91:00.0" in str(err) and "step(s) 1, 2" in str(err)
    # what each begun step came to, not "0 done" for steps a rollback undid
    assert (
        Journal.load(j.path)
        .describe()
        .endswith("3 of 3 step(s) begun: 1 undone, 1 undo failed, 1 undo incomplete)")
    )
    again = find_unfinished(tmp_path)
    assert again is not None and again.path == j.path and not again.finished
    # a recover that began and has not settled yet: no longer the last word
    j.append(Recover(mode="rollback", pid=8))
    assert Journal.load(j.path).needs_human is None
    j.append(UndoBegin(step=1))
    j.append(UndoDone(step=1))
    j.append(UndoBegin(step=0))
    j.append(UndoDone(step=0))
    assert j.pending_undo() == []
    j.append(End(result="rolled-back"))
    assert find_unfinished(tmp_path) is None


def test_what_a_later_process_must_still_do_is_written_down(tmp_path):
    j = Journal.create(tmp_path, _header(1))
    j.append(Failed(step=0, error="hung", error_type="SysfsTimeout", devices=["0000:81:00.0"]))
    j.append(ServiceChanged(vmid=101))
    j.append(Verifying())
    loaded = Journal.load(j.path)
    assert loaded.hung_devices() == {"0000:81:00.0"}
    assert loaded.services_to_restart() == {101}
    assert loaded.verifying and not loaded.finished


def test_a_journal_that_is_not_utf8_is_a_journal_error_naming_the_file(tmp_path):
    j = Journal.create(tmp_path, _header(1))
    with open(j.path, "ab") as f:
        f.write(b'{"type": "verifying", "t": 0}\xff\xfe\n')
    with pytest.raises(JournalError) as e:
        Journal.load(j.path)
    assert str(e.value) == f"{j.path}: not a journal (byte {len(j.path.read_bytes()) - 3} is not UTF-8 text)"
    with pytest.raises(JournalError):
        find_unfinished(tmp_path)
