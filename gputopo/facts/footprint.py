"""A container's served model read without loading it (edge layer: this is I/O).

From the service's command (:func:`gputopo.formats.modelfiles.served_args`), through a
:class:`gputopo.ports.ContainerFilesPort`: ``config.json``, ``model.safetensors.index.json``
(or a single ``model.safetensors``), then of each safetensors file its 8-byte header length and
its JSON header, never a weight. The GPUs' memory from ``nvidia-smi`` inside the container.
What cannot be read is one line saying why: the plan prints it instead of a capacity.
"""

from __future__ import annotations

import json
import posixpath

from gputopo.errors import GputopoError
from gputopo.facts.ctread import ExecContainerFiles
from gputopo.formats.modelfiles import (
    CONFIG_MAX,
    INDEX_MAX,
    attention_of,
    header_length,
    header_tensors,
    index_files,
    layer_count,
    served_args,
    weights_of,
)
from gputopo.model.footprint import ModelFootprint
from gputopo.model.reads import EXEC_TIMEOUT
from gputopo.model.state import CurrentState
from gputopo.ports import ContainerFilesPort, ExecPort

NVSMI_MEMORY = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]


class Unread(Exception):
    """Why a footprint could not be read (one line)."""


def _need(files: ContainerFilesPort, vmid: int, path: str, offset: int, length: int) -> bytes:
    got = files.read(vmid, path, offset, length)
    if got is None:
        raise Unread(f"no {path} in the container")
    return got


def _tensors(files: ContainerFilesPort, vmid: int, model: str) -> tuple[dict[str, int], int]:
    """Every tensor's bytes of the model's safetensors files, and how many files."""
    index = files.read(vmid, posixpath.join(model, "model.safetensors.index.json"), 0, INDEX_MAX)
    try:
        names = index_files(index.decode()) if index is not None else ["model.safetensors"]
    except ValueError as e:
        raise Unread(str(e)) from None
    tensors: dict[str, int] = {}
    for name in names:
        path = posixpath.join(model, name)
        try:
            n = header_length(_need(files, vmid, path, 0, 8))
            tensors.update(header_tensors(_need(files, vmid, path, 8, n).decode(errors="replace")))
        except ValueError as e:
            raise Unread(f"{path}: {e}") from None
    return tensors, len(names)


def gpu_memory_mib(exec: ExecPort, vmid: int) -> int | None:
    """The smallest memory.total (MiB) of the GPUs the container sees; None when none is told."""
    try:
        res = exec.run(vmid, NVSMI_MEMORY, EXEC_TIMEOUT)
    except GputopoError:
        return None
    values = [int(v) for v in res.stdout.split() if v.strip().isdigit()] if res.rc == 0 else []
    return min(values) if values else None


def read_footprint(
    files: ContainerFilesPort, exec: ExecPort, vmid: int, command: str
) -> tuple[ModelFootprint | None, str | None]:
    """(the footprint of the model ``command`` serves in container ``vmid``, None) or (None,
    why it could not be read, one line)."""
    args = served_args(command)
    if args is None:
        return None, "the service's command names no model path"
    if not args.path.startswith("/"):
        return None, f"{args.path} is a hub id, not a directory (its files are in the hub cache)"
    try:
        raw = _need(files, vmid, posixpath.join(args.path, "config.json"), 0, CONFIG_MAX)
        config = json.loads(raw.decode(errors="replace"))
        if not isinstance(config, dict):
            raise Unread(f"{args.path}/config.json is not a JSON object")
        attention = attention_of(config)
        tensors, count = _tensors(files, vmid, args.path)
    except (Unread, ValueError) as e:
        return None, str(e)
    except GputopoError as e:
        return None, f"the container's files cannot be read ({str(e).splitlines()[0]})"
    weights = weights_of(tensors, layer_count(config), count)
    return (
        ModelFootprint(
            path=args.path,
            engine=args.engine,  # type: ignore[arg-type]
            name=args.served_name or posixpath.basename(args.path.rstrip("/")) or args.path,
            model_type=config.get("model_type"),
            attention=attention,
            weights=weights,
            kv_cache_dtype=args.kv_cache_dtype,
            mem_fraction=args.mem_fraction,
            gpu_memory_mib=gpu_memory_mib(exec, vmid),
        ),
        None,
    )


def read_footprints(current: CurrentState, files: ContainerFilesPort | None, exec: ExecPort | None) -> None:
    """Each running container's served model into its state (``footprint``, or
    ``footprint_unread`` saying why not); containers without a service read are left alone."""
    for vmid, ct in current.containers.items():
        svc = ct.service
        if ct.status != "running" or svc is None or not svc.exec_start:
            if ct.service_error:
                ct.footprint_unread = f"the container cannot be looked into here: {ct.service_error}"
            continue
        if exec is None:
            ct.footprint_unread = "nothing here can look inside the container"
            continue
        ct.footprint, ct.footprint_unread = read_footprint(
            files or ExecContainerFiles(exec), exec, vmid, svc.exec_start
        )
