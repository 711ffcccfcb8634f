"""Shell completion: ``gputopo completion bash|zsh|fish`` prints the script (click's), and these
functions complete values from the host being worked on.

What completes, and from where (never the network: a completion must answer at once):

* PCI addresses of NVIDIA GPUs: ``sys/bus/pci/devices`` under ``--root`` (or the simulated
  host's root with ``--sim``, else ``/``), with each one's driver;
* container vmids, PCI mapping names and node names: Proxmox's files (``--pve-root``, the
  simulated host's, else ``/etc/pve``): ``nodes/*/lxc/*.conf``, ``mapping/pci.cfg``, ``nodes/*``;
* apply ids (``history show``): the journals under the root.

Each completer takes what the command line already says (``ctx.params``) and fails quietly:
a completion that cannot read anything offers nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from gputopo.exitcodes import with_exit_codes

SHELLS = ("bash", "zsh", "fish")


def _param(ctx: click.Context, name: str) -> Any:
    while ctx is not None:
        if ctx.params.get(name) is not None:
            return ctx.params[name]
        ctx = ctx.parent
    return None


def _root(ctx: click.Context) -> Path:
    sim = _param(ctx, "sim")
    if sim:
        return Path(sim) / "root"
    return Path(_param(ctx, "root") or "/")


def _pve(ctx: click.Context) -> Path:
    sim = _param(ctx, "sim")
    if sim:
        return Path(sim) / "pve"
    return Path(_param(ctx, "pve_root") or "/etc/pve")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _items(values: dict[str, str], incomplete: str) -> list[Any]:
    """CompletionItems (click.shell_completion is imported only when completing: --help stays light)."""
    from click.shell_completion import CompletionItem

    return [CompletionItem(v, help=h or None) for v, h in sorted(values.items()) if v.startswith(incomplete)]


def complete_addresses(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """NVIDIA GPUs (display class 0x03) under the root, with their driver."""
    out: dict[str, str] = {}
    devices = _root(ctx) / "sys/bus/pci/devices"
    try:
        names = os.listdir(devices)
    except OSError:
        return []
    for name in names:
        d = devices / name
        if _read(d / "vendor") != "0x10de" or not _read(d / "class").startswith("0x03"):
            continue
        link = d / "driver"
        out[name] = os.path.basename(os.readlink(link)) if link.is_symlink() else "no driver"
    return _items(out, incomplete)


def complete_vmids(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Containers of every node, with their hostname."""
    out: dict[str, str] = {}
    for conf in sorted(_pve(ctx).glob("nodes/*/lxc/*.conf")):
        if conf.stem.isdigit():
            host = next(
                (
                    ln.split(":", 1)[1].strip()
                    for ln in _read(conf).splitlines()
                    if ln.startswith("hostname:")
                ),
                "",
            )
            out[conf.stem] = f"CT {conf.stem} on {conf.parent.parent.name}" + (f" ({host})" if host else "")
    return _items(out, incomplete)


def complete_mappings(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """PCI mapping ids from ``mapping/pci.cfg`` (a section starts at a line without indentation)."""
    out: dict[str, str] = {}
    for line in _read(_pve(ctx) / "mapping/pci.cfg").splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            out[line.split()[0]] = "PCI mapping"
    return _items(out, incomplete)


def complete_nodes(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Node names: the directories under ``nodes/``."""
    try:
        names = [p.name for p in (_pve(ctx) / "nodes").iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        names = []
    return _items({n: "node" for n in names}, incomplete)


def complete_journal_ids(ctx: click.Context, incomplete: str) -> list[Any]:
    """Apply ids under the root (newest last), plus ``last``."""
    d = _root(ctx) / "var/lib/gputopo/journal"
    try:
        ids = {p.name[: -len(".jsonl")]: "apply" for p in d.iterdir() if p.name.endswith(".jsonl")}
    except OSError:
        ids = {}
    ids["last"] = "the newest apply"
    return _items(ids, incomplete)


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@with_exit_codes("completion")
def completion(shell: str) -> None:
    """Print the completion script for SHELL; addresses, vmids, mapping and node names complete
    from the host (--root, --sim or --pve-root given before them, else / and /etc/pve).

    \b
    bash:  gputopo completion bash > /etc/bash_completion.d/gputopo
    zsh:   gputopo completion zsh > "${fpath[1]}/_gputopo"
    fish:  gputopo completion fish > ~/.config/fish/completions/gputopo.fish
    """
    from click.shell_completion import get_completion_class

    from gputopo.cli import cli

    cls = get_completion_class(shell)
    click.echo(cls(cli, {}, "gputopo", "_GPUTOPO_COMPLETE").source(), nl=False)
