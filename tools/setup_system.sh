#!/usr/bin/env bash
# Installs the system packages pyggml needs (Debian/Ubuntu, as root). Idempotent: packages already
# present are not reinstalled. Without root or apt it prints what to install and exits 0, so
# `make setup` continues with what it can (the C library needs only a C compiler).
set -u
PKGS_ALWAYS="gcc g++ make cmake libvulkan1 mesa-vulkan-drivers glslang-tools"   # g++/cmake: rpc-server
PKGS_ALWAYS="$PKGS_ALWAYS chromium chromium-driver"     # the web page's browser tests (Selenium)
PKGS_X86_NEON="gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"

pkgs="$PKGS_ALWAYS"
[ "$(uname -m)" = "x86_64" ] && pkgs="$pkgs $PKGS_X86_NEON"

missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "setup: system packages present"
    exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: cannot install system packages (need root and apt-get). Please install:"
    echo "    apt-get install -y$missing"
    echo "setup: continuing without them (Vulkan tests skip, NEON tests skip, browser tests skip,"
    echo "       shaders not built)"
    exit 0
fi
echo "setup: installing$missing"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq $missing >/tmp/pyggml-apt.log 2>&1; then
    apt-get update -qq >>/tmp/pyggml-apt.log 2>&1
    apt-get install -y -qq $missing >>/tmp/pyggml-apt.log 2>&1 || {
        echo "setup: apt-get install failed (log: /tmp/pyggml-apt.log); continuing"; exit 0; }
fi
echo "setup: system packages installed"
