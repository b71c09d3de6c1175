#!/bin/sh
# A fake internet for the network tests (issue 12, item 9), so that nothing ever leaves the
# machine: two network namespaces joined by a veth pair and nothing else.
#   sbxt-TAG-d  where the daemon under test runs: loopback, and routes to 198.18.0.0/16 and
#               2001:2::/48 (the benchmarking ranges) through the other namespace; no default
#               route, so even a bug cannot send a packet out.
#               `ip netns exec` gives its processes /etc/netns/sbxt-TAG-d/resolv.conf, which
#               names the fake DNS server: the daemon's "host resolvers" are the fake ones.
#   sbxt-TAG-u  the "internet": fakenet.mjs serves DNS (198.18.0.53), HTTP and HTTPS (every
#               address, certificates from a CA made here), a Python package index, an npm
#               registry and a UDP echo (198.18.3.1:5000), and logs every query and request;
#               six.test (2001:2:0:1::30) is its one IPv6-only host.
# The names it answers and what each serves: fakenet.mjs, "Zone".
#
# usage: fakenet.sh up TAG DIR     make both, start the servers; DIR gets ca.pem and the logs
#        fakenet.sh down TAG DIR   stop the servers, remove both namespaces (idempotent)
#        fakenet.sh exec TAG CMD.. run CMD in the daemon's namespace
set -eu
cmd=$1
tag=$2
d=sbxt-$tag-d
u=sbxt-$tag-u
here=$(cd "$(dirname "$0")" && pwd)

down() {
  dir=$1
  if [ -s "$dir/fakenet.pid" ]; then
    kill "$(cat "$dir/fakenet.pid")" 2>/dev/null || true
    rm -f "$dir/fakenet.pid"
  fi
  # Whatever still runs in them (a daemon a test forgot) dies with them.
  for ns in "$d" "$u"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "/etc/netns/$d"
}

certs() {
  dir=$1
  [ -s "$dir/ca.pem" ] && return 0
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=sbx fake internet test CA" -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -subj "/CN=fake internet" -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
  # Wildcards of one label below a top-level domain (*.test) match nothing: every name is listed.
  printf '%s\n' "subjectAltName=DNS:pypi.test,DNS:registry.test,DNS:allowed.test,DNS:denied.test,DNS:exfil.test,DNS:private.test,DNS:loopback.test,DNS:metadata.test,DNS:*.pypi.test,DNS:*.allowed.test,DNS:*.exfil.test,DNS:six.test,IP:2001:2:0:1::30,IP:198.18.1.10,IP:198.18.1.11,IP:198.18.1.20,IP:198.18.1.30,IP:198.18.2.10,IP:198.18.2.20" \
    >"$dir/san.ext"
  openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 2 -extfile "$dir/san.ext" -out "$dir/server.pem" 2>/dev/null
}

case "$cmd" in
up)
  dir=$3
  mkdir -p "$dir"
  down "$dir"
  certs "$dir"
  ip netns add "$d"
  ip netns add "$u"
  ip -n "$d" link set lo up
  ip -n "$u" link set lo up
  ip link add vd netns "$d" type veth peer name vu netns "$u"
  ip -n "$d" addr add 198.19.255.2/30 dev vd
  ip -n "$u" addr add 198.19.255.1/30 dev vu
  ip -n "$d" link set vd up
  ip -n "$u" link set vu up
  ip -n "$d" route add 198.18.0.0/16 via 198.19.255.1
  # IPv6 (for daemons started with --ipv6): the benchmarking range, never routed on the internet.
  ip -n "$d" addr add 2001:2:0:ffff::2/64 dev vd nodad
  ip -n "$u" addr add 2001:2:0:ffff::1/64 dev vu nodad
  ip -n "$d" route add 2001:2::/48 via 2001:2:0:ffff::1
  ip -n "$u" addr add 2001:2:0:1::30/128 dev lo
  for a in 198.18.0.53 198.18.1.10 198.18.1.11 198.18.1.20 198.18.1.30 198.18.2.10 198.18.2.20 \
    198.18.3.1; do
    ip -n "$u" addr add "$a/32" dev lo
  done
  mkdir -p "/etc/netns/$d"
  printf 'nameserver 198.18.0.53\noptions ndots:0\n' >"/etc/netns/$d/resolv.conf"
  : >"$dir/dns.jsonl"
  : >"$dir/http.jsonl"
  : >"$dir/conn.jsonl"
  rm -f "$dir/fakenet.ready"
  ip netns exec "$u" node "$here/fakenet.mjs" "$dir" >"$dir/fakenet.log" 2>&1 &
  echo $! >"$dir/fakenet.pid"
  for _ in $(seq 1 200); do
    [ -e "$dir/fakenet.ready" ] && exit 0
    kill -0 "$(cat "$dir/fakenet.pid")" 2>/dev/null || break
    sleep 0.05
  done
  echo "fakenet: the servers did not start:" >&2
  cat "$dir/fakenet.log" >&2
  down "$dir"
  exit 1
  ;;
down) down "$3" ;;
exec)
  shift 2
  exec ip netns exec "$d" "$@"
  ;;
*)
  echo "usage: fakenet.sh up|down TAG DIR, or exec TAG CMD..." >&2
  exit 2
  ;;
esac
