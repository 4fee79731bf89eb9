"""Fuzz the capture reader: mutated and random pcap / pcapng bytes.

Every input must give a `Capture` whose columns agree with each other, or an
`AifabricError`; anything else (another exception, a crash of the compiled
kernels, a hang) is a bug. tests/test_properties.py runs this in a child
process with a time limit, so a crash or a hang fails the test instead of
taking pytest down; by hand, at length:

    python -m tests.fuzz_capture --iterations 100000 --seed 7

Mutations start from the golden captures in tests/data: bit flips, bytes set
to boundary values, header and record fields overwritten with extreme
lengths, cuts, duplicated and inserted spans; one input in eight is random
bytes behind a valid magic number.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from aifabric.analysis.capture import PCAP_MAGICS, PCAPNG_MAGIC, read_capture
from aifabric.fabric.errors import AifabricError

DATA = Path(__file__).resolve().parent / "data"
EXTREMES = (0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 65535, 262144)


def seeds() -> list[bytes]:
    return [p.read_bytes() for p in sorted(DATA.glob("golden*.pcap*"))]


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(data)
    for _ in range(int(rng.integers(1, 6))):
        if not b:
            b = bytearray(PCAP_MAGICS_LIST[int(rng.integers(len(PCAP_MAGICS_LIST)))])
        op = int(rng.integers(7))
        at = int(rng.integers(len(b)))
        if op == 0:  # flip a bit
            b[at] ^= 1 << int(rng.integers(8))
        elif op == 1:  # a boundary byte
            b[at] = int(rng.choice([0, 1, 0x7F, 0x80, 0xFF]))
        elif op == 2:  # a 32-bit field (a length, a snaplen, a block size) set to an extreme
            value = int(rng.choice(EXTREMES)).to_bytes(4, str(rng.choice(["little", "big"])))
            b[at : at + 4] = value
        elif op == 3:  # cut the file
            del b[at:]
        elif op == 4:  # duplicate a span
            end = min(len(b), at + int(rng.integers(1, 512)))
            b[at:at] = b[at:end]
        elif op == 5:  # insert random bytes
            b[at:at] = rng.bytes(int(rng.integers(1, 64)))
        else:  # delete a span
            del b[at : at + int(rng.integers(1, 64))]
    return bytes(b)


PCAP_MAGICS_LIST = [*PCAP_MAGICS, PCAPNG_MAGIC]


def random_capture(rng: np.random.Generator) -> bytes:
    magic = PCAP_MAGICS_LIST[int(rng.integers(len(PCAP_MAGICS_LIST)))]
    return magic + rng.bytes(int(rng.integers(0, 2048)))


def check(path: Path) -> str | None:
    """None when the reader behaved, else what went wrong."""
    try:
        cap = read_capture(path)
    except AifabricError as e:
        message = str(e)
        if not message or "\n" in message:
            return f"an AifabricError that is not one sentence: {message!r}"
        return None
    except Exception:
        return traceback.format_exc()
    n = len(cap)
    shapes = [cap.u8.shape[1], cap.u32.shape[1], cap.u64.shape[1], cap.quanta.shape[0]]
    if any(s != n for s in shapes):
        return f"columns of unequal length: {n} rows, {shapes}"
    if not 0 <= cap.read_bytes <= cap.size_bytes:
        return f"read_bytes {cap.read_bytes} outside the file's {cap.size_bytes}"
    if n and int(cap.caplen.max(initial=0)) > cap.size_bytes:
        return "a packet longer than the file"
    if "\n" in cap.problem:
        return f"a problem that is not one sentence: {cap.problem!r}"
    return None


def run(iterations: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    pool = seeds()
    failures = 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="aifabric-fuzz-") as d:
        path = Path(d) / "fuzz.pcap"
        for i in range(iterations):
            if i % 8 == 7:
                data = random_capture(rng)
            else:
                data = mutate(pool[int(rng.integers(len(pool)))], rng)
            path.write_bytes(data)
            problem = check(path)
            if problem:
                failures += 1
                keep = Path(d).parent / f"aifabric-fuzz-failure-{seed}-{i}.pcap"
                keep.write_bytes(data)
                print(f"input {i} (kept as {keep}): {problem}", file=sys.stderr)
                if failures >= 5:
                    break
    print(f"{iterations} inputs, {failures} failures, {time.monotonic() - t0:.1f} s")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--iterations", type=int, default=int(os.environ.get("AIFABRIC_FUZZ_ITERATIONS", 2000))
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    return run(args.iterations, args.seed)


if __name__ == "__main__":
    sys.exit(main())
