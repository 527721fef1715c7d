#!/usr/bin/env bash
# Two "machines" on this one: two network namespaces (each with a host name of its own) joined by
# a veth pair, made and removed by this test. mpirun starts in the first and launches the second
# rank in the other through an rsh agent that enters that namespace (as ssh would log in), and the
# ranks talk MPI over TCP only (no shared memory between them). The logits are checked as on one
# machine: P = 2 gives one process's bits, T = 2 stays within the allreduce's bound.
# usage: netns_test.sh DUET_BINARY WORK_DIR MPIRUN   (needs root: CAP_SYS_ADMIN and CAP_NET_ADMIN)
set -uo pipefail
mpirun_bin="$3"
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"
py=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

a="duet-a-$$" b="duet-b-$$" va="dva$$" vb="dvb$$"
net=10.213.$(( $$ % 250 ))
if ! ip netns add "$a" 2> err.txt; then
  echo "cannot make network namespaces here: $(cat err.txt)"
  exit 77
fi
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; }
trap cleanup EXIT
ip netns add "$b"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$a"
ip link set "$vb" netns "$b"
ip -n "$a" addr add "$net.1/24" dev "$va"
ip -n "$b" addr add "$net.2/24" dev "$vb"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "$va" up
ip -n "$b" link set "$vb" up

# The rsh agent: `agent [options] HOST COMMAND...` runs the shell command line COMMAND (as ssh
# would) in HOST's namespace, under a host name of its own.
cat > agent.sh <<AGENT
#!/usr/bin/env bash
while [ "\${1:0:1}" = "-" ]; do shift; done
host="\$1"; shift
case "\$host" in
  $net.1) ns=$a ;;
  $net.2) ns=$b ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c "hostname node-\$ns; \$*"
AGENT
chmod +x agent.sh
printf "%s slots=1\n%s slots=1\n" "$net.1" "$net.2" > hosts

# two_machines ARGS...: mpirun in the first namespace, one rank on each "machine", TCP only.
two_machines() {
  setsid -w ip netns exec "$a" unshare --uts sh -c "hostname node-$a; exec timeout 300 $mpirun_bin --hostfile hosts \
    --mca plm_rsh_agent $work/agent.sh --mca btl tcp,self --mca btl_tcp_if_include $net.0/24 \
    --mca oob_tcp_if_include $net.0/24 -np 2 $*"
}

expect_ok "make-model" "$duet" make-model --preset tiny --type q8_0 --seed 9 -o "$work/m.gguf"
tokens="3 1 4 1 5 9 2 6 5"
"$duet" logits --model "$work/m.gguf" --tokens "$tokens" --all-positions --top 100000 --threads 1 > one.txt
two_machines /bin/hostname > hosts-seen.txt 2> err.txt
if [ "$(sort -u hosts-seen.txt | wc -l)" = 2 ]; then pass "mpirun starts a rank on each machine ($(sort -u hosts-seen.txt | tr '\n' ' '))"
else failed "ranks on machines: $(cat hosts-seen.txt) $(cat err.txt)"; fi
two_machines "$duet" logits --model "$work/m.gguf" --tokens "'$tokens'" --all-positions --top 100000 --threads 1 \
  --pipeline-parallel-size 2 > pp2.txt 2> err.txt || { failed "pp 2 over two machines"; cat err.txt; }
if [ -s pp2.txt ] && cmp -s one.txt pp2.txt; then pass "P = 2 over TCP between two machines gives one process's logits, bit for bit"
else failed "P = 2 over two machines"; fi
two_machines "$duet" logits --model "$work/m.gguf" --tokens "'$tokens'" --all-positions --top 100000 --threads 1 \
  --tensor-parallel-size 2 > tp2.txt 2> err.txt || { failed "tp 2 over two machines"; cat err.txt; }
if $py - one.txt tp2.txt <<'PY'
import json, sys
one = [json.loads(l) for l in open(sys.argv[1])]
two = [json.loads(l) for l in open(sys.argv[2])]
assert len(one) == len(two) and one
for x, y in zip(one, two):
    dx, dy = dict(map(tuple, x["top"])), dict(map(tuple, y["top"]))
    span = max(dx.values()) - min(dx.values())
    assert max(abs(dx[i] - dy[i]) for i in dx) <= 1e-3 * span
PY
then pass "T = 2 over TCP between two machines within the allreduce's bound"; else failed "T = 2 over two machines"; fi

cleanup
if ip netns list | grep -qE "^($a|$b)\b"; then failed "namespaces left behind"; else pass "the namespaces are removed"; fi
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
