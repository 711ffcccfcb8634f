"""What both entries of the command line read, :mod:`gputopo.cli.quick` (answers without click)
and :mod:`gputopo.cli.group` (the click group): the command table, the program's description,
``--version``'s message and how an expected error prints.

Its own module so that neither entry imports the package ``gputopo.cli`` that imports them; the
package re-exports these names.
"""

from __future__ import annotations

import os
import sys

import gputopo

# command name -> "module:attribute" (module relative to gputopo.cli)
COMMANDS: dict[str, str] = {
    "discover": "discover:discover",
    "topo": "topocmd:topo",
    "snapshot": "discover:snapshot",
    "schema": "schema:schema",
    "init": "initcmd:init",
    "export": "initcmd:export",
    "plan": "plancmd:plan",
    "show": "showcmd:show",
    "render": "rendercmd:render",
    "diff": "plancmd:diff",
    "apply": "applycmd:apply",
    "recover": "applycmd:recover",
    "verify": "verifycmd:verify",
    "watch": "watchcmd:watch",
    "history": "historycmd:history",
    "completion": "complete:completion",
    "cluster": "clustercmd:cluster",
    "demo": "democmd:demo",
    "sim": "simcmd:sim",
    "fixtures": "fixturescmd:fixtures",
}

# command name -> its line in 'gputopo --help': what click makes of the command's docstring at
# 80 columns, kept here so that listing the commands imports none (tests/cli/test_cli_quick.py
# checks each against its command).
SUMMARIES: dict[str, str] = {
    "discover": "Show the GPUs of a host: NUMA node, IOMMU group, driver,...",
    "topo": "Show the PCIe tree: NUMA node, host bridge, root port,...",
    "snapshot": "Capture what discovery reads from a host into NAME.tar.gz...",
    "schema": "Print the JSON Schema of the spec file, or of the JSON...",
    "init": "Write a commented starter spec for this host: the split...",
    "export": "Write the host as it is now as a spec: 'gputopo plan --spec...",
    "plan": 'Show the target state and the ordered actions ("No changes"...',
    "show": "Print a plan saved with 'gputopo plan -o PLANFILE' as plan...",
    "render": "Write the files the plan stands for under --out, with a...",
    "diff": "Show how the host differs from the spec, by area, files as...",
    "apply": "Apply the spec, or a plan saved with 'gputopo plan -o...",
    "recover": "Settle an apply that was interrupted (crash, kill, power...",
    "verify": "Check the host against the spec from fresh facts:...",
    "watch": "Check the node against its spec without changing anything:...",
    "history": "List past applies from their journals, oldest first: when,...",
    "completion": "Print the completion script for SHELL; addresses, vmids,...",
    "cluster": "Plan, apply and verify one spec on every node of a Proxmox...",
    "demo": "Split the simulated seed host's GPUs by NUMA node:...",
    "sim": "A simulated Proxmox VE host: kernel sysfs, Proxmox API,...",
    "fixtures": "Host fixtures: compact descriptions built into real-layout...",
}

DESCRIPTION = """Move GPUs between an LXC container and VM passthrough on a Proxmox VE host.

discover -> plan -> render -> apply -> verify; diff at any time."""


def version_message() -> str:
    """What ``gputopo --version`` prints: the version, then the Python that runs it and the
    directory gputopo is imported from, so a bug report says which install it came from (the
    node's .deb under /usr/lib/gputopo, a pipx venv, a checkout)."""
    python = ".".join(str(n) for n in sys.version_info[:3])
    where = os.path.dirname(os.path.abspath(gputopo.__file__))
    # click formats the message with %: a '%' in a path must not be read as a placeholder
    install = f"Python {python} ({sys.executable})\nrunning from {where}"
    return "%(prog)s, version %(version)s\n" + install.replace("%", "%%")


ERROR = "gputopo: error: "  # the one prefix of every error line, whichever path prints it


def print_error(message: str) -> None:
    """``message`` on stderr, each of its lines as ``gputopo: error: <line>``."""
    for line in message.splitlines() or ["error"]:
        sys.stderr.write(f"{ERROR}{line}\n")
    sys.stderr.flush()


def report_error(e: BaseException) -> None:
    """Print an expected error as ``gputopo: error: <line>`` on stderr and exit with its code."""
    print_error(str(e) or type(e).__name__)
    sys.exit(getattr(e, "exit_code", 1))
