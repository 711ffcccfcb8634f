"""What an inference server's command line says: flavour, port, tensor parallelism, model."""

from __future__ import annotations

import argparse
import re


def service_flavor(argv: list[str]) -> str | None:
    """``"sglang"`` for ``python -m sglang.launch_server``, ``"vllm"`` for ``vllm serve``."""
    joined = " ".join(argv)
    if "sglang.launch_server" in joined:
        return "sglang"
    if re.search(r"(^|[/\s])vllm(\s+serve\b|\.entrypoints)", joined):
        return "vllm"
    return None


# the servers' own defaults: sglang ServerArgs.port, vllm's --port
DEFAULT_PORTS = {"sglang": 30000, "vllm": 8000}


def listening_port(argv: list[str]) -> int | None:
    """The port the server of ``argv`` listens on: ``--port``, else its flavour's default."""
    value = _flag(argv, ("--port",))
    if value is not None and value.isdigit():
        return int(value)
    return DEFAULT_PORTS.get(service_flavor(argv) or "")


def _flag(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of one option as the servers read it: both serve their flags with argparse
    (sglang ``ServerArgs.add_cli_args``, vLLM's ``FlexibleArgumentParser``), so ``--x V`` and
    ``--x=V`` both work and the last occurrence wins; a flag without its value counts as absent."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument(*names, dest="value")
    try:
        known, _ = parser.parse_known_args(argv)
    except argparse.ArgumentError:
        return None
    return known.value


def parse_tp(argv: list[str]) -> int:
    """The tensor-parallel size in a server command line (``--tp N``, ``--tp=N``, ``--tp-size``,
    ``--tensor-parallel-size``, vLLM's ``-tp``); 1 when absent.

    Raises ValueError when the value is not a positive integer.
    """
    raw = _flag(argv, ("--tp", "--tp-size", "--tensor-parallel-size", "-tp"))
    if raw is None:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"invalid tensor-parallel size {raw!r}")
    return int(raw)


def served_model(argv: list[str]) -> str:
    """The model name clients use: ``--served-model-name``, else the model path or id."""
    name = _flag(argv, ("--served-model-name",))
    if name:
        return name
    return model_path(argv) or "default"


def model_path(argv: list[str]) -> str | None:
    """The model a server loads: SGLang's ``--model-path``, vLLM's ``--model`` or the argument
    after ``serve``; None when the command names none."""
    path = _flag(argv, ("--model-path", "--model"))
    if path:
        return path
    if "serve" in argv:
        i = argv.index("serve")
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None
