# The Mininet engine's queue tree on a full kernel: runs as /lab/lab.sh inside
# scripts/kernel-lab's VM. tests/kernel_lab.py writes the inputs beside it:
#   pairs          one veth pair a line: NAME IFACE_A IFACE_B SUBNET_INDEX
#   NAME.a.tc      `tc -batch` lines for IFACE_A (made by fabric.emu.plan.port_tc)
#   NAME.b.tc      the same for IFACE_B
#   NAME.pause.tc  tbf_line(paused=True) for IFACE_A; NAME.resume.tc the way back
#   mark           the pair whose RED queue gets the ECT(0) burst
#   probe_*.sh     kernel.has_red's and has_netem's commands, as they run them
# and reads what it prints: one `AIFLAB KEY VALUE...` line a fact. Interface
# A lives in namespace afla, B in aflb; pair k has 198.18.k.1 and .2 (the
# benchmarking range, and only inside this VM).

A="ip netns exec afla"
B="ip netns exec aflb"
say() { echo "AIFLAB $*"; }

# The qdiscs of IFACE_A as kind/handle/parent words, in tc's order.
tree() {
    $A tc qdisc show dev "$1" | awk '{print $2 "/" $3 "/" ($4 == "root" ? "root" : $5)}' | xargs
}

# `ping` summary as: transmitted received min avg max (ms); 0 0 0 0 0 when silent.
ping_stats() {
    $A ping -q "$@" 2>&1 | awk '
        / packets transmitted/ { tx = $1; rx = $4 }
        /^rtt|^round-trip/ { split($4, v, "/"); mn = v[1]; av = v[2]; mx = v[3] }
        END { printf "%d %d %s %s %s\n", tx, rx, mn + 0, av + 0, mx + 0 }'
}

# Bytes and packets waiting in qdisc HANDLE of IFACE_A.
backlog() {
    $A tc -s qdisc show dev "$1" | awk -v h="$2" '
        $1 == "qdisc" { cur = $3 }
        cur == h && $1 == "backlog" { sub("b$", "", $2); sub("p$", "", $3); print $2, $3; exit }'
}

# RED's counters (marked early pdrop) of qdisc 31: on IFACE_A.
red_counters() {
    $A tc -s qdisc show dev "$1" | awk '
        $1 == "qdisc" { cur = $3 }
        cur == "31:" && $1 == "marked" { print $2, $4, $6; exit }'
}

# Packets sent by HTB class CLASSID of IFACE_A.
class_packets() {
    $A tc -s class show dev "$1" classid "$2" | awk '$1 == "Sent" { print $4; exit }'
}

for probe in probe_*.sh; do
    [ -e "$probe" ] || continue
    sh "$probe"
done

ip netns add afla
ip netns add aflb
while read -r name ia ib k; do
    ip link add "$ia" netns afla type veth peer name "$ib" netns aflb
    $A ip link set "$ia" mtu 9000 up
    $B ip link set "$ib" mtu 9000 up
    $A ip addr add "198.18.$k.1/24" dev "$ia"
    $B ip addr add "198.18.$k.2/24" dev "$ib"
    $A tc -batch "$name.a.tc" && $B tc -batch "$name.b.tc"
    say "apply.$name $?"
    say "tree.$name $(tree "$ia")"
    $A ping -c 1 -W 5 "198.18.$k.2" >/dev/null 2>&1
    say "rtt.$name $(ping_stats -c 10 -i 0.2 -W 5 "198.18.$k.2")"
    say "rtt_cnp.$name $(ping_stats -c 5 -i 0.2 -W 5 -Q 0xc0 "198.18.$k.2")"
    say "cnp_packets.$name $(class_packets "$ia" 1:10)"
done <pairs

# PFC: PAUSE turns TBF 30: to nothing; the queue below it must stay and hold.
while read -r name ia ib k; do
    $A tc -batch "$name.pause.tc"
    say "pause_apply.$name $?"
    say "tree_paused.$name $(tree "$ia")"
    say "paused.$name $(ping_stats -c 5 -i 0.2 -W 1 -s 8972 "198.18.$k.2")"
    say "paused_backlog.$name $(backlog "$ia" 30:)"
    $A tc -batch "$name.resume.tc"
    say "resume_apply.$name $?"
    say "tree_resumed.$name $(tree "$ia")"
    say "resumed.$name $(ping_stats -c 3 -i 0.2 -W 5 "198.18.$k.2")"
done <pairs

# RED with ECN: a burst of ECT(0) into a slow link is marked, not dropped;
# the same burst without ECT is dropped early, not marked.
if [ -e mark ]; then
    read -r name ia ib k <mark
    echo 16777216 >/proc/sys/net/core/wmem_max
    say "red_before.$name $(red_counters "$ia")"
    $A ping -q -c 200 -l 200 -S 8000000 -W 5 -s 1400 -Q 0x02 "198.18.$k.2" >/dev/null 2>&1
    say "red_ect.$name $(red_counters "$ia")"
    $A ping -q -c 200 -l 200 -S 8000000 -W 5 -s 1400 -Q 0x00 "198.18.$k.2" >/dev/null 2>&1
    say "red_not_ect.$name $(red_counters "$ia")"
fi

ip netns del afla
ip netns del aflb
