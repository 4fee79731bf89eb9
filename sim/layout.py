"""Column layout of the engine's flat state arrays, stated once.

The kernel keeps its state in a few 2-D int64 arrays, one row per entity
(port, flow, packet, node, event) and one column per field named here.
Times inside the engine are integer picoseconds (`_ps`), sizes bytes.
"""

from collections import namedtuple

from aifabric.fabric import cc
from aifabric.fabric.routing import MAX_HOPS

State = namedtuple(
    "State",
    "g prm fprm pt pmax fl fr nd act pk pc ev path_ptr path_port dep_ptr dep "
    "smp cap net live nic_ip load rnd gr gio gx out",
)
"""Everything the kernel reads and writes, by name (the columns of each array below):

    g prm fprm           global scalars (G_*), int parameters (P_*), float parameters (FP_*)
    pt pmax              ports, one row per directed link (PT_*), and their ECN Pmax
    fl fr                flows: counters and times (FL_*); rates in bit/s (FR_*)
    nd act               NICs (ND_*): each NIC's flows with data to send, act[off:off + cnt]
    pk pc                packets: what a hop reads, the route included (PK_*); the rest (PC_*)
    ev                   the event list: a near heap, a timing wheel and a far heap of event
                         rows (E_*; aifabric.sim.heap)
    path_ptr path_port   each flow's route (CSR of ports)
    dep_ptr dep          the flows waiting on each flow (CSR of flows)
    smp cap              sample rows of the port series (SM_*); capture records (CP_*)
    net live nic_ip      the routing tables (aifabric.fabric.routing.Net, Live) and the NICs' IPv4
                         addresses, for routing every packet anew (policy spray)
    load rnd             scratch for aifabric.fabric.routing.route_packet
    gr gio               streams (GR_*): a collective's connections, each carrying its steps
                         in order; gio holds each stream's inputs and outputs (streams)
    gx                   beside gio: at an input's place, the place of the same pair among
                         that input's outputs; at an output's place, the steps that output
                         had released when its last credit left its sender (`kernel.credit`)
    out                  a partition's outbox (O_*): what it sent over a link into another
                         partition (aifabric.sim.partition), for the next window
"""

# event rows (ev[heap, i, :], aifabric.sim.heap); E_KEY orders events of the same time
E_TIME_PS, E_KEY, E_KIND, E_A, E_B, E_N = range(6)

# event kinds
EV_ARRIVE = 0  # a = packet: its last bit reached the far end of its current hop
EV_TX = 1  # a = port: the port may start its next frame (free, resumed, paced)
EV_FLOW_START = 2  # a = flow: dependencies met, earliest start reached
EV_PFC = 3  # a = port being paused, b = quanta (0: resume)
EV_PFC_REFRESH = 4  # a = port that sent an XOFF: send it again if still congested
EV_CC_TIMER = 5  # a = flow, b = cc_timer_arg(generation, timer): a congestion-control timer
EV_RETX = 6  # a = flow, b = bytes: a drop noticed by the sender, to send again
EV_SAMPLE = 7  # close one sample interval of the port time series
EV_RTO = 8  # a = flow, b = byte offset of data lost (go-back-N): timeout, go back if still due
EV_ACK_RTO = 9  # a = flow whose last ACK was lost (finish at the sender): its receiver repeats it
EV_RELEASE = 10  # a = stream, b = steps: its inputs are there, its flows may send them
EV_DEP = 11  # a = flow: one of the flows it waits on arrived or completed (a message)
EV_CREDIT = 12  # a = stream, b = steps * CREDIT_SLOTS + which output: that output released them
EV_SEEN = 13  # a = stream (GR_EMPTY), b = steps: its receiver hears they were released
EV_LOST = 14  # a = flow: partitions only: its receiver's partition hears that data of it was
# lost in another (FL_MAY_REORDER), a lookahead later: before its next packet can arrive
CREDIT_SLOTS = 16  # outputs a stream may have
# Events of one time are taken by kind in this order, then by the one thing each is about
# (`aifabric.sim.heap.tie_key`), never by when they were scheduled: the order is the same
# whatever order they were scheduled in. The sample interval that ends then closes first;
# a port looks for its next frame (EV_TX) once everything else of that time is done.
TIE_ORDER = (
    EV_SAMPLE, EV_ARRIVE, EV_PFC, EV_SEEN, EV_CREDIT, EV_DEP, EV_FLOW_START, EV_RELEASE,
    EV_CC_TIMER, EV_RETX, EV_RTO, EV_ACK_RTO, EV_LOST, EV_PFC_REFRESH, EV_TX,
)  # fmt: skip

