"""The multipath hashes of the emulator's switches, as this machine's kernel and Open vSwitch
compute them, so that the simulator's `linux` and `ovs` policies predict the emulator's paths.

Linux (IPv4, `net.ipv4.fib_multipath_hash_policy = 1`, the L4 policy): the forwarding
path dissects the packet into a zeroed `struct flow_keys` holding only the protocol, the
ports and the addresses; `__flow_hash_consistentify` puts the lower address first (as
unsigned 32-bit words read in the machine's byte order) and, on its own, the lower port
first; SipHash-2-4 over the 48 bytes from `basic` to the end of the IPv4 addresses, keyed
with the namespace's `fib_multipath_hash_seed` s as the two 64-bit words (s << 32 | s);
0 becomes 1; the route lookup takes that shifted right by one (31 bits). A route's next
hops, in the order the route lists them, get upper bounds round(w * 2^31 / total) - 1 for
w = 1..n (equal weights); the first next hop whose bound is at least the hash is taken
(`fib_select_multipath`, hash-threshold). A next hop going away moves the bounds of all,
so some flows move that did not use it. A seed of 0 tells Linux to pick one at random,
so the emulator never gives one (`aifabric.fabric.routing.switch_seeds`).

Open vSwitch (3.x, select group, `selection_method=hash`, `fields(ip_src,ip_dst,nw_proto,
udp_src,udp_dst)`, `selection_method_param = seed`): the basis is `hash_uint64(seed)`;
every field in Open vSwitch's field order is folded in with `hash_bytes(value, n, basis)`
(network byte order, the Murmur3-style `hash_add` and `hash_finish`); every live bucket
scores `hash_int(bucket_id, basis) & 0xffff` and the last bucket with the highest score
wins (rendezvous hashing over the bucket ids the group was written with).

Both were checked against the machine: `ip route get` in a namespace of our own and
`ovs-appctl ofproto/trace` on a bridge of our own (tests/test_emu_hash.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aifabric.fabric._numba_cache import lean_loads

lean_loads()  # cached kernels load without numba's typing and lowering tables

_U32 = np.uint64(0xFFFFFFFF)


@njit(cache=True)
def _rotl64(x, b):
    return (x << np.uint64(b)) | (x >> np.uint64(64 - b))


@njit(cache=True)
def _sipround(v0, v1, v2, v3):
    v0 += v1
    v1 = _rotl64(v1, 13)
    v1 ^= v0
    v0 = _rotl64(v0, 32)
    v2 += v3
    v3 = _rotl64(v3, 16)
    v3 ^= v2
    v0 += v3
    v3 = _rotl64(v3, 21)
    v3 ^= v0
    v2 += v1
    v1 = _rotl64(v1, 17)
    v1 ^= v2
    v2 = _rotl64(v2, 32)
    return v0, v1, v2, v3


@njit(cache=True)
def siphash24(k0, k1, words, final):
    """SipHash-2-4 of the 64-bit little-endian `words`, then the last block `final`."""
    v0 = k0 ^ np.uint64(0x736F6D6570736575)
    v1 = k1 ^ np.uint64(0x646F72616E646F6D)
    v2 = k0 ^ np.uint64(0x6C7967656E657261)
    v3 = k1 ^ np.uint64(0x7465646279746573)
    n = words.shape[0]
    for i in range(n + 1):
        m = words[i] if i < n else final
        v3 ^= m
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0 ^= m
    v2 ^= np.uint64(0xFF)
    for _ in range(4):
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


@njit(cache=True)
def _bswap32(x):
    x = np.uint64(x) & _U32
    return (
        ((x & np.uint64(0xFF)) << np.uint64(24))
        | ((x & np.uint64(0xFF00)) << np.uint64(8))
        | ((x >> np.uint64(8)) & np.uint64(0xFF00))
        | (x >> np.uint64(24))
    )


@njit(cache=True)
def _bswap16(x):
    x = np.uint64(x) & np.uint64(0xFFFF)
    return ((x & np.uint64(0xFF)) << np.uint64(8)) | (x >> np.uint64(8))


@njit(cache=True)
def linux_hash(sip, dip, sport, dport, seed):
    """The 31-bit multipath hash Linux computes for a forwarded UDP packet (see the module)."""
    s = _bswap32(sip)  # the __be32 as the machine reads it
    d = _bswap32(dip)
    ps = _bswap16(sport)
    pd = _bswap16(dport)
    if d < s:
        s, d = d, s
    if pd < ps:
        ps, pd = pd, ps
    words = np.zeros(6, dtype=np.uint64)
    words[0] = np.uint64(17) << np.uint64(16)  # basic: n_proto 0, ip_proto
    words[3] = (ps | (pd << np.uint64(16))) << np.uint64(32)  # ports at 28
    words[4] = s << np.uint64(32)  # v4 src at 36
    words[5] = d  # v4 dst at 40, then 4 zero bytes of the address union
    k = np.uint64(seed) & _U32
    k = (k << np.uint64(32)) | k
    h = siphash24(k, k, words, np.uint64(48) << np.uint64(56)) & _U32
    if h == 0:
        h = np.uint64(1)
    return np.uint32(h >> np.uint64(1))


@njit(cache=True)
def linux_pick(h, n):
    """The next hop (0..n-1) hash-threshold selection takes for 31-bit hash h among n."""
    total = np.uint64(n)
    for w in range(1, n + 1):
        bound = ((np.uint64(w) << np.uint64(31)) + total // np.uint64(2)) // total
        if np.uint64(h) + np.uint64(1) <= bound:
            return w - 1
    return n - 1


@njit(cache=True)
def _mul32(a, b):
    return (a * b) & _U32


@njit(cache=True)
def _rotl32(x, k):
    return ((x << np.uint64(k)) | (x >> np.uint64(32 - k))) & _U32


@njit(cache=True)
def _hash_add(h, data):
    if data != 0:
        data = _mul32(data, np.uint64(0xCC9E2D51))
        data = _rotl32(data, 15)
        data = _mul32(data, np.uint64(0x1B873593))
        h ^= data
    h = _rotl32(h, 13)
    return (h * np.uint64(5) + np.uint64(0xE6546B64)) & _U32


@njit(cache=True)
def _hash_finish(h, final):
    h ^= np.uint64(final)
    h ^= h >> np.uint64(16)
    h = _mul32(h, np.uint64(0x85EBCA6B))
    h ^= h >> np.uint64(13)
    h = _mul32(h, np.uint64(0xC2B2AE35))
    h ^= h >> np.uint64(16)
    return h


@njit(cache=True)
def ovs_basis(sip, dip, sport, dport, seed):
    """The basis Open vSwitch's select group (`selection_method=hash`) scores buckets with."""
    x = np.uint64(seed)
    b = _hash_finish(_hash_add(_hash_add(np.uint64(0), x & _U32), x >> np.uint64(32)), 8)
    b = _hash_finish(_hash_add(b, _bswap32(sip)), 4)
    b = _hash_finish(_hash_add(b, _bswap32(dip)), 4)
    b = _hash_finish(_hash_add(b, np.uint64(17)), 1)
    b = _hash_finish(_hash_add(b, _bswap16(sport)), 2)
    b = _hash_finish(_hash_add(b, _bswap16(dport)), 2)
    return np.uint32(b)


@njit(cache=True)
def ovs_score(bucket_id, basis):
    """A bucket's score: `hash_int(bucket_id, basis) & 0xffff` (weight 1)."""
    h = _hash_add(_hash_add(np.uint64(bucket_id), np.uint64(0)), np.uint64(basis) & _U32)
    return _hash_finish(h, 8) & np.uint64(0xFFFF)


@njit(cache=True)
def ovs_pick(basis, n):
    """The bucket (0..n-1) a select group of n live buckets with ids 0..n-1 takes."""
    best = 0
    top = np.uint64(0)
    for i in range(n):
        score = ovs_score(i, basis)
        if score >= top:
            best = i
            top = score
    return best
