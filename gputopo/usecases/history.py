"""History: past applies under a host root, from their journals."""

from __future__ import annotations

from gputopo.model.documents import HistoryEntry, HistoryList


def history(root: str) -> HistoryList:
    """Every apply journaled under ``root``, oldest first (``gputopo schema history``).
    Raises JournalError when the journal directory cannot be listed."""
    from gputopo.apply.history import history as read_history

    return HistoryList(applies=read_history(root))


def entry(root: str, ident: str) -> HistoryEntry:
    """One apply with its steps (``ident``: its id, a unique prefix of it, or ``last``).
    Raises JournalError (none, or more than one, matches)."""
    from gputopo.apply.history import entry as read_entry

    return read_entry(root, ident)
