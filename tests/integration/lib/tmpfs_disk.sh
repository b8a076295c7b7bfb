# Small filesystems for the full-disk tests (sourced; root only: without a mount the test is
# skipped, exit 77). Needs $tmp, the test's temp dir.
#   tmpfs_disk NAME SIZE   a tmpfs of SIZE (e.g. 40m, 300k) at $tmp/NAME
#   tmpfs_unmount_all      every mount made here (and any the test added to $mounted), newest
#                          first (a bind mount over a tmpfs goes before it); for the exit trap
mounted=()

tmpfs_disk() {
  mkdir -p "$tmp/$1"
  if ! mount -t tmpfs -o "size=$2" tmpfs "$tmp/$1" 2>/dev/null; then
    echo "SKIPPED: cannot mount a tmpfs (needs root) to fill a disk"
    exit 77
  fi
  mounted+=("$tmp/$1")
}

tmpfs_unmount_all() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[$i]}" 2>/dev/null || true; done
}
