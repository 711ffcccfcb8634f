#!/usr/bin/env bash
# Build gputopo's node package for one Debian release, from this checkout:
#
#   packaging/build-deb.sh bookworm|trixie [OUTDIR]
#
# writes OUTDIR/gputopo_<version>_<release>_amd64.deb (OUTDIR defaults to dist/). bookworm is
# Debian 12 (Proxmox VE 8, Python 3.11), trixie is Debian 13 (Proxmox VE 9, Python 3.13); either
# builds on any Linux machine with python3 (>= 3.11, with venv and pip), dpkg-deb and access to
# PyPI. No root is needed and nothing outside OUTDIR and a temporary directory is written.
#
# The package is a private virtual environment under /usr/lib/gputopo holding gputopo's wheel and
# the wheels of everything it needs (the [sim] extra included), fetched here for the release's
# Python and glibc, so that `apt install ./the.deb` needs no network on the node. Bytecode is
# compiled on the node by postinst (with the node's Python) and removed by prerm. The man pages
# and the bash completion script are generated from the CLI itself (packaging/gen-docs.py).
# README.md, "On a Proxmox node", says why it is built this way.
set -euo pipefail

release=${1:-}
case "$release" in
    bookworm) python_version=3.11 glibc=2.36 revision=deb12 ;;
    trixie)   python_version=3.13 glibc=2.41 revision=deb13 ;;
    *) echo "usage: $0 bookworm|trixie [OUTDIR]" >&2; exit 2 ;;
esac

src=$(cd "$(dirname "$0")/.." && pwd)
out=${2:-$src/dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=${PYTHON:-python3}          # the build's Python; the package runs on the release's own
maintainer=${DEBFULLNAME:-gputopo maintainers}" <${DEBEMAIL:-gputopo@example.invalid}>"
if [ -z "${SOURCE_DATE_EPOCH:-}" ] && git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    SOURCE_DATE_EPOCH=$(git -C "$src" log -1 --format=%ct)   # the man pages' date: the commit's
    export SOURCE_DATE_EPOCH
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/gputopo-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
umask 022
pip=("$work/tools/bin/python" -m pip --disable-pip-version-check -q)

started=$SECONDS
step() { echo "build-deb $release: [$((SECONDS - started)) s] $*" >&2; }

step "gputopo's wheel from $src"
"$python" -m venv "$work/tools"   # the build's tools, thrown away with the rest
"${pip[@]}" wheel --no-deps -w "$work/wheel" "$src"
wheel=$(echo "$work"/wheel/gputopo-*.whl)
version=$(basename "$wheel" | cut -d- -f2)

step "the private environment /usr/lib/gputopo for Python $python_version, glibc $glibc"
stage=$work/root
# /usr/lib/gputopo rather than /opt/gputopo: /opt belongs to no package (base-files' postinst makes
# it), so removing a package that shipped /opt/gputopo takes an empty /opt away with it.
venv=/usr/lib/gputopo
site=$stage$venv/lib/python$python_version/site-packages
# Only wheels that run on the release: its Python's ABI (or abi3, or pure), and manylinux tags no
# newer than its glibc (pip does not widen a PEP 600 tag given with --platform by itself).
platforms=()
for ((minor = ${glibc#2.}; minor >= 17; minor--)); do
    platforms+=(--platform "manylinux_2_${minor}_x86_64")
done
platforms+=(--platform manylinux2014_x86_64)   # pip widens this one to manylinux2010 and manylinux1
"${pip[@]}" install --no-compile --target "$site" --python-version "$python_version" \
    --only-binary=:all: "${platforms[@]}" "$wheel[sim]"
rm -rf "$site/bin"   # console scripts written for the build's Python; the launcher is below
# pip records where it took gputopo's wheel from: a directory of this build, meaningless on a node
rm -f "$site"/gputopo-*.dist-info/direct_url.json
sed -i '/direct_url\.json/d' "$site"/gputopo-*.dist-info/RECORD
# A venv as Python's venv module lays it out (PEP 405), for the release's interpreter.
mkdir -p "$stage$venv/bin"
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = %s\n' "$python_version" \
    >"$stage$venv/pyvenv.cfg"
ln -s "/usr/bin/python$python_version" "$stage$venv/bin/python3"
ln -s python3 "$stage$venv/bin/python"
# -I: the operator's PYTHONPATH, PYTHONHOME and user site cannot change what gputopo imports.
printf '#!%s/bin/python3 -I\nimport sys\n\nfrom gputopo.cli import main\n\nsys.exit(main())\n' "$venv" \
    >"$stage$venv/bin/gputopo"
chmod 0755 "$stage$venv/bin/gputopo"
mkdir -p "$stage/usr/bin"
ln -s "$venv/bin/gputopo" "$stage/usr/bin/gputopo"

step "man pages and bash completion, generated from the CLI"
"${pip[@]}" install 'click-man>=0.5' "$wheel[sim]"
"$work/tools/bin/python" "$src/packaging/gen-docs.py" --man "$work/man" \
    --bash "$stage/usr/share/bash-completion/completions/gputopo"
mkdir -p "$stage/usr/share/man/man1"
for page in "$work"/man/*.1; do
    gzip -9n <"$page" >"$stage/usr/share/man/man1/$(basename "$page").gz"
done

doc=$stage/usr/share/doc/gputopo
mkdir -p "$doc"
cp "$src/packaging/debian/copyright" "$doc/copyright"
for d in "$site"/*.dist-info; do basename "$d" .dist-info; done | sed 's/-/ /' >"$doc/bundled.txt"

# The drift watch's units (packaging/systemd), left disabled: README, "Drift watch". bookworm's
# packages ship units under /lib, trixie's under /usr/lib (the /usr merge).
unitdir=/usr/lib/systemd/system
if [ "$release" = bookworm ]; then unitdir=/lib/systemd/system; fi
install -D -m 0644 -t "$stage$unitdir" "$src"/packaging/systemd/gputopo-watch{.service,.timer,-follow.service}

find "$stage" -type d -exec chmod 0755 {} +
find "$stage" -type f ! -path "$stage$venv/bin/gputopo" -exec chmod 0644 {} +

mkdir -p "$stage/DEBIAN"
installed_size=$(du -sk --apparent-size "$stage" | cut -f1)
sed -e "s|@VERSION@|$version-1~$revision|" -e "s|@MAINTAINER@|$maintainer|" \
    -e "s|@INSTALLED_SIZE@|$installed_size|" -e "s|@PYTHON@|$python_version|" -e "s|@GLIBC@|$glibc|" \
    "$src/packaging/debian/control.in" >"$stage/DEBIAN/control"
install -m 0755 "$src"/packaging/debian/{postinst,prerm} "$stage/DEBIAN/"

deb=$out/gputopo_${version}_${release}_amd64.deb
# zstd: read by dpkg since Debian 12; xz at its default level takes 20 times as long for 15 % less
dpkg-deb --root-owner-group -Zzstd -z10 --build "$stage" "$deb" >/dev/null
step "wrote $deb ($(du -k "$deb" | cut -f1) KiB; installed $installed_size KiB; $(wc -l <"$doc/bundled.txt") distributions)"
