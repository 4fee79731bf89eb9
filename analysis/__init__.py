"""Reading run directories and packet captures; congestion, ECMP and completion metrics; reports.

- `capture`: pcap / pcapng into columnar arrays with numba kernels (RoCEv2 BTH, CNP,
  802.1Qbb PFC vs 802.3x PAUSE, ECN), reporting damaged files in one sentence.
- `dissect`: scapy's view of single packets (`aifabric pcap show`) and the slow
  reference the fast reader is tested against.
- `metrics`: metrics of a capture or of a run directory, and the summary `compare` shows.
- `report`: the self-contained Plotly HTML report.
- `topology`: the `Fabric` a run recorded in its topology.json.
"""

import fabric  # noqa: E402, F401  (sets the numba cache directory first)
