#!/usr/bin/env bash
# Runs `mpirun ... tern ARGS` with every rank in a network namespace of its own, the namespaces
# joined to one bridge by veth links whose egress is shaped with `tc tbf` (a simulated network of
# nodes: docs/distributed.md). Latency comes from the communicator's own option
# (TERN_COMM_LATENCY_US), as these kernels have no netem. Needs root (ip netns, tc); everything it
# makes is removed on exit. Ranks talk over MPI's TCP transport only (no shared memory).
# Every "node" is this machine, so ranks are not bound to cores (each would think core 0 its own,
# and two ranks sharing one core hand over every 4 ms tick).
#
#   bash scripts/netns_mpi.sh [--ranks N] [--gbit G] [--latency-us U] -- TERN_ARGS...
#   e.g. bash scripts/netns_mpi.sh --ranks 2 --gbit 1 --latency-us 1000 -- bench -m M.gguf --tp 2 -t 1
set -euo pipefail
ranks=2 gbit=10 latency_us=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --gbit) gbit=$2; shift 2 ;;
    --latency-us) latency_us=$2; shift 2 ;;
    --no-shaping) gbit=0; shift ;;
    --) shift; break ;;
    *) echo "usage: bash scripts/netns_mpi.sh [--ranks N] [--gbit G] [--latency-us U] -- TERN_ARGS..." >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "netns_mpi: no tern arguments after --" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "netns_mpi: needs root (ip netns, tc)" >&2; exit 1; }
here=$(cd "$(dirname "$0")/.." && pwd)
tern=${TERN_BINARY:-$here/build/release/tern}
tag=tn$$                    # interface names stay under 15 characters
net=10.$((77 + $$ % 100)).$(( ($$ / 100) % 250 ))
work=$(mktemp -d)
cleanup() {
  for i in $(seq 1 "$ranks"); do ip netns del "${tag}n$i" 2>/dev/null || true; done
  ip link del "${tag}br" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip link add "${tag}br" type bridge
ip addr add "$net.1/24" dev "${tag}br"
ip link set "${tag}br" up
: > "$work/hosts"
for i in $(seq 1 "$ranks"); do
  ns=${tag}n$i
  ip netns add "$ns"
  ip link add "${tag}v$i" type veth peer name "${tag}p$i"
  ip link set "${tag}p$i" netns "$ns"
  ip link set "${tag}v$i" master "${tag}br" up
  ip -n "$ns" addr add "$net.$((10 + i))/24" dev "${tag}p$i"
  ip -n "$ns" link set "${tag}p$i" up
  ip -n "$ns" link set lo up
  # Each node's sending side: what leaves it is shaped (every rank-to-rank path crosses one).
  # The bucket holds what the link sends in one 4 ms kernel tick (tbf's least for the rate),
  # at least 64 KB: a larger one would let whole messages through at memory speed.
  burst=$(awk -v g="$gbit" 'BEGIN { b = g * 1e9 / 8 / 250; if (b < 65536) b = 65536; printf "%d", b }')
  [ "$gbit" = 0 ] || ip netns exec "$ns" tc qdisc add dev "${tag}p$i" root tbf rate "${gbit}gbit" burst "$burst" latency 100ms
  echo "$net.$((10 + i)) slots=1" >> "$work/hosts"
done
# mpirun starts its daemons through this "remote shell": the host's namespace instead of ssh.
cat > "$work/agent" <<AGENT
#!/bin/sh
while [ \$# -gt 0 ]; do
  case "\$1" in $net.*) host=\$1; shift; break ;; *) shift ;; esac
done
exec ip netns exec "${tag}n\$(( \${host##*.} - 10 ))" sh -c "\$*"
AGENT
chmod +x "$work/agent"
export TERN_COMM_LATENCY_US=$latency_us
mpirun --allow-run-as-root --hostfile "$work/hosts" -np "$ranks" \
  --mca plm_rsh_agent "$work/agent" --mca btl tcp,self --mca routed direct --bind-to none ${TERN_NETNS_MCA:-} \
  --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" \
  -x TERN_COMM_LATENCY_US "$tern" "$@"
