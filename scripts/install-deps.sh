#!/usr/bin/env bash
# Installs the Debian 12 packages pptrain needs, if any is missing.
set -euo pipefail
packages=(build-essential cmake ccache libgtest-dev
          libcli11-dev libbenchmark-dev nlohmann-json3-dev librsvg2-bin coinor-libcbc-dev pkg-config
          python3-dev python3-venv clang-format
          openmpi-bin slurmctld slurmd slurm-client munge
          iproute2 procps)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
