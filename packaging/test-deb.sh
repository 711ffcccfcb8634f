#!/usr/bin/env bash
# Install a gputopo .deb the way an operator does, use it, remove it, and check what is left:
#
#   packaging/test-deb.sh dist/gputopo_<version>_<release>_amd64.deb
#
# Run as root on the Debian release the package is for (CI's machine for bookworm; a chroot made
# by packaging/test-chroot.sh for trixie). apt installs and removes the package with no network
# (unshare --net); every command then runs from / in a clean root environment, as on a node:
# gputopo --version, gputopo demo, man and whatis, and the bash completion script through
# bash-completion's own loader. After `apt-get remove` no file of the package may remain, and
# nothing else may have appeared but the operator's journals (/var/lib/gputopo). Exits non-zero
# at the first thing that is not as it should be.
set -euo pipefail

fail() { echo "test-deb: FAIL: $*" >&2; exit 1; }
say() { echo "test-deb: $*" >&2; }

[ $# = 1 ] && [ -f "$1" ] || { echo "usage: $0 PACKAGE.deb" >&2; exit 2; }
deb=$(readlink -f "$1")
[ "$(id -u)" = 0 ] || fail "needs root (apt-get install)"
if dpkg-query -W -f '${Status}' gputopo 2>/dev/null | grep -q installed; then
    fail "gputopo is already installed here; remove it first"
fi
version=$(dpkg-deb -f "$deb" Version)
python=$(dpkg-deb -f "$deb" Depends | grep -o 'python3\.[0-9]*' | head -n1)

# An operator's root shell on a node: no virtualenv, no PYTHONPATH, started from /.
node() { (cd / && env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM=dumb MANWIDTH=100 "$@"); }

# Where a package's files, and anything its scripts made, could be; apt's and dpkg's own records
# and logs change by design and are left out, and so is man-db's index: its trigger updates it for
# any package with man pages and runs mandb without purging (-p); its daily job drops stale pages.
listing() {
    local d dirs=()
    for d in /usr /opt /etc /var; do [ -d "$d" ] && dirs+=("$d"); done
    find "${dirs[@]}" -xdev \( -path /var/lib/dpkg -o -path /var/lib/apt -o -path /var/cache/apt \
        -o -path /var/cache/debconf -o -path /var/cache/man -o -path /var/log -o -path /var/tmp \) \
        -prune -o -print | sort
}

before=$(mktemp)
after=$(mktemp)
cleanup() {  # a failed run does not leave the package installed for the next one to trip over
    rm -f "$before" "$after"
    if dpkg-query -W -f '${Status}' gputopo 2>/dev/null | grep -q installed; then
        apt-get remove -y -qq gputopo >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT
listing >"$before"

say "installing $(basename "$deb") ($version) with apt, without network"
export DEBIAN_FRONTEND=noninteractive
t0=$SECONDS
unshare --net apt-get install -y -qq --no-install-recommends "$deb" >/dev/null \
    || fail "apt-get install $deb without network"
say "installed in $((SECONDS - t0)) s"
# Installed-Size against what is on the disk now, postinst's bytecode included, counted as
# dpkg-gencontrol counts (each file and symlink its size in KiB rounded up, anything else 1 KiB).
# Within 3 %: a package built without the release's python3.X on PATH counts the build's Python's
# bytecode instead (3.11's is 6.6 % larger than 3.13's: 2 % of the whole); leaving the bytecode
# out, as the package once did, is 29 % short.
declared=$(dpkg-query -W -f '${Installed-Size}' gputopo)
real=$({ dpkg -L gputopo; find /usr/lib/gputopo -path '*/__pycache__*'; } | sort -u \
    | xargs -d '\n' stat -c '%F|%s' \
    | awk -F'|' '{ n += ($1 ~ /^(regular|symbolic)/) ? int(($2 + 1023) / 1024) : 1 } END { print n }')
say "Installed-Size $declared KiB; on the disk $real KiB (files and bytecode, in KiB as dpkg counts)"
off=$((declared > real ? declared - real : real - declared))
[ $((off * 100)) -le $((real * 3)) ] || fail "Installed-Size $declared KiB is not within 3 % of $real KiB"
[ "$(node sh -c 'command -v gputopo')" = /usr/bin/gputopo ] || fail "gputopo is not /usr/bin/gputopo on PATH"

say "gputopo --version"
out=$(node gputopo --version) || fail "gputopo --version exited $?"
echo "$out"
[ "$(echo "$out" | sed -n 1p)" = "gputopo, version ${version%%-*}" ] || fail "--version: first line"
echo "$out" | sed -n 2p | grep -Eq "^Python ${python#python}\.[0-9]+ \(/usr/lib/gputopo/bin/python3\)$" \
    || fail "--version: not $python of /usr/lib/gputopo"
[ "$(echo "$out" | sed -n 3p)" = "running from /usr/lib/gputopo/lib/${python}/site-packages/gputopo" ] \
    || fail "--version: not running from /usr/lib/gputopo"

say "gputopo demo"
t0=$SECONDS
out=$(node gputopo demo 2>&1) || { echo "$out" | tail -n 30; fail "gputopo demo exited non-zero"; }
echo "$out" | tail -n 4
echo "$out" | grep -q "all clear: 8 PASS" || fail "gputopo demo did not end 'all clear: 8 PASS'"
# the simulated container's model ships in the package: the plan sizes it
echo "$out" | grep -q "qwen3 at tp 4: weights 55.1 GiB per GPU" || fail "gputopo demo has no capacity line"
say "demo took $((SECONDS - t0)) s"

say "man gputopo"
out=$(node man gputopo) || fail "man gputopo"
echo "$out" | sed -n 1,6p
echo "$out" | grep -q "See gputopo-apply(1)" || fail "man gputopo does not list apply"
node man gputopo-sim-serve | grep -q -- "--from" || fail "man gputopo-sim-serve has no --from"
node whatis gputopo-verify | grep -q "Check the host against the spec" \
    || fail "whatis gputopo-verify: the man-db index does not know the page"

say "bash completion, loaded by bash-completion from the installed script"
out=$(node bash -c '
    . /usr/share/bash-completion/bash_completion
    # bash-completion loads a command'"'"'s script on the first TAB; its loader is renamed in 2.12
    if declare -F _comp_load >/dev/null; then _comp_load gputopo; else __load_completion gputopo; fi
    complete -p gputopo >/dev/null || exit 3
    for line in "gputopo di" "gputopo sim c" "gputopo apply --sp"; do
        read -ra COMP_WORDS <<<"$line"
        COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
        COMPREPLY=()
        _gputopo_completion gputopo
        echo "$line -> ${COMPREPLY[*]}"
    done') || fail "bash completion did not load (exit $?)"
echo "$out"
echo "$out" | grep -qx "gputopo di -> diff discover" || fail "completion of 'gputopo di'"
echo "$out" | grep -qx "gputopo sim c -> cluster-ssh create" || fail "completion of 'gputopo sim c'"
echo "$out" | grep -qx "gputopo apply --sp -> --spec" || fail "completion of 'gputopo apply --sp'"

say "apt-get remove gputopo"
unshare --net apt-get remove -y -qq gputopo >/dev/null || fail "apt-get remove gputopo"
status=$(dpkg-query -W -f '${Status}' gputopo 2>/dev/null || true)
[ -z "$status" ] || [ "$status" = "unknown ok not-installed" ] || fail "dpkg still knows gputopo: $status"
listing >"$after"
left=$(comm -13 "$before" "$after" | grep -v '^/var/lib/gputopo\(/\|$\)' || true)
[ -z "$left" ] || { echo "$left" | head -n 20; fail "apt-get remove left the files above"; }
! node man -w gputopo >/dev/null 2>&1 || fail "man still finds a gputopo page after the remove"
gone=$(comm -23 "$before" "$after")
[ -z "$gone" ] || { echo "$gone" | head -n 20; fail "installing and removing gputopo took the files above away"; }
if [ -d /var/lib/gputopo ]; then say "kept: /var/lib/gputopo (journals)"; fi
say "PASS: $(basename "$deb") installs offline, runs, removes cleanly"
