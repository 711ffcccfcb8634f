"""The apply journal: pure parsing of its text, durable appends, unfinished detection."""

from __future__ import annotations

import json

import pytest

from gputopo.errors import JournalError
from gputopo.apply.journal import JOURNAL_DIR, Journal, find_unfinished, list_journals, parse_journal

HEADER = '{"type": "header", "pid": 7, "started": 0, "actions": [{"kind": "stop_service"}, {"kind": "stop_guest"}]}'


def test_parse_journal_records_in_order():
    text = HEADER + '\n{"type": "begin", "step": 0, "action": {}, "before": {"active": true}}\n{"type": "done", "step": 0}\n'
    recs = parse_journal(text)
    assert [r["type"] for r in recs] == ["header", "begin", "done"]
    assert recs[1]["before"] == {"active": True}


def test_parse_journal_drops_a_torn_last_line_only():
    torn = HEADER + '\n{"type": "begin", "step": 0, "act'
    assert [r["type"] for r in parse_journal(torn)] == ["header"]
    with pytest.raises(JournalError) as e:
        parse_journal(HEADER + '\n{"type": "beg\n{"type": "done", "step": 0}\n', "j.jsonl")
    assert str(e.value) == "j.jsonl:2: not a JSON record"


def test_parse_journal_needs_the_header_first():
    with pytest.raises(JournalError) as e:
        parse_journal('{"type": "begin", "step": 0}\n', "x")
    assert "not the header" in str(e.value)
    with pytest.raises(JournalError):
        parse_journal('[1, 2]\n' + HEADER + "\n", "x")


def test_create_append_load_and_unfinished(tmp_path):
    assert find_unfinished(tmp_path) is None
    j = Journal.create(tmp_path, {"actions": [{"kind": "stop_service"}]})
    assert j.path.parent == tmp_path / JOURNAL_DIR and j.path.name.endswith(f"-{j.header['pid']}.jsonl")
    j.append("begin", step=0, action={"kind": "stop_service", "phase": "stop"}, before={"active": True})
    again = find_unfinished(tmp_path)
    assert again is not None and again.path == j.path
    assert again.steps() == {0: {"action": {"kind": "stop_service", "phase": "stop"}, "before": {"active": True},
                                 "status": "begun"}}
    assert "1 of 1 step(s) begun, 0 done" in again.describe()
    j.append("done", step=0)
    j.append("end", result="applied")
    assert find_unfinished(tmp_path) is None
    loaded = Journal.load(j.path)
    assert loaded.result == "applied" and loaded.steps()[0]["status"] == "done"
    # every line on disk is one JSON object ending in a newline
    lines = j.path.read_text().split("\n")
    assert lines[-1] == "" and all(json.loads(x)["type"] for x in lines[:-1])


def test_a_step_begun_again_keeps_its_first_before_state(tmp_path):
    j = Journal.create(tmp_path, {"actions": [{}]})
    j.append("begin", step=0, action={}, before={"status": "running"})
    j.append("begin", step=0, action={}, before={"status": "stopped"})
    assert j.steps()[0]["before"] == {"status": "running"}


def test_newest_unfinished_wins_and_finished_ones_are_skipped(tmp_path):
    old = Journal.create(tmp_path, {"actions": []})
    new = Journal.create(tmp_path, {"actions": []})
    assert list_journals(tmp_path) == [old.path, new.path]
    new.append("end", result="rolled-back")
    assert find_unfinished(tmp_path).path == old.path
    old.append("end", result="needs-human", needs_human=["0000:81:00.0"])
    assert find_unfinished(tmp_path) is None


def test_a_needs_human_record_keeps_the_journal_open_and_names_what_is_left(tmp_path):
    j = Journal.create(tmp_path, {"actions": [{}, {}, {}]})
    for i in range(3):
        j.append("begin", step=i, action={}, before={})
        j.append("done", step=i)
    j.append("undo-begin", step=2)
    j.append("undo-done", step=2)
    j.append("undo-begin", step=1)
    j.append("undo-incomplete", step=1, devices=["0000:91:00.0"])
    j.append("undo-begin", step=0)
    j.append("undo-failed", step=0, error="boom")
    j.append("needs-human", needs_human=["0000:91:00.0"], pending=j.pending_undo())
    assert j.pending_undo() == [0, 1]
    assert j.needs_human["needs_human"] == ["0000:91:00.0"] and j.needs_human["pending"] == [0, 1]
    again = find_unfinished(tmp_path)
    assert again is not None and again.path == j.path and not again.finished
    # a recover that began and has not settled yet: no longer the last word
    j.append("recover", mode="rollback")
    assert Journal.load(j.path).needs_human is None
    j.append("undo-begin", step=1)
    j.append("undo-done", step=1)
    j.append("undo-begin", step=0)
    j.append("undo-done", step=0)
    assert j.pending_undo() == []
    j.append("end", result="rolled-back")
    assert find_unfinished(tmp_path) is None
