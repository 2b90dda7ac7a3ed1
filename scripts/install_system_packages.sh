#!/usr/bin/env bash
# Install the Debian packages the book needs: headless Chromium (page checks) and the
# offscreen GL libraries MuJoCo renders LIBERO with (OSMesa and Mesa EGL, both llvmpipe).
# Works as root or with passwordless sudo; otherwise prints the exact command and fails.
set -euo pipefail
PKGS=(chromium chromium-driver libosmesa6 libegl1 libegl-mesa0 libgl1-mesa-dri libglfw3 ffmpeg)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "system packages: all present (${PKGS[*]})"
  exit 0
fi
echo "system packages missing: ${missing[*]}"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: apt-get not found. Install the equivalents of: ${missing[*]} with your package manager, then rerun make." >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo)
else
  echo "error: installing Debian packages needs root. Run this once, then rerun make:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "system packages: installed ${missing[*]}"
