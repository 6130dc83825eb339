#!/usr/bin/env bash
# Builds the Debian package with cargo-deb, lists it, checks that the expected files,
# conffiles and maintainer scripts are in it, and runs lintian (fails on errors).
#
#   scripts/check-package.sh            # package left in target/deb-check/debian/
#
# Needs: cargo-deb (cargo install cargo-deb --locked), lintian, dpkg-deb; optional:
# systemd-analyze (verifies the packaged unit against the packaged binary).
# STALLWATCH_DEB_TARGET_DIR overrides the cargo target directory it builds in (its own
# by default, so it can run while another cargo holds target/).
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$PWD
target_dir=${STALLWATCH_DEB_TARGET_DIR:-$repo/target/deb-check}

fail() { echo "check-package: FAIL: $*" >&2; exit 1; }

for t in cargo-deb lintian dpkg-deb; do
    command -v "$t" >/dev/null || fail "$t not found (cargo-deb: cargo install cargo-deb --locked; lintian: apt-get install lintian)"
done
grep -q '^\[package\.metadata\.deb\]' Cargo.toml \
    || fail "Cargo.toml has no [package.metadata.deb] section"

out=$(mktemp -d)
extract=$(mktemp -d)
trap 'rm -rf "$out" "$extract"' EXIT

