# Sourced by the shell tests (and benchmarks) that start processes: a scratch folder `$dir`,
# the array `groups` of process group ids, each killed with SIGKILL when the script ends, failed
# or not, and free_port.
#
#   source "$(dirname "$0")/process_groups.sh"
#   setsid some-command & groups+=("$!")
dir=$(mktemp -d)
groups=()
cleanup() {
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# A TCP port free now (the kernel's pick).
free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
