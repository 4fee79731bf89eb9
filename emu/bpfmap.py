"""Reading the eBPF ECN marker's counter through the bpf(2) syscall (no bpftool needed).

tc names the program it attached (`id N`); the program names its one map;
the map's values are `struct vqueue` of ecn_marker.c: backlog_bytes,
last_ns, marked (three u64); entry 0 is the virtual queue, entry 1 the
engine's control (first field non-zero: the port is paused by PFC).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import struct

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine, 321)
_MAP_LOOKUP_ELEM = 1
_MAP_UPDATE_ELEM = 2
_PROG_GET_NEXT_ID = 11
_PROG_GET_FD_BY_ID = 13
_MAP_GET_FD_BY_ID = 14
_OBJ_GET_INFO_BY_FD = 15


def _bpf(cmd: int, attr: ctypes.Array) -> int:
    r = _libc.syscall(_SYS_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if r < 0:
        raise OSError(ctypes.get_errno(), f"bpf command {cmd} failed")
    return r


def program_ids() -> list[int]:
    """The ids of every bpf program loaded in the kernel (needs root)."""
    ids, start = [], 0
    while True:
        attr = ctypes.create_string_buffer(struct.pack("III", start, 0, 0), 16)
        try:
            _bpf(_PROG_GET_NEXT_ID, attr)
        except OSError as e:
            if e.errno == errno.ENOENT:  # no program after `start`
                return ids
            raise
        start = struct.unpack_from("I", attr, 4)[0]
        ids.append(start)


def prog_id_from_tc(tc_json: str) -> int | None:
    """The id of the bpf program in `tc -j filter show dev X egress` output."""
    for item in json.loads(tc_json or "[]"):
        prog = item.get("options", {}).get("prog")
        if prog:
            return int(prog["id"])
    return None


def map_of_prog(prog_id: int) -> int:
    """Open the (first) map of a program; returns a file descriptor the caller closes."""
    attr = ctypes.create_string_buffer(struct.pack("III", prog_id, 0, 0), 16)
    pfd = _bpf(_PROG_GET_FD_BY_ID, attr)
    try:
        ids = (ctypes.c_uint32 * 4)()
        info = ctypes.create_string_buffer(256)
        struct.pack_into("I", info, 52, 4)  # nr_map_ids
        struct.pack_into("Q", info, 56, ctypes.addressof(ids))  # map_ids
        attr = ctypes.create_string_buffer(
            struct.pack("IIQ", pfd, len(info), ctypes.addressof(info)), 16
        )
        _bpf(_OBJ_GET_INFO_BY_FD, attr)
        nr = struct.unpack_from("I", info, 52)[0]
        if nr < 1:
            raise OSError(0, f"bpf program {prog_id} has no map")
        attr = ctypes.create_string_buffer(struct.pack("III", ids[0], 0, 0), 16)
        return _bpf(_MAP_GET_FD_BY_ID, attr)
    finally:
        os.close(pfd)


def read_vqueue(map_fd: int) -> tuple[int, int, int]:
    """(backlog_bytes, last_ns, marked) of the marker's state."""
    key = ctypes.c_uint32(0)
    value = (ctypes.c_uint64 * 3)()
    attr = ctypes.create_string_buffer(
        struct.pack("IIQQQ", map_fd, 0, ctypes.addressof(key), ctypes.addressof(value), 0), 32
    )
    _bpf(_MAP_LOOKUP_ELEM, attr)
    return int(value[0]), int(value[1]), int(value[2])


def set_paused(map_fd: int, paused: bool) -> None:
    """Tell the marker its port is paused (its virtual queue stops draining) or resumed."""
    key = ctypes.c_uint32(1)
    value = (ctypes.c_uint64 * 3)(1 if paused else 0, 0, 0)
    attr = ctypes.create_string_buffer(
        struct.pack("IIQQQ", map_fd, 0, ctypes.addressof(key), ctypes.addressof(value), 0), 32
    )
    _bpf(_MAP_UPDATE_ELEM, attr)
