"""`aifabric traffic ...`: workloads shown and exported (registered on import by aifabric.cli)."""
