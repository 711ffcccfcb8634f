"""What pve-container's setup says about a container's distribution when the container starts.

The prestart hook (pve-container ``lxc-pve-prestart-hook``) runs ``PVE::LXC::Setup->new`` with
a ``log_warn`` that writes into ``/run/pve/ct-<vmid>.warnings``; ``vm_start`` then passes each
line to ``RESTEnvironment::log_warn`` (``LXC.pm`` ``print_ct_warn_log``), so the start task ends
``WARNINGS: N``. The distribution plugins (``LXC/Setup/Ubuntu.pm``, ``LXC/Setup/Debian.pm``)
warn about a release newer than pve-container knows and refuse one it cannot run.

:func:`start_warnings` is that check for the ``ostype`` in a container's config, reading the
release files under its rootfs (a simulated container without them is not checked).
"""

from __future__ import annotations

import re
from pathlib import Path

from gputopo.errors import ContainerStartError

# LXC/Setup/Ubuntu.pm $known_versions
UBUNTU_KNOWN = frozenset(
    {
        "26.10",
        "26.04",
        "25.10",
        "25.04",
        "24.10",
        "24.04",
        "23.10",
        "23.04",
        "22.10",
        "22.04",
        "21.10",
        "21.04",
        "20.10",
        "20.04",
        "19.10",
        "19.04",
        "18.10",
        "18.04",
        "17.10",
        "17.04",
        "16.10",
        "16.04",
        "15.10",
        "15.04",
        "14.04",
        "12.04",
    }
)
# LXC/Setup/Debian.pm DEBIAN_MINIMUM_RELEASE / DEBIAN_MAXIMUM_RELEASE (the latter a soft limit)
DEBIAN_MIN, DEBIAN_MAX = 4, 14


def ubuntu_warnings(lsb_release: str) -> list[str]:
    """Ubuntu.pm ``new``: the warning for a release not in the known list. Raises
    ContainerStartError (the start fails) for one older than 17.04 or unparsable."""
    m = re.search(r"^DISTRIB_RELEASE=(\d+\.\d+)$", lsb_release, re.MULTILINE | re.IGNORECASE)
    if m is None:
        raise ContainerStartError("unable to read version info")
    version = m.group(1)
    if version in UBUNTU_KNOWN:
        return []
    if int(version.split(".")[0]) < 17:
        raise ContainerStartError(f"unsupported ancient Ubuntu version '{version}'")
    return [
        f"The container's Ubuntu version '{version}' is not in the known version list. As it's newer "
        "than the minimum supported version it's likely to work OK, but full compatibility cannot be "
        "guaranteed. Please check for PVE system updates."
    ]


def debian_warnings(debian_version: str) -> list[str]:
    """Debian.pm ``new``: the warning for a release past the tested one. Raises
    ContainerStartError for one too old or unparsable."""
    text = debian_version.strip().splitlines()[0] if debian_version.strip() else ""
    m = re.match(r"^(\d+)(\.\d+)?", text)
    if m is None:
        raise ContainerStartError(f"unable to parse version info '{text}'")
    version = int(m.group(1))
    if version < DEBIAN_MIN:
        raise ContainerStartError(f"Container Debian version '{version}' is too old")
    if version >= DEBIAN_MAX + 1:
        return [
            f"The container's Debian version '{version}' is newer than the tested version '{DEBIAN_MAX}'. "
            "While everything may work fine, full compatibility cannot be guaranteed. Please check for "
            "PVE system updates."
        ]
    return []


def start_warnings(rootfs: Path, ostype: str | None) -> list[str]:
    """The warnings a start of a container of ``ostype`` with files under ``rootfs`` logs.
    Raises ContainerStartError when the release is one pve-container refuses."""
    if ostype == "ubuntu" and (rootfs / "etc/lsb-release").is_file():
        return ubuntu_warnings((rootfs / "etc/lsb-release").read_text())
    if ostype == "debian" and (rootfs / "etc/debian_version").is_file():
        return debian_warnings((rootfs / "etc/debian_version").read_text())
    return []


def lsb_release(version: str) -> str:
    """An Ubuntu ``/etc/lsb-release`` naming ``version``."""
    return f'DISTRIB_ID=Ubuntu\nDISTRIB_RELEASE={version}\nDISTRIB_DESCRIPTION="Ubuntu {version}"\n'