# global scalars (g[...])
(
    G_NOW_PS,
    G_HEAP,
    G_FREE,  # head of the free packet list
    G_NFREE,
    G_DONE,  # flows complete
    G_STUCK,  # flows that found no path
    G_EVENTS,
    G_HOPS,  # packet-hops (frames put on a wire)
    G_SAMPLES,  # rows written to the sample buffer
    G_SAMPLE_T_PS,  # start of the open sample interval
    G_CAPS,  # records written to the capture buffer
    G_CNP,
    G_DROPS,
    G_PFC,
    G_ECN,
    G_RETX_BYTES,
    G_OVERFLOW,  # 1: an event or packet found no room (the loop stops with R_OVERFLOW)
    G_PURGING,  # ports with a purge to finish (PT_PURGE) before the next event
    G_PROGRESS_T_PS,  # when data was last delivered or a flow last started
    G_FAR,  # pending events in the far heap (aifabric.sim.heap)
    G_SPLIT_PS,  # the near heap's events are before this time: the wheel's present bucket's end
    G_WHEEL,  # pending events in the timing wheel's buckets (aifabric.sim.heap)
    G_CHUNKS,  # the wheel's chunks of rows ever taken (the rest of ev[POOL] is unused)
    G_FREE_CHUNK,  # 1 + the first chunk of the wheel's free list (0: none)
    G_OUT,  # rows written to the outbox (out)
    G_KEY_STOP,  # the loop stops before an event of time t_stop whose key is greater
    G_LAST_KEY,  # the key of the event that made the flows done reach P_QUOTA
    G_NG,
) = range(28)

# parameters (prm[...], int64; rates bit/s, times ps)
(
    P_CC,  # CC_NONE, CC_DCQCN, CC_CTS
    P_SPRAY,  # 1: route every data packet anew (policy spray)
    P_MTU_BYTES,
    P_SAMPLE_PS,
    P_RTO_PS,
    P_CNP_INTERVAL_PS,
    P_ALPHA_TIMER_PS,
    P_RATE_TIMER_PS,
    P_BYTE_COUNTER_BYTES,
    P_FAST_STEPS,
    P_AI_BPS,
    P_HAI_BPS,
    P_MIN_RATE_BPS,
    P_CTS_CHUNK_BYTES,
    P_CTS_WINDOW,
    P_EVENT_RESERVE,  # free event rows kept before each event: the most one event schedules
    P_PACKET_RESERVE,  # free packets kept before each event: the most one event allocates
    P_STALL_PS,  # no data delivered for this long while flows are unfinished: stalled
    P_GO_BACK_N,  # 1: go-back-N loss recovery, 0: selective repeat
    P_CLAMP_TARGET,  # DCQCN: 1: a cut sets the target rate to the current rate, 0: keeps it
    P_ADAPTIVE,  # 1: switches forward each data packet on the next hop with the shortest queue
    P_ACK_EVERY,  # the receiver ACKs every this many in-order data packets; 0: once per flow
    P_FINISH_AT_SENDER,  # 1: a flow ends when the ACK of its last byte reaches the sender
    P_OVERHEAD_BYTES,  # wire bytes of a packet besides its payload (cc header_overhead)
    P_QUOTA,  # the loop returns R_DONE once this many flows are done or stuck (in a
    # partition: those that end there, `aifabric.sim.partition`)
    P_PARTITIONED,  # 1: one partition of several: sampling goes on; stalls are the driver's
    P_PART,  # this partition (nd[:, ND_PART] names every node's)
    P_OUT_RESERVE,  # free outbox rows kept before each event: the most one event sends
    P_LOOKAHEAD_PS,  # partitions: a window's length, the shortest delay between partitions
    P_NPRM,
) = range(30)
# float parameters (fprm[...])
FP_G, FP_NFPRM = range(2)

# congestion-control kinds by their index in aifabric.fabric.cc.KINDS
CC_NONE, CC_DCQCN, CC_CTS = (cc.KINDS.index(k) for k in ("none", "dcqcn", "cts"))
CC_KINDS = {k: i for i, k in enumerate(cc.KINDS)}
CC_TIMER_SLOTS = 4  # an EV_CC_TIMER's b is generation * CC_TIMER_SLOTS + the component's timer
# what a congestion-control hook asks the kernel to do next (bit flags; see `congestion`)
DO_KICK = 1  # the sender's NIC port looks for a frame to send (if the flow has data)
DO_REQUEST = 2  # the sender asks its receiver for grants
DO_REPACE = 4  # the flow's rate changed: its next frame is due one gap at the new rate
DO_REARM = 8  # the timer that fired runs again after its period
DO_CNP = 16  # the receiver sends a CNP
DO_GRANT = 32  # the receiver sends the grants that are due

