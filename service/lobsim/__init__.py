"""LobSim: vectorised limit-order-book markets (see SPEC.md for the matching contract)."""
