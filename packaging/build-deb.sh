#!/usr/bin/env bash
# Build gputopo's node package for one Debian release, from this checkout:
#
#   packaging/build-deb.sh bookworm|trixie [OUTDIR]
#
# writes OUTDIR/gputopo_<version>_<release>_amd64.deb (OUTDIR defaults to dist/). bookworm is
# Debian 12 (Proxmox VE 8, Python 3.11), trixie is Debian 13 (Proxmox VE 9, Python 3.13); either
# builds on any Linux machine with python3 (>= 3.11, with venv and pip), dpkg-deb, strip (binutils)
# and access to PyPI. No root is needed and nothing outside OUTDIR and a temporary directory is
# written.
#
# The package is a private virtual environment under /usr/lib/gputopo holding gputopo's wheel and
# the wheels of everything it needs (the [sim] extra included), fetched here for the release's
# Python and glibc, so that `apt install ./the.deb` needs no network on the node. Bytecode is
# compiled on the node by postinst (with the node's Python) and removed by prerm. The man pages
# and the bash completion script are generated from the CLI itself (packaging/gen-docs.py).
# The package is lintian-clean (.ci/run lints it): a changelog, a machine-readable copyright file
# (packaging/gen-copyright.py), stripped extension modules, xz members, md5sums, an Installed-Size
# with the bytecode counted, and packaging/debian/lintian-overrides for what is so on purpose.
# docs/operator-guide.md, "On a Proxmox node", says why it is built this way.
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
# Wheels ship their extension modules with symbols (lintian: unstripped-binary-or-object): strip
# them with dh_strip's options for a shared object, and give RECORD their new hashes and sizes.
find "$site" -type f -name '*.so' \
    -exec strip --remove-section=.comment --remove-section=.note --strip-unneeded {} +
"$work/tools/bin/python" - "$site" <<'EOF'
import base64, csv, hashlib, pathlib, sys
site = pathlib.Path(sys.argv[1])
for record in site.glob("*.dist-info/RECORD"):
    rows = list(csv.reader(record.read_text().splitlines()))
    for row in rows:
        if row[0].endswith(".so") and row[1]:
            data = (site / row[0]).read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            row[1:] = [f"sha256={digest}", str(len(data))]
    with record.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
EOF
# A venv as Python's venv module lays it out (PEP 405), for the release's interpreter.
mkdir -p "$stage$venv/bin"
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = %s\n' "$python_version" \
    >"$stage$venv/pyvenv.cfg"
# Relative symlinks (Debian policy 10.5, within /usr): /usr/lib/gputopo/bin/python3 is
# /usr/bin/python3.X, /usr/bin/gputopo is /usr/lib/gputopo/bin/gputopo.
ln -s "../../../bin/python$python_version" "$stage$venv/bin/python3"
ln -s python3 "$stage$venv/bin/python"
# -I: the operator's PYTHONPATH, PYTHONHOME and user site cannot change what gputopo imports.
printf '#!%s/bin/python3 -I\nimport sys\n\nfrom gputopo.cli import main\n\nsys.exit(main())\n' "$venv" \
    >"$stage$venv/bin/gputopo"
chmod 0755 "$stage$venv/bin/gputopo"
mkdir -p "$stage/usr/bin"
ln -s ../lib/gputopo/bin/gputopo "$stage/usr/bin/gputopo"

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
"$work/tools/bin/python" "$src/packaging/gen-copyright.py" "$src/packaging/debian/copyright" "$site" \
    "${site#"$stage/"}" "$doc/copyright"
for d in "$site"/*.dist-info; do basename "$d" .dist-info; done | sed 's/-/ /' >"$doc/bundled.txt"
# packaging/debian/changelog, whose first entry must be this version's, under an entry for this
# release's build, as a backport has one.
changelog=$src/packaging/debian/changelog
if [ "$(sed -n '1s/^gputopo (\([^)]*\)).*/\1/p' "$changelog")" != "$version-1" ]; then
    echo "build-deb: error: the first entry of $changelog is not $version-1" >&2
    exit 1
fi
{
    printf 'gputopo (%s) %s; urgency=medium\n\n' "$version-1~$revision" "$release"
    printf '  * Built for %s (Python %s).\n\n' "$release" "$python_version"
    printf ' -- %s  %s\n\n' "$maintainer" "$(date -u -R ${SOURCE_DATE_EPOCH:+-d "@$SOURCE_DATE_EPOCH"})"
    cat "$changelog"
} | gzip -9n >"$doc/changelog.Debian.gz"
mkdir -p "$stage/usr/share/lintian/overrides"
cp "$src/packaging/debian/lintian-overrides" "$stage/usr/share/lintian/overrides/gputopo"

# The drift watch's units (packaging/systemd), left disabled: docs/watch.md. bookworm's
# packages ship units under /lib, trixie's under /usr/lib (the /usr merge).
unitdir=/usr/lib/systemd/system
if [ "$release" = bookworm ]; then unitdir=/lib/systemd/system; fi
install -D -m 0644 -t "$stage$unitdir" "$src"/packaging/systemd/gputopo-watch{.service,.timer,-follow.service}

find "$stage" -type d -exec chmod 0755 {} +
find "$stage" -type f ! -path "$stage$venv/bin/gputopo" -exec chmod 0644 {} +

# Installed-Size as dpkg-gencontrol computes it (each file and symlink its size in KiB rounded up,
# anything else 1 KiB), plus, as its Extra-Size, the bytecode postinst compiles: compiled here the
# way postinst does, counted and removed. Bytecode is made on the node rather than shipped because
# only the release's interpreter makes the bytecode it reads, and the package builds on any
# machine: with the release's python3.X on PATH the count is exact, else the build's Python's
# bytecode stands in (3.11's for 3.13's: 6.6 % more, 2 % of the whole).
step "Installed-Size, with the bytecode postinst compiles"
kib() { find "$@" -printf '%y %s\n' | awk '{ n += ($1 == "f" || $1 == "l") ? int(($2 + 1023) / 1024) : 1 } END { print n + 0 }'; }
files_size=$(kib "$stage")
bytecode_python=python$python_version
"$bytecode_python" -c '' 2>/dev/null || bytecode_python=$python
"$bytecode_python" -I -m compileall -q -d "$venv/lib" "$stage$venv/lib" >/dev/null || true
bytecode_size=$(kib "$stage" -path '*/__pycache__*')
find "$stage" -depth -type d -name __pycache__ -exec rm -rf {} +
installed_size=$((files_size + bytecode_size))
mkdir -p "$stage/DEBIAN"
sed -e "s|@VERSION@|$version-1~$revision|" -e "s|@MAINTAINER@|$maintainer|" \
    -e "s|@INSTALLED_SIZE@|$installed_size|" -e "s|@PYTHON@|$python_version|" -e "s|@GLIBC@|$glibc|" \
    "$src/packaging/debian/control.in" >"$stage/DEBIAN/control"
install -m 0755 "$src"/packaging/debian/{postinst,prerm} "$stage/DEBIAN/"
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z \
    | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"

deb=$out/gputopo_${version}_${release}_amd64.deb
step "the package, xz-compressed"
# xz: dpkg reads zstd members since Debian 12, but Debian 12's lintian calls them malformed
# (malformed-deb-archive) and the archive's own packages are xz.
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
step "wrote $deb ($(du -k "$deb" | cut -f1) KiB; installed $installed_size KiB, $bytecode_size of them" \
    "bytecode by $("$bytecode_python" -c 'import sys; print(sys.version.split()[0])');" \
    "$(wc -l <"$doc/bundled.txt") distributions)"
