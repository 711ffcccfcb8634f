"""The documents about one host's files and journals (``gputopo schema NAME``): a snapshot
archive, a simulated host's serve line, a render directory's manifest, a cluster node's own
reads, and the applies its journals record (history). Re-exported by
:mod:`gputopo.model.documents`, where every document is named."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gputopo.model.docbase import VERSION
from gputopo.model.docbase import Doc as _Doc
from gputopo.model.strict import Strict


class SnapshotDoc(_Doc):
    """``gputopo snapshot --json``."""

    path: str
    pci_functions: int
    files: int
    links: int


class SimServeDoc(_Doc):
    """``gputopo sim serve --json``: one line, as soon as the host serves (no secret in it)."""

    node: str
    pve_version: str
    dir: str
    api_url: str
    ca_file: str | None = Field(description="null with --http")
    user: str
    password_file: str = Field(description="Owner-only file holding the password (--secret-file)")
    token_name: str = Field(description="--token-name, for the token in token_secret_file")
    token_secret_file: str
    endpoint: str | None
    container: int


class ManifestFile(Strict):
    sha256: str
    mode: str = Field(pattern=r"^[0-7]{4}$", description="octal permission bits")


class RenderManifest(_Doc):
    """``.gputopo-render.json`` in a ``render --out`` directory: the files gputopo wrote there."""

    kind: Literal["gputopo-render-manifest"] = "gputopo-render-manifest"
    files: dict[str, ManifestFile] = Field(description="relative path -> what was written")


# --- a cluster node's own reads ------------------------------------------------------------------


class NodeReadExec(Strict):
    """One command run in a container of the node (``pct exec``), as it ended there."""

    vmid: int
    argv: list[str]
    rc: int
    stdout: str
    stderr: str


class NodeReadDoc(_Doc):
    """``gputopo cluster node-read``: what a node read of itself for a cluster command, in one
    SSH round trip (:mod:`gputopo.cluster.noderead`). Internal: the same gputopo version writes
    and reads it (the cluster side refuses another version before this model)."""

    gputopo_version: str
    facts: dict[str, Any] = Field(description="What 'gputopo discover --json' prints")
    exec: list[NodeReadExec] = Field(description="The service reads run in its containers")
    files: dict[str, str | None] = Field(description="Host files asked for: text, null when absent")
    footprints: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Container -> its served model's footprint (gputopo.model.footprint), or "
        "{'unread': why it could not be read}",
    )


# --- history -------------------------------------------------------------------------------------

Outcome = Literal["applied", "rolled-back", "unfinished", "needs-human", "unreadable"]


class StepRecord(Strict):
    step: int = Field(description="1-based, as the plan numbers it")
    phase: str
    kind: str
    description: str
    status: str = Field(description="The journal's last word on it: done, failed, begun, undo-done, ...")
    seconds: float | None = Field(None, description="How long it ran (done steps)")
    started: float | None = Field(None, description="Unix time it began")
    warnings: list[str] = Field(default_factory=list)
    error: str | None = None
    undo: str | None = Field(None, description="What its undo did, when it was undone")


class ApplyRecord(Strict):
    id: str = Field(description="The journal's name without .jsonl; 'gputopo history show ID'")
    journal: str
    started: float | None = None
    started_utc: str | None = None
    node: str | None = None
    spec: str | None = None
    spec_sha256: str | None = None
    pid: int | None = None
    outcome: Outcome
    rolled_back: bool = False
    reason: str | None = Field(None, description="Why it was rolled back (verify) or what is wrong")
    verify: str | None = None
    steps_total: int = 0
    steps_done: int = 0
    stop_window_s: float | None = None
    wall_s: float | None = None
    steps: list[StepRecord] | None = Field(None, description="Each step (history show only)")


class HistoryList(Strict):
    """``gputopo history --json`` (``gputopo schema history``)."""

    schema_version: Literal[1] = VERSION
    applies: list[ApplyRecord]


class HistoryEntry(ApplyRecord):
    """``gputopo history show ID --json`` (``gputopo schema history-entry``)."""

    schema_version: Literal[1] = VERSION
