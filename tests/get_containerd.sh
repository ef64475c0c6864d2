#!/bin/sh
# Debian's containerd of SUITE for tests/test_cri.py: trixie (Debian 13) has
# 1.7 (CRI, CDI and NRI), sid (unstable) 2.x.  Fetched without changing this
# machine's packages or apt sources: `apt-get download` with a sources list,
# lists and cache of its own, then `dpkg -x` into DEST.  Debian 12's own
# containerd (1.6) has no CDI.  The archive's address is the one this
# machine's apt already uses (read here, never written down in the
# repository).  Both packages need only glibc >= 2.34: they run on Debian 12.
#
#     tests/get_containerd.sh [SUITE [DEST]]
#
# SUITE: trixie (default) or sid; DEST: /var/cache/vgpulimit-tests/containerd-SUITE.
# Prints DEST/usr/bin, where containerd, ctr and containerd-shim-runc-v2 are;
# a DEST that has them already is used as it is.  Used by .ci/run (as root,
# with apt) and by the tests' fixture.
set -eu
suite=${1:-trixie}
case $suite in
    trixie|sid) ;;
    *) echo "get_containerd.sh: SUITE '$suite' is not one of: trixie, sid" >&2; exit 2 ;;
esac
dest=${2:-/var/cache/vgpulimit-tests/containerd-$suite}
if [ -x "$dest/usr/bin/containerd" ] && [ -x "$dest/usr/bin/ctr" ]; then
    echo "$dest/usr/bin"
    exit 0
fi
command -v apt-get >/dev/null && command -v dpkg >/dev/null \
    || { echo "get_containerd.sh: needs apt-get and dpkg (Debian)" >&2; exit 1; }

# The first Debian archive this machine's apt names (deb822 or one-line form),
# not its security archive.
archive=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
          | sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' | grep -v security | head -n 1)
if [ -z "$archive" ]; then
    archive=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
              | sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\).*/\2/p' \
              | grep -v security | head -n 1)
fi
[ -n "$archive" ] || { echo "get_containerd.sh: no Debian archive in this machine's apt sources" >&2; exit 1; }
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || { echo "get_containerd.sh: $keyring is missing (package debian-archive-keyring)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/deb"
echo "deb [signed-by=$keyring] $archive $suite main" > "$work/sources.list"
apt_private() {
    apt-get -q -o Dir::Etc::sourcelist="$work/sources.list" -o Dir::Etc::sourceparts=- \
        -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" \
        -o APT::Get::List-Cleanup=0 -o APT::Sandbox::User=root "$@"
}
apt_private update >&2
(cd "$work/deb" && apt_private download "containerd/$suite" >&2)
rm -rf "$dest.partial"
mkdir -p "$dest.partial"
dpkg -x "$work"/deb/containerd_*.deb "$dest.partial"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "$dest/usr/bin"