# ports (pt[p, ...]); class 0 is control (strict priority), class 1 lossless data.
# Columns are ordered by use: what every hop reads comes first (one cache line).
(
    PT_FREE_AT_PS,  # when the frame on the wire has been serialized
    PT_TXEV_PS,  # time of the latest EV_TX scheduled, -1 none
    PT_PFC_PENDING,  # quanta of a PFC frame to send next, -1 none
    PT_PAUSE_UNTIL_PS,
    PT_HEAD0,  # head and tail of class c are PT_HEAD0 + 2c and PT_TAIL0 + 2c
    PT_TAIL0,
    PT_HEAD1,
    PT_TAIL1,
    PT_IS_NIC,  # the port belongs to a NIC
    PT_ALIVE,
    PT_Q0_BYTES,  # bytes queued in class c: PT_Q0_BYTES + c
    PT_Q1_BYTES,
    PT_S_QINT_BYTE_PS,  # queue bytes x ps in the open sample
    PT_S_QT_PS,  # last time the integral was brought up to date
    PT_S_QMAX_BYTES,
    PT_RATE_BPS,
    PT_DELAY_PS,
    PT_S_TX_BYTES,
    PT_CAPTURE,  # 1: record frames sent on this port
    PT_ECN_ON,
    PT_PFC_ON,
    PT_ING_BYTES,  # lossless bytes that came in over this port's link and are still buffered
    PT_XOFF,  # 1 while this port's peer is asked to pause
    PT_XOFF_BYTES,
    PT_HEADROOM_BYTES,
    PT_KMIN_BYTES,
    PT_KMAX_BYTES,
    PT_XON_BYTES,
    PT_QUANTA,
    PT_REFRESH,  # 1 while an EV_PFC_REFRESH is pending
    PT_NODE,
    PT_PAUSE_FROM_PS,  # paused time is counted up to here
    PT_S_ECN,
    PT_S_PAUSED_PS,
    PT_S_PFC,
    PT_S_DROPS,
    PT_BUF_BYTES,
    PT_PEER,
    PT_PURGE,  # 1 while the port is down and its queues are not yet purged
    PT_S_CNP,  # CNPs the NIC of this port sent in the open sample
    PT_SHARED,  # 1: the port's switch runs the shared-buffer model (sim/buffer.py)
    PT_RESERVED_BYTES,  # shared: bytes the port keeps for itself per priority
    PT_HDRM_BYTES,  # shared: lossless bytes from this port's link held in its headroom
    PT_XON_OFFSET_BYTES,  # shared: resume this far below the dynamic threshold
    PT_RNG,  # the port's random-number generator state (ECN marking: aifabric.sim.ecn)
    PT_WAKE_PS,  # time of the last EV_TX `kernel.wait_tx` pushed: to come while later than now
    PT_FAR_PART,  # 1 + the partition at the far end of its link, if not the port's own; else 0
    PT_N,
) = range(48)

