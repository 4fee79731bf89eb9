"""Reading run directories and packet captures; congestion, ECMP and completion metrics; reports.

- `capture`: pcap / pcapng into columnar arrays with numba kernels (RoCEv2 BTH, CNP,
  802.1Qbb PFC vs 802.3x PAUSE, ECN), reporting damaged files in one sentence.
- `dissect`: scapy's view of single packets (`aifabric pcap show`) and the slow
  reference the fast reader is tested against.
- `metrics`: metrics of a capture or of a run directory (per job and per op: time, ideal,
  efficiency, busbw; hot spots and PFC victims; throughput), and the summary `compare`
  shows, as the typed results of `results` (frozen dataclasses; `to_dict()` is the JSON).
- `frames`: a run directory's flows, per-port samples and collectives as pandas
  DataFrames (what `aifabric.Run` returns).
- `ecmp`: ECMP spread over the next hops flows could take, beside uniform hashing.
- `report`: the self-contained Plotly HTML report.
- `render`, `table`: the analyses as text for the terminal.
- `targets`: what the commands are given (a run directory, a capture, a pipe) turned into
  one call each: `analyze`, `report`, `compare`, `packets`.
"""

import aifabric.fabric  # noqa: E402, F401  (sets the numba cache directory first)
