# shellcheck shell=bash
# debian_mirror: the Debian archive this machine's apt uses (its first non-security
# entry, deb822 or one-line sources), so that scripts fetch from the same place.
debian_mirror() {
  local m
  m=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null |
    grep -v security | head -1)
  [ -n "$m" ] || m=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
  [ -n "$m" ] || { echo "no Debian mirror in this machine's apt sources" >&2; return 1; }
  printf '%s\n' "$m"
}
