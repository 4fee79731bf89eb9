"""`aifabric clean` and the Mininet engine's commands (registered on import by aifabric.cli)."""