echo "== cargo deb (target dir $target_dir)"
CARGO_TARGET_DIR=$target_dir cargo deb --locked --output "$out/"
deb=$(ls "$out"/*.deb)
[ "$(ls "$out"/*.deb | wc -l)" -eq 1 ] || fail "expected one .deb in $out"
mkdir -p "$target_dir/debian"
cp "$deb" "$target_dir/debian/"
echo "== $(basename "$deb")"

echo "== control"
dpkg-deb --info "$deb"
echo "== contents"
dpkg-deb --contents "$deb"

files=$(dpkg-deb --fsys-tarfile "$deb" | tar -t)
for f in \
    ./usr/bin/stallwatch \
    ./usr/lib/systemd/system/stallwatch.service \
    ./etc/stallwatch/config.yaml \
    ./usr/share/doc/stallwatch/copyright \
    ./usr/share/doc/stallwatch/changelog.Debian.gz \
    ./usr/share/doc/stallwatch/README.md \
    ./usr/share/doc/stallwatch/docs/alerts.md \
    ./usr/share/doc/stallwatch/docs/install.md \
    ./usr/share/man/man1/stallwatch.1.gz \
    ./usr/share/lintian/overrides/stallwatch \
    ./usr/share/doc/stallwatch/examples/config.example.yaml \
    ./usr/share/doc/stallwatch/examples/mounts.conf.example \
    ./usr/share/doc/stallwatch/examples/stallwatch.socket \
    ./usr/share/doc/stallwatch/examples/socket-activation.conf.example \
    ./usr/share/doc/stallwatch/examples/prometheus.yml \
    ./usr/share/doc/stallwatch/examples/stallwatch.rules.yml \
    ./usr/share/doc/stallwatch/examples/grafana-stallwatch.json \
    ./usr/share/doc/stallwatch/examples/stallwatch.recording.rules.yml \
    ./usr/share/doc/stallwatch/examples/grafana-stallwatch-fleet.json \
    ./usr/share/doc/stallwatch/examples/alertmanager.example.yml
do
    grep -qxF "$f" <<<"$files" || fail "$f missing from the package"
done

dpkg-deb --extract "$deb" "$extract/root"
dpkg-deb --control "$deb" "$extract/control"

# Installed content is the repository's, byte for byte.
cmp systemd/stallwatch.service "$extract/root/usr/lib/systemd/system/stallwatch.service" \
    || fail "packaged unit differs from systemd/stallwatch.service"
cmp config.example.yaml "$extract/root/etc/stallwatch/config.yaml" \
    || fail "packaged config differs from config.example.yaml"
# Every page of the reference, as the README links it (docs/alerts.md is where the
# alerts' runbook_url points).
for f in docs/*.md; do
    cmp "$f" "$extract/root/usr/share/doc/stallwatch/$f" || fail "packaged $f differs from $f (or is missing)"
done
for f in deploy/stallwatch.rules.yml:stallwatch.rules.yml \
         deploy/stallwatch.recording.rules.yml:stallwatch.recording.rules.yml \
         grafana/stallwatch.json:grafana-stallwatch.json \
         grafana/stallwatch-fleet.json:grafana-stallwatch-fleet.json \
         deploy/alertmanager.example.yml:alertmanager.example.yml; do
    cmp "${f%%:*}" "$extract/root/usr/share/doc/stallwatch/examples/${f##*:}" \
        || fail "packaged ${f##*:} differs from ${f%%:*}"
done
[ -x "$extract/root/usr/bin/stallwatch" ] || fail "usr/bin/stallwatch is not executable"
"$extract/root/usr/bin/stallwatch" --version || fail "the packaged binary does not run"
"$extract/root/usr/bin/stallwatch" check-config "$extract/root/etc/stallwatch/config.yaml" \
    || fail "the packaged config does not pass check-config"

# The socket unit is an example, not an installed (and enabled) unit: installed, it would
# hold port 19858 against the agent's own listener.
[ ! -e "$extract/root/usr/lib/systemd/system/stallwatch.socket" ] \
    || fail "stallwatch.socket is installed as a unit; it is an example only"
cmp systemd/examples/stallwatch.socket "$extract/root/usr/share/doc/stallwatch/examples/stallwatch.socket" \
    || fail "packaged socket example differs from systemd/examples/stallwatch.socket"

# Control data: the config is a conffile, the user is created, the unit enabled.
grep -qxF /etc/stallwatch/config.yaml "$extract/control/conffiles" \
    || fail "/etc/stallwatch/config.yaml is not a conffile"
grep -q '^Depends:.*\badduser\b' "$extract/control/control" || fail "Depends lacks adduser"
grep -q 'adduser .*--system' "$extract/control/postinst" || fail "postinst does not create the system user"
grep -q 'deb-systemd-helper enable stallwatch.service' "$extract/control/postinst" \
    || fail "postinst does not enable the unit"
grep -q 'deb-systemd-invoke stop stallwatch.service' "$extract/control/prerm" \
    || fail "prerm does not stop the unit"
grep -q 'purge' "$extract/control/postrm" || fail "postrm has no purge branch"
for s in postinst prerm postrm; do
    sh -n "$extract/control/$s" || fail "$s: shell syntax error"
    [ -x "$extract/control/$s" ] || fail "$s is not executable"
done

# The packaged unit against the packaged binary (ExecStart pointed into the extract).
if command -v systemd-analyze >/dev/null; then
    echo "== systemd-analyze verify (packaged unit)"
    mkdir "$extract/units"
    sed "s#^ExecStart=/usr/bin/stallwatch #ExecStart=$extract/root/usr/bin/stallwatch #" \
        "$extract/root/usr/lib/systemd/system/stallwatch.service" > "$extract/units/stallwatch.service"
    man_check=--man=yes
    command -v man >/dev/null || { echo "(man not installed: not checking man:stallwatch(1))"; man_check=--man=no; }
    verify_log=$(SYSTEMD_UNIT_PATH="$extract/units:" MANPATH="$extract/root/usr/share/man" systemd-analyze verify \
        "$man_check" "$extract/units/stallwatch.service" 2>&1) || { echo "$verify_log"; fail "systemd-analyze verify"; }
    if grep -q stallwatch <<<"$verify_log"; then echo "$verify_log"; fail "systemd-analyze verify complained"; fi
fi

echo "== lintian"
# Warnings are shown, errors fail.
lintian --fail-on error --display-info --tag-display-limit 0 "$deb"
echo "check-package: OK: $(basename "$deb")"
