#!/usr/bin/env bash
# Test gputopo's package for a Debian release in a fresh chroot of that release:
#
#   packaging/test-chroot.sh trixie [PACKAGE.deb]
#
# builds the package with packaging/build-deb.sh unless one is given, makes a minimal chroot of
# the release from Debian's package registry with mmdebstrap, holding what a Proxmox VE node of
# that release already has and the package relies on (python3: ifupdown2, Proxmox VE's network
# stack, is written in Python; man-db; bash-completion), and runs packaging/test-deb.sh inside it:
# apt install without network, --version, demo, man, completion, apt remove, what is left.
# The chroot is deleted afterwards. Needs root, mmdebstrap (apt-get install mmdebstrap) and
# access to Debian's registry (and to PyPI when it builds).
set -euo pipefail

release=${1:-}
case "$release" in
    bookworm|trixie) ;;
    *) echo "usage: $0 bookworm|trixie [PACKAGE.deb]" >&2; exit 2 ;;
esac
src=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "test-chroot: needs root (mmdebstrap, chroot)" >&2; exit 2; }
command -v mmdebstrap >/dev/null || { echo "test-chroot: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 2; }

t_start=$SECONDS
deb=${2:-}
if [ -z "$deb" ]; then
    "$src/packaging/build-deb.sh" "$release"
    deb=$(ls "$src"/dist/gputopo_*_"${release}"_amd64.deb | tail -n1)
fi
deb=$(readlink -f "$deb")

root=$(mktemp -d "${TMPDIR:-/tmp}/gputopo-$release-chroot.XXXXXX")
trap 'rm -rf "$root"' EXIT
t0=$SECONDS
mmdebstrap --quiet --variant=minbase --include=python3,man-db,bash-completion "$release" "$root"
echo "test-chroot: $release chroot made in $((SECONDS - t0)) s ($(du -sm "$root" | cut -f1) MiB)" >&2

cp "$deb" "$src/packaging/test-deb.sh" "$root/tmp/"
# proc, pseudo-terminals (apt logs through one) and shared memory, in a mount namespace of their
# own: they vanish with it, so nothing is left mounted under the chroot when it is deleted.
unshare --mount --propagation private sh -ec '
    mount -t proc proc "$1/proc"
    mount -t devpts -o newinstance,ptmxmode=0666 devpts "$1/dev/pts"
    mount -t tmpfs tmpfs "$1/dev/shm"
    chroot "$1" /bin/bash /tmp/test-deb.sh "/tmp/$2"
' sh "$root" "$(basename "$deb")"
echo "test-chroot: $release done in $((SECONDS - t_start)) s" >&2
