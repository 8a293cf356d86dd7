#!/bin/sh
# Installs what building and testing forge needs on Debian 12 (run as root or with sudo).
set -eu
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    build-essential cmake pkg-config xz-utils \
    glslang-tools libvulkan-dev libvulkan1 mesa-vulkan-drivers \
    libcjson-dev libpcre2-dev libutf8proc-dev libgtest-dev \
    clang libclang-rt-14-dev
# Node.js runs HuggingFace tokenizers as the tests' oracle; install it only where it is missing.
command -v node >/dev/null 2>&1 || $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
