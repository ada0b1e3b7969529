# Sourced by tests/slow_worker_test.sh and bench/slow_worker_bench.sh: a control group that holds
# the processes put into it to a share of one core (the CPU controller: cpu.cfs_quota_us in
# cgroup v1, cpu.max in v2), made and removed by the caller.
#
#   slow_cgroup_make NAME 0.33 || skip "$slow_cgroup_missing"   # sets slow_cgroup_procs
#   sh -c 'echo $$ > "$0" && exec "$@"' "$slow_cgroup_procs" PROGRAM ARGS...
#   slow_cgroup_remove                                           # after its processes ended

slow_cgroup_dir=""
slow_cgroup_procs=""
slow_cgroup_missing=""

# Makes the group NAME held to SHARE of a core (100 ms periods); on failure returns 1 with
# slow_cgroup_missing saying what this machine lacks.
slow_cgroup_make() {
  local name=$1 share=$2 quota
  quota=$(awk -v s="$share" 'BEGIN { printf "%d", s * 100000 }')
  if [ "$(id -u)" != 0 ]; then
    slow_cgroup_missing="needs root to make a cgroup"
    return 1
  fi
  if [ -w /sys/fs/cgroup/cpu ] && [ -e /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
    slow_cgroup_dir=/sys/fs/cgroup/cpu/$name
    mkdir -p "$slow_cgroup_dir" &&
      echo 100000 >"$slow_cgroup_dir/cpu.cfs_period_us" &&
      echo "$quota" >"$slow_cgroup_dir/cpu.cfs_quota_us" || {
      slow_cgroup_missing="cannot set cpu.cfs_quota_us in $slow_cgroup_dir"
      return 1
    }
  elif [ -e /sys/fs/cgroup/cgroup.controllers ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
    echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    slow_cgroup_dir=/sys/fs/cgroup/$name
    mkdir -p "$slow_cgroup_dir" && echo "$quota 100000" >"$slow_cgroup_dir/cpu.max" || {
      slow_cgroup_missing="cannot set cpu.max in $slow_cgroup_dir"
      return 1
    }
  else
    slow_cgroup_missing="no CPU controller of cgroups here (neither v1's cpu.cfs_quota_us nor v2's cpu.max)"
    return 1
  fi
  slow_cgroup_procs=$slow_cgroup_dir/cgroup.procs
}

# Removes the group, once no process is left in it (a process that is exiting may still be
# listed for a moment).
slow_cgroup_remove() {
  [ -n "$slow_cgroup_dir" ] || return 0
  local pid
  for _ in $(seq 50); do
    for pid in $(cat "$slow_cgroup_procs" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    rmdir "$slow_cgroup_dir" 2>/dev/null && break
    sleep 0.1
  done
  slow_cgroup_dir=""
}
