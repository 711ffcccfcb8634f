#!/usr/bin/env bash
# Lint gputopo's node packages with lintian, as Debian's archive checks a package:
#
#   packaging/lint-deb.sh dist/gputopo_*.deb
#
# Prints lintian's report of each package (its errors and warnings, and the tags that
# packaging/debian/lintian-overrides overrides, with their reasons) and exits 1 if any error or
# warning is not overridden, or lintian itself fails. (lintian --fail-on cannot be used with
# --show-overrides: that counts an overridden tag as a failure too.)
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 PACKAGE.deb..." >&2; exit 2; }
command -v lintian >/dev/null || { echo "lint-deb: FAIL: lintian is not installed" >&2; exit 1; }
failed=0
for deb; do
    rc=0
    report=$(lintian --show-overrides --tag-display-limit 0 "$deb" 2>&1) || rc=$?
    echo "lint-deb: lintian $(lintian --print-version) on $(basename "$deb"):"
    [ -z "$report" ] || echo "$report"
    errors=$(grep -c '^E: ' <<<"$report" || true)
    warnings=$(grep -c '^W: ' <<<"$report" || true)
    overridden=$(grep -c '^O: ' <<<"$report" || true)
    echo "lint-deb: $(basename "$deb"): $errors errors, $warnings warnings, $overridden overridden"
    # exit 2 is lintian's "tags were found" (overridden ones too, with --show-overrides)
    if [ "$rc" != 0 ] && [ "$rc" != 2 ]; then
        echo "lint-deb: FAIL: lintian exited $rc on $deb" >&2
        failed=1
    elif [ "$errors" != 0 ] || [ "$warnings" != 0 ]; then
        echo "lint-deb: FAIL: $deb has errors or warnings that are not overridden" >&2
        failed=1
    fi
done
exit "$failed"