# flows (fl[f, ...]); rates in fr[f, ...]
(
    FL_SRC,
    FL_DST,
    FL_BYTES,
    FL_UNSENT_BYTES,  # bytes to send (retransmissions come back here)
    FL_PSN,  # the PSN of its next data packet (go-back-N goes back to an earlier one)
    FL_SENT_PKTS,  # data packets sent, those sent again included: a packet's entropy
    # (PC_ARG), which sprays it and breaks adaptive routing's ties, so that a packet sent
    # again may take another path
    FL_DELIV_BYTES,  # bytes the receiver has
    FL_DEPS,  # prerequisites not yet complete
    FL_EARLIEST_PS,
    FL_T_START_PS,
    FL_T_END_PS,
    FL_STATE,
    FL_NEXT_SEND_PS,  # pacing: earliest start of the next data frame
    FL_LAST_TX_PS,  # start of the last data frame
    FL_LAST_WIRE_BYTES,  # its bytes on the wire
    FL_ALLOW_BYTES,  # cts: granted bytes not yet sent
    FL_GRANTED_BYTES,  # cts: bytes the receiver granted so far
    FL_LAST_CNP_PS,  # receiver: when it last sent a CNP for this flow
    FL_GEN,  # congestion-control timer generation: a timer of an older one is void
    FL_T_STAGE,
    FL_B_STAGE,
    FL_BC_BYTES,  # bytes since the last byte-counter event
    FL_SLOT,  # index in its NIC's active list, -1 when not listed
    FL_SPORT,
    FL_DQPN,
    FL_SQPN,
    FL_PRIO,
    FL_CHUNK_BYTES,  # cts: bytes per grant
    FL_WINDOW,  # cts: grants outstanding at most
    FL_NAKED,  # go-back-N receiver: 1 once it asked for the data after its current gap
    FL_REWIND_PS,  # go-back-N sender: when it last went back to resend
    FL_ACKED_BYTES,  # sender: the most bytes its ACKs and NAKs said the receiver had
    FL_ACKED_PSN,  # sender: the PSN after the last that ACK acknowledged (where it goes back)
    FL_MAY_REORDER,  # 1 once the flow lost data or changed route: it may arrive out of order
    FL_UNACKED,  # receiver: in-order data packets since its last ACK
    FL_RX_PSN,  # receiver: 1 + the PSN of the last data packet it took (0: none); its ACKs,
    # CNPs and grants carry that PSN (an ACK acknowledges up to it, a NAK asks for the next)
    FL_T_RECEIVED_PS,  # when the receiver had every byte, -1 before
    FL_GROUP,  # the stream it is a QP of (gr), -1: the flow is a whole transfer
    FL_QP,  # its QP index in the stream
    FL_HELD_BYTES,  # a stream's bytes whose steps are not yet released
    FL_STEPS_DONE,  # steps of the stream the receiver has (this QP's share of each)
    FL_WATCH_BYTES,  # delivered bytes that complete the next step (NEVER: none to watch)
    FL_OP,  # its operation: dependencies within one are on data, across ops on completion
    FL_LAT_PS,  # a transfer: from the arrival of the data it waits for to its start
    FL_BASE_PS,  # from the end of the op before (or its start time) to its start; a stream's
    # QP: to its first step's release (its op's base and step latency; its recorded start is
    # this much before: `kernel.start_flow`)
    FL_READY_PS,  # the latest release time of its dependencies so far
    FL_PACER,  # 1 + the flow whose FL_PACE_PS paces this one with its op's others (0: none)
    FL_PACE_PS,  # a pacer: when the next packet of its flows may leave
    FL_N,
) = range(49)
# FR_PACE_BPS: a pacer's rate (the protocol's cap on an op's flows from one NIC, together)
FR_RC_BPS, FR_RT_BPS, FR_ALPHA, FR_LINE_BPS, FR_PACE_BPS, FR_N = range(6)

# streams (gr[s, ...]): step k moves bytes [B(k-1), B(k)) with B(k) = GR_BYTES * k // GR_STEPS,
# QP q carrying its share of them (kernel.qp_bytes); step k is released GR_LAT_PS after every
# input has delivered step k - GR_OFFSET (the first steps as its QPs start, FL_BASE_PS after
# the op's start).
# Its sender keeps GR_RELEASED, GR_SCHED, GR_STARTED and its outputs' credits (gx); its
# receiver GR_DONE and GR_SEEN: what one end learns of the other comes by message, a path's
# propagation later (GR_PROP_PS), so each end may run in its own partition
(
    GR_STEPS,
    GR_BYTES,
    GR_DONE,  # steps every QP's receiver has
    GR_RELEASED,  # steps its flows may send
    GR_SCHED,  # steps a release is scheduled for
    GR_FLOW0,  # its first flow (QP 0); its QPs are consecutive flows
    GR_NQP,
    GR_LAT_PS,
    GR_OFFSET,
    GR_RR,  # 1: QPs take whole messages in turn (round-robin), 0: every message split
    GR_CHUNK,  # message bytes (round-robin)
    GR_IN_OFF,  # gio[GR_IN_OFF:GR_IN_OFF + GR_IN_N]: the streams that release its steps
    GR_IN_N,
    GR_OUT_OFF,  # gio[GR_OUT_OFF:GR_OUT_OFF + GR_OUT_N]: the streams whose steps it releases
    GR_OUT_N,
    GR_STARTED,  # 1 once one of its flows started
    GR_LOOP,  # steps per loop (a ring's 2(n-1)): a loop's first step waits for no input; 0 none
    GR_WINDOW,  # steps released beyond those its outputs have released (its buffer); 0 none
    GR_PROP_PS,  # propagation from sender to receiver (the shortest of its QPs' paths)
    GR_EMPTY,  # 1: some steps carry no byte (GR_BYTES < GR_STEPS): their release is a message
    GR_SEEN,  # steps its receiver has heard released (GR_EMPTY streams; EV_SEEN)
    GR_N,
) = range(22)
ST_WAIT, ST_ACTIVE, ST_SENT, ST_DONE, ST_NOPATH = range(5)

