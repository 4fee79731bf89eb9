// SPDX-License-Identifier: GPL-2.0
/* ECN marking for the emulator's switch egress, where the kernel has no sch_red.
 *
 * Attached on tc clsact egress (direct action), before the egress qdisc. It
 * keeps a virtual queue that fills with every IPv4 packet and drains at the
 * port's (scaled) rate, and marks ECT packets CE with the RED-style
 * probability of the DCQCN switch profile: 0 below KMIN_BYTES, rising to
 * PMAX at KMAX_BYTES, 1 above. The state map counts the packets it marked;
 * the engine reads it through the bpf syscall (emu/bpfmap.py).
 *
 * A PFC pause stops the real queue behind this port; the engine says so in
 * the map's second entry (its first field non-zero: paused), and the
 * virtual queue then fills without draining, as the real one does. The
 * engine writes only that entry, so it never races the program's own.
 *
 * Compile-time parameters (clang -D): RATE_BPS, KMIN_BYTES, KMAX_BYTES,
 * PMAX_Q16 (Pmax x 65536). Each attachment gets its own state map.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#ifndef RATE_BPS
#define RATE_BPS 20000000ULL
#endif
#ifndef KMIN_BYTES
#define KMIN_BYTES 102400ULL
#endif
#ifndef KMAX_BYTES
#define KMAX_BYTES 409600ULL
#endif
#ifndef PMAX_Q16
#define PMAX_Q16 13107ULL
#endif

struct vqueue {
	__u64 backlog_bytes;
	__u64 last_ns;
	__u64 marked;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2); /* 0: the virtual queue; 1: control (paused) */
	__type(key, __u32);
	__type(value, struct vqueue);
} vq SEC(".maps");

SEC("tc")
int ecn_mark(struct __sk_buff *skb)
{
	__u32 key = 0;
	struct vqueue *q = bpf_map_lookup_elem(&vq, &key);
	if (!q)
		return TC_ACT_UNSPEC;
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;

	__u32 ctl_key = 1;
	struct vqueue *ctl = bpf_map_lookup_elem(&vq, &ctl_key);
	__u64 now = bpf_ktime_get_ns();
	__u64 elapsed = now - q->last_ns;
	if (elapsed > 1000000000ULL)
		elapsed = 1000000000ULL;
	__u64 drained = elapsed * RATE_BPS / 8000000000ULL;
	if (ctl && ctl->backlog_bytes)
		drained = 0; /* paused: nothing leaves */
	__u64 backlog = q->backlog_bytes > drained ? q->backlog_bytes - drained : 0;
	q->last_ns = now;
	q->backlog_bytes = backlog + skb->len;

	int mark = 0;
	if (backlog > KMAX_BYTES) {
		mark = 1;
	} else if (backlog > KMIN_BYTES) {
		__u64 p = PMAX_Q16 * (backlog - KMIN_BYTES) / (KMAX_BYTES - KMIN_BYTES + 1);
		mark = (bpf_get_prandom_u32() & 0xffff) < p;
	}
	if (!mark)
		return TC_ACT_UNSPEC;

	if (bpf_skb_pull_data(skb, ETH_HLEN + sizeof(struct iphdr)) < 0)
		return TC_ACT_UNSPEC;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > end)
		return TC_ACT_UNSPEC;
	__u8 tos = ip->tos;
	if ((tos & 3) == 0)
		return TC_ACT_UNSPEC; /* not ECN-capable */
	if ((tos & 3) == 3)
		return TC_ACT_UNSPEC; /* already CE */
	__u16 old_word = *(__u16 *)ip;
	__u8 new_tos = tos | 3;
	__u16 new_word = old_word;
	((__u8 *)&new_word)[1] = new_tos;
	bpf_l3_csum_replace(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, check), old_word,
			    new_word, 2);
	bpf_skb_store_bytes(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, tos), &new_tos, 1, 0);
	__sync_fetch_and_add(&q->marked, 1);
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "GPL";
