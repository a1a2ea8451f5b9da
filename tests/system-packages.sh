#!/bin/sh
# Installs the Debian packages the test suite drives for real: FUSE layers (bindfs,
# sshfs with a private sshd, the power-cut filesystem's libfuse 3), zsh for completion,
# one-machine CephFS and GlusterFS clusters, and the RabbitMQ and Redis references.
#
# Only as root with apt-get; otherwise it prints what to install and the tests that
# need a missing package skip, saying so. apt is kept from starting any service: the
# tests start their own daemons on private ports and directories.
set -eu

PACKAGES="sshfs openssh-server openssh-client zsh bindfs fuse3 libfuse3-dev pkg-config
ceph-mon ceph-osd ceph-mds ceph-fuse ceph-common glusterfs-server glusterfs-client
rabbitmq-server redis-server"

missing=""
for p in $PACKAGES; do
    status=$(dpkg-query -W -f '${db:Status-Status}' "$p" 2>/dev/null || true)
    [ "$status" = "installed" ] || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: tests that need these Debian packages will skip:$missing" \
        "(as root: apt-get install$missing)" >&2
    exit 0
fi

policy=/usr/sbin/policy-rc.d
made_policy=""
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    made_policy=1
fi
cleanup() { [ -z "$made_policy" ] || rm -f "$policy"; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
echo "installing Debian packages for the tests:$missing" >&2
# shellcheck disable=SC2086
if ! apt-get install -y -q --no-install-recommends $missing >/tmp/fsbus-apt.log 2>&1; then
    apt-get update -q >>/tmp/fsbus-apt.log 2>&1
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $missing >>/tmp/fsbus-apt.log 2>&1 || {
        echo "apt-get could not install:$missing (see /tmp/fsbus-apt.log); the tests" \
            "that need them will skip" >&2
        exit 0
    }
fi