# nodes (nd[v, ...]): a NIC's list of flows that have data to send; a shared-buffer
# switch's pool: its shared bytes (the buffer less the reserved minimums), those in use,
# and alpha in units of 1/BUFFER_ALPHA_SCALE (sim/buffer.py)
ND_OFF, ND_CNT, ND_RR, ND_SB_SIZE, ND_SB_USED, ND_SB_ALPHA, ND_PART, ND_N = range(8)

# packets: pk[i, ...] (int32) is one cache line holding what a hop reads, the route
# included (the ports pk[i, PK_ROUTE:PK_ROUTE + PK_NHOPS]); on a large fabric a packet
# is usually out of every cache when it reaches the head of a queue, and one line per
# packet is one memory access per hop. What only captures and clear-to-send read is
# in pc[i, ...] (int64).
(
    PK_NEXT,
    PK_WIRE_BYTES,  # bytes on the wire, with headers, preamble and gap
    PK_HOP,  # index in the route of the port it is on or queued at
    PK_NHOPS,
    PK_KIND,
    PK_CE,
    PK_FLOW,
    PK_BYTES,  # payload
    PK_ROUTE,
) = range(9)
PK_N = PK_ROUTE + MAX_HOPS  # 16 int32: one cache line
PC_PSN, PC_ARG, PC_OFFSET_BYTES, PC_N = range(4)  # PC_ARG: cts grant bytes; NAK offset + 1;
# data: its entropy (FL_SENT_PKTS as it left)
# PC_OFFSET_BYTES: where a data packet's payload starts in its flow; an ACK's bytes acknowledged
K_DATA, K_CNP, K_ACK, K_CTS, K_REQ, K_PFC = range(6)

# frame overheads on the wire: a packet's payload plus the scenario's header_overhead
# (P_OVERHEAD_BYTES; by default Ethernet 14 + IPv4 20 + UDP 8 + BTH 12, ICRC 4, FCS 4,
# preamble and inter-frame gap 20); control packets carry a few bytes more
PREAMBLE_GAP = 20
DATA_OVERHEAD_BYTES = cc.HEADER_OVERHEAD_BYTES  # the default
ACK_EXTRA_BYTES = 4  # the AETH
CNP_EXTRA_BYTES = 16  # reserved
CTS_EXTRA_BYTES = 16  # a SEND of 16 bytes
CNP_WIRE_BYTES = DATA_OVERHEAD_BYTES + CNP_EXTRA_BYTES  # at the default overhead
ACK_WIRE_BYTES = DATA_OVERHEAD_BYTES + ACK_EXTRA_BYTES
CTS_WIRE_BYTES = DATA_OVERHEAD_BYTES + CTS_EXTRA_BYTES
PFC_WIRE_BYTES = 64 + PREAMBLE_GAP

# capture records (cap[i, ...])
CP_TIME, CP_PORT, CP_KIND, CP_FLOW, CP_PSN, CP_BYTES, CP_CE, CP_ARG, CP_N = range(9)

# sample series (smp[series, row, port]), named as the run directory names them
SERIES = (
    "tx_bytes",
    "qdepth_max_bytes",
    "qdepth_mean_bytes",
    "ecn_marked",
    "paused_ns",
    "pfc_sent",
    "drops",
    "cnp_sent",
)
(
    SM_TX_BYTES,
    SM_QDEPTH_MAX_BYTES,
    SM_QDEPTH_MEAN_BYTES,
    SM_ECN_MARKED,
    SM_PAUSED_NS,
    SM_PFC_SENT,
    SM_DROPS,
    SM_CNP_SENT,
    SM_N,
) = range(len(SERIES) + 1)

# why a kernel call returned
(
    R_DONE,
    R_LIMIT,
    R_GROW_EVENTS,
    R_GROW_PACKETS,
    R_DRAIN_CAPTURE,
    R_DRAIN_SAMPLES,
    R_STOP,
    R_STALLED,  # flows underway and nothing but sampling to come, or no data for P_STALL_PS
    R_OVERFLOW,  # see G_OVERFLOW: a bug, the run cannot go on
    R_DRAIN_OUT,  # the outbox is (nearly) full
) = range(10)

# outbox rows (out[i, ...]): an event for another partition, and the packet it carries
# (an EV_ARRIVE's pk and pc row; the receiving partition gives it a row of its own)
O_TIME_PS, O_PART, O_KIND, O_A, O_B, O_PK = range(6)
O_PC = O_PK + PK_N
O_N = O_PC + PC_N
OUT_RESERVE = 64  # outbox rows kept free before each event: more than one event sends

PS_PER_NS = 1000
