"""What ``systemctl`` prints, and which unit of a container runs an inference server. Pure.

* ``systemctl list-units --type=service --all --no-legend --plain --full``: one unit a line,
  ``UNIT LOAD ACTIVE SUB DESCRIPTION`` in columns padded with blanks (``--plain`` drops the
  ``●`` bullet of failed units; it is skipped here anyway);
* ``systemctl list-unit-files --type=service --no-legend --full``: ``UNIT-FILE STATE [PRESET]``;
* ``systemctl show -p Id -p ActiveState -p ExecStart UNIT...``: ``Key=value`` lines, one block
  per unit, blocks separated by an empty line (systemctl(1), "show").

An inference unit is one whose ``ExecStart`` runs SGLang (``python -m sglang.launch_server``,
``sglang serve``) or vLLM (``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

# every spelling of the tensor-parallel flag the servers accept (SGLang: --tp, --tp-size;
# vLLM: --tensor-parallel-size, -tp)
TP_FLAGS = ("--tp", "--tp-size", "--tensor-parallel-size", "-tp")
DEFAULT_TP_FLAG = {"sglang": "--tp", "vllm": "--tensor-parallel-size"}

LIST_UNITS = ["systemctl", "list-units", "--type=service", "--all", "--no-legend", "--plain", "--full"]
LIST_UNIT_FILES = ["systemctl", "list-unit-files", "--type=service", "--no-legend", "--full"]
SHOW_PROPS = ["-p", "Id", "-p", "ActiveState", "-p", "ExecStart"]


def parse_list_units(text: str) -> list[tuple[str, str]]:
    """(unit, active state) of each line of ``list-units`` output; other lines are skipped."""
    out = []
    for line in text.splitlines():
        words = line.replace("●", " ").split()
        if len(words) >= 4 and "." in words[0]:
            out.append((words[0], words[2]))
    return out


def parse_list_unit_files(text: str) -> list[tuple[str, str]]:
    """(unit file, state: enabled, disabled, static, masked...) of each ``list-unit-files`` line."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and "." in words[0]:
            out.append((words[0], words[1]))
    return out


def parse_show_blocks(text: str) -> list[dict[str, str]]:
    """The property blocks of a multi-unit ``systemctl show`` (first value of a key wins)."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition("=")
        if sep and key not in current:
            current[key] = value
    if current:
        blocks.append(current)
    return blocks


def exec_argv(exec_start: str) -> list[str]:
    """The command of an ``ExecStart`` property (``{ path=... ; argv[]=CMD ; ... }``) as argv;
    the last command when there are several, [] when none."""
    commands = re.findall(r"argv\[\]=(.*?) ;", exec_start)
    if not commands:
        return []
    try:
        return shlex.split(commands[-1])
    except ValueError:
        return commands[-1].split()


def inference_server(argv: list[str]) -> str | None:
    """``"sglang"`` or ``"vllm"`` when ``argv`` runs that server, else None."""
    for i, tok in enumerate(argv):
        base = tok.rsplit("/", 1)[-1]
        after = argv[i + 1] if i + 1 < len(argv) else ""
        if base.startswith("sglang.launch_server") or (
            base == "sglang" and after in ("serve", "launch_server")
        ):
            return "sglang"
        if base.startswith("vllm.entrypoints") or (base == "vllm" and after == "serve"):
            return "vllm"
    return None


def tp_of(argv: list[str]) -> tuple[str | None, int | None]:
    """(flag as spelled, value) of the tensor-parallel flag in ``argv``; (None, None) without
    one; a value that is not a number comes back as None."""
    for i, tok in enumerate(argv):
        for flag in TP_FLAGS:
            if tok == flag and i + 1 < len(argv):
                raw = argv[i + 1]
            elif tok.startswith(flag + "="):
                raw = tok.split("=", 1)[1]
            else:
                continue
            return flag, int(raw) if raw.isdigit() else None
    return None, None


# every spelling is matched and replaced, longest first (--tp-size before --tp)
_TP_RE = re.compile(
    r"(?P<lead>(?:^|(?<=\s)))(?P<flag>"
    + "|".join(re.escape(f) for f in sorted(TP_FLAGS, key=len, reverse=True))
    + r")(?P<sep>=|\s+)(?P<value>\S+)"
)


def parse_tp(command: str) -> int | None:
    """The tensor-parallel size in ``command`` (``--tp 8``, ``--tp=8``, ``--tensor-parallel-size 8``).

    Returns None when no flag is there or its value is not an integer.
    """
    m = _TP_RE.search(command)
    if not m:
        return None
    try:
        return int(m.group("value").strip("'\""))
    except ValueError:
        return None


def set_tp(command: str, flag: str, tp: int) -> str:
    """``command`` with its tensor-parallel value set to ``tp``.

    An existing flag (any accepted spelling, ``--flag N`` or ``--flag=N``) keeps its spelling and
    gets the new value; without one, ``flag tp`` is appended.
    """
    command = command.strip()
    if _TP_RE.search(command):
        return _TP_RE.sub(lambda m: f"{m.group('lead')}{m.group('flag')}{m.group('sep')}{tp}", command)
    return f"{command} {flag} {tp}"


@dataclass
class InferenceUnit:
    """A container's unit that runs an inference server, as ``systemctl show`` describes it."""

    unit: str
    server: str  # sglang | vllm
    active: bool
    command: str
    tp_flag: str  # as the command spells it, else the server's own
    tp: int  # 1 when the command gives none (both servers' default)


def inference_units(blocks: list[dict[str, str]]) -> list[InferenceUnit]:
    """Every unit of ``blocks`` that runs an inference server, the active ones first, then by name."""
    found = []
    for b in blocks:
        argv = exec_argv(b.get("ExecStart", ""))
        server = inference_server(argv)
        if server is None or not b.get("Id"):
            continue
        flag, tp = tp_of(argv)
        found.append(
            InferenceUnit(
                unit=b["Id"],
                server=server,
                active=b.get("ActiveState") in ("active", "activating", "reloading"),
                command=" ".join(argv),
                tp_flag=flag or DEFAULT_TP_FLAG[server],
                tp=tp if tp is not None else 1,
            )
        )
    return sorted(found, key=lambda u: (not u.active, u.unit))


def candidate_units(list_units: str, list_unit_files: str) -> list[str]:
    """Service units worth a look: every listed unit and unit file, templates (``x@.service``)
    and masked ones left out, sorted."""
    names = {u for u, _ in parse_list_units(list_units)}
    names |= {u for u, state in parse_list_unit_files(list_unit_files) if state != "masked"}
    return sorted(n for n in names if n.endswith(".service") and "@." not in n)
