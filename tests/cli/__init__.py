"""Tests of the `trident` commands, the actor, export, run folders, config and env fitting."""
