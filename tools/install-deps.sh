#!/bin/sh
# Installs what building and testing forge needs on Debian 12 (run as root or with sudo).
# Mesa's Vulkan drivers (lavapipe, the CPU device the tests run on) come from bookworm-backports:
# Mesa 25 runs forge 3 to 4 times faster than Debian 12's Mesa 22.
set -eu
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
MESA_FROM=""
if [ -r /etc/os-release ] && . /etc/os-release && [ "${VERSION_CODENAME:-}" = bookworm ]; then
    # The backports suite comes from the Debian mirror this machine already uses: the first
    # URI that serves bookworm, in deb822 (*.sources) or one-line (*.list) form.
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
        /^URIs:/ { uri = $2 } /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm" && !found) { print uri; found = 1 } }')
    [ -n "$mirror" ] || mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk '$1 == "deb" && $0 !~ /backports/ { for (i = 2; i <= NF; i++) if ($i ~ /:\/\// && $(i + 1) == "bookworm") { print $i; exit } }')
    if [ -n "$mirror" ]; then
        echo "deb $mirror bookworm-backports main" | $SUDO tee /etc/apt/sources.list.d/forge-bookworm-backports.list >/dev/null
        MESA_FROM="-t bookworm-backports"
    else
        echo "install-deps: no configured Debian source serves bookworm; installing without backports (Mesa 22, Go from Debian 12)" >&2
    fi
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    build-essential cmake pkg-config xz-utils \
    glslang-tools libvulkan-dev libvulkan1 \
    libcjson-dev libpcre2-dev libutf8proc-dev libgtest-dev \
    clang libclang-rt-14-dev \
    python3 python3-pytest python3-setuptools python3-pip python3-venv
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $MESA_FROM mesa-vulkan-drivers
# Go 1.23 (the Go package's range-over-func iterators): bookworm-backports' golang-go is 1.23
# and puts `go` on PATH; elsewhere (a newer Debian) the distribution's golang-go is recent enough.
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $MESA_FROM golang-go
# Node.js runs HuggingFace tokenizers as the tests' oracle; install it only where it is missing.
command -v node >/dev/null 2>&1 || $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
