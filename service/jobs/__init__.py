"""The jobs Trident runs in-process: the LobSim main job (host and device loops, evaluation) and
the contextual-bandit job."""
