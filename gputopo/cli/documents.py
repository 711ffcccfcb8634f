"""Every JSON document the commands print or write, with its schema (``gputopo schema NAME``).

Each document carries ``schema_version`` at its top; a change that a script would notice (a
key renamed or removed, a meaning changed) raises it. Keys are names without spaces (a
``snake_case`` word, or a path, an address, a vmid); file modes are octal strings (``"0644"``).

Models are imported only when their document is asked for: ``gputopo --help`` stays light.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

VERSION = 1


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = VERSION


# --- documents the CLI builds ----------------------------------------------------------------


class DiffAreaDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(description="The area as the text output names it")
    lines: list[str]
    files: dict[str, str] = Field(description="path -> unified diff")


class FileChangeDoc(BaseModel):
    """One file of ``diff --json``'s ``changes`` (:class:`gputopo.plan.diff.FileChange`, whose
    module is not imported here: print_json, which every --json command calls, loads this one)."""

    model_config = ConfigDict(extra="forbid")

    before: str | None = Field(description="The text now; null: the file does not exist")
    after: str | None = Field(description="The text the plan leads to; null: removed")


class DiffDoc(_Doc):
    """``gputopo diff --json``."""

    node: str
    is_empty: bool
    areas: dict[str, DiffAreaDoc] = Field(description="driver_bindings, container_devices, mappings, ...")
    changes: dict[str, FileChangeDoc] = Field(default_factory=dict,
                                              description="path -> the whole file before and after")


class StepDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int = Field(description="1-based, as the plan numbers it")
    phase: str
    kind: str
    description: str
    status: str = Field(description="done | failed")
    seconds: float
    warnings: list[str] = Field(default_factory=list)


class BootDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    commands: list[list[str]] = Field(description="What the next boot needs run, in order")
    ran: bool = Field(description="True when apply ran them (--refresh-boot)")


class ApplyDoc(_Doc):
    """``gputopo apply --json`` and ``gputopo recover --json``: how it ended, each step and its time."""

    status: str = Field(description="applied, no-changes, dry-run, rolled-back, recovered, finished, "
                                    "nothing-to-recover, or error")
    exit_code: int
    error: str | None = None
    node: str | None = None
    changed: bool = Field(False, description="Whether the host was changed (a rolled-back apply changed it twice)")
    signature: str | None = Field(None, description="The plan's signature (apply --expect-plan)")
    journal: str | None = None
    wall_s: float | None = None
    stop_window_s: float | None = None
    steps: list[StepDoc] = Field(default_factory=list)
    plan: list[str] = Field(default_factory=list, description="Every planned step's description, in order")
    verify: dict[str, Any] | None = Field(None, description="The verify document (gputopo schema verify)")
    boot: BootDoc | None = Field(None, description="Boot persistence changed: what must run before a reboot")
    warnings: list[str] = Field(default_factory=list, description="Every step's warnings as 'step N: text'")


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


class ManifestFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: str
    mode: str = Field(pattern=r"^[0-7]{4}$", description="octal permission bits")


class RenderManifest(_Doc):
    """``.gputopo-render.json`` in a ``render --out`` directory: the files gputopo wrote there."""

    kind: Literal["gputopo-render-manifest"] = "gputopo-render-manifest"
    files: dict[str, ManifestFile] = Field(description="relative path -> what was written")


def _verify_doc() -> dict[str, Any]:
    from gputopo.verify.report import VerifyReport

    schema = VerifyReport.model_json_schema()
    schema["properties"].update({"ok": {"type": "boolean"}, "exit_code": {"type": "integer"},
                                 "summary": {"type": "string"}})
    return schema


def _plan_doc() -> dict[str, Any]:
    from gputopo.plan.model import Plan

    schema = Plan.model_json_schema(mode="serialization")
    for name, d in schema.get("$defs", {}).items():
        if "kind" in d.get("properties", {}):  # an action kind: the JSON adds its one-line description
            d["properties"]["description"] = {"type": "string"}
    schema["properties"]["no_changes"] = {"type": "boolean"}
    schema["properties"]["signature"] = {"type": "string", "description": "What apply --expect-plan takes"}
    schema["properties"]["summary"] = {
        "type": "object", "description": "The plan's one-line summary and its numbers",
        "properties": {"counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                       "stop_window_steps": {"type": "integer"},
                       "expected_stop_window_s": {"type": ["number", "null"]},
                       "max_stop_window_s": {"type": ["number", "null"]}, "text": {"type": "string"}},
        "required": ["counts", "text"], "additionalProperties": False}
    schema["required"] = sorted(set(schema.get("required", [])) | {"no_changes", "signature"})
    return schema


def _model(path: str) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        import importlib

        module, attr = path.split(":")
        model = getattr(importlib.import_module(module), attr)
        return model.model_json_schema(by_alias=True, mode="serialization")

    return make


# name -> (what prints it, its schema without schema_version where the model has none)
DOCUMENTS: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    "facts": ("discover --json", _model("gputopo.model.facts:Facts")),
    "topo": ("topo --json", _model("gputopo.topo.model:TopoReport")),
    "plan": ("plan --json", _plan_doc),
    "saved-plan": ("plan -o FILE", _model("gputopo.plan.saved:SavedPlan")),
    "diff": ("diff --json", _model("gputopo.cli.documents:DiffDoc")),
    "verify": ("verify --json", _verify_doc),
    "apply": ("apply --json, recover --json", _model("gputopo.cli.documents:ApplyDoc")),
    "snapshot": ("snapshot --json", _model("gputopo.cli.documents:SnapshotDoc")),
    "sim-serve": ("sim serve --json", _model("gputopo.cli.documents:SimServeDoc")),
    "history": ("history --json", _model("gputopo.apply.history:HistoryList")),
    "history-entry": ("history show ID --json", _model("gputopo.apply.history:HistoryEntry")),
    "render-manifest": ("render --out DIR (.gputopo-render.json)", _model("gputopo.cli.documents:RenderManifest")),
}


def schema_of(name: str) -> dict[str, Any]:
    """The JSON Schema of document ``name``, ``schema_version`` included. Raises KeyError."""
    _, make = DOCUMENTS[name]
    schema = make()
    props = dict(schema.get("properties", {}))
    props.pop("schema_version", None)
    schema["properties"] = {"schema_version": {"const": VERSION, "type": "integer",
                                               "description": "Raised when a change would break a script"},
                            **props}
    schema["required"] = ["schema_version", *[r for r in schema.get("required", []) if r != "schema_version"]]
    return schema


def versioned(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``schema_version`` first."""
    return {"schema_version": VERSION, **{k: v for k, v in data.items() if k != "schema_version"}}
