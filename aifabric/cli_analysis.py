"""`aifabric analyze | report | compare | pcap ...` (registered on import by aifabric.cli)."""
