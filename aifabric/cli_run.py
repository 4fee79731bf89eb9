"""`aifabric run ...`: scenarios on an engine (registered on import by aifabric.cli)."""
