#!/bin/bash
# Makes the certificates fuselink's mutual TLS runs on, with Debian's openssl: a CA,
# then one certificate per agent or client, signed by it. What the scripts and tests
# use; a cluster would use its own PKI (cert-manager: deploy/helm/fuselink).
#
#   scripts/certs.sh DIR ca                   the CA (DIR/ca.crt, ca.key), if absent
#   scripts/certs.sh DIR node NAME [SAN...]   DIR/node-NAME.{crt,key}: an agent
#   scripts/certs.sh DIR KIND NAME [SAN...]   KIND router, engine, viewer or any word
#
# A certificate's identity is its URI SAN spiffe://fuselink/KIND/NAME (the default
# access policy gives node/* the peer role, router/* router and viewer, engine/*
# engine, viewer/* viewer). Agents' certificates also carry DNS:NAME, DNS:localhost
# and IP:127.0.0.1, for clients that check the name they dial. Extra SANs (DNS:x,
# IP:10.0.0.1) follow NAME. DAYS (default 30) sets the lifetime; DAYS=-1 makes one
# that has already expired. Keys are P-256.
set -euo pipefail
dir="$1" kind="$2"
mkdir -p "$dir"
umask 077
days="${DAYS:-30}"
newkey=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
if [ ! -f "$dir/ca.crt" ]; then
  openssl req -x509 "${newkey[@]}" -keyout "$dir/ca.key" -out "$dir/ca.crt" \
    -days 3650 -subj "/CN=fuselink CA $(basename "$dir")" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign \
    2>/dev/null
fi
[ "$kind" = ca ] && exit 0
name="$3"
shift 3
sans="URI:spiffe://fuselink/$kind/$name"
if [ "$kind" = node ]; then sans="$sans,DNS:$name,DNS:localhost,IP:127.0.0.1"; fi
for extra in "$@"; do sans="$sans,$extra"; done
out="$dir/$kind-$name"
ext="$(mktemp)"
trap 'rm -f "$ext" "$out.csr"' EXIT
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' \
  "$sans" >"$ext"
openssl req -new "${newkey[@]}" -keyout "$out.key.tmp" -out "$out.csr" \
  -subj "/CN=$kind $name" 2>/dev/null
openssl x509 -req -in "$out.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
  -CAcreateserial -out "$out.crt.tmp" -days "$days" -extfile "$ext" 2>/dev/null
# Renamed into place, key first, so that a watcher never reads a half-written pair.
mv "$out.key.tmp" "$out.key"
mv "$out.crt.tmp" "$out.crt"
chmod 0644 "$out.crt" "$dir/ca.crt"
