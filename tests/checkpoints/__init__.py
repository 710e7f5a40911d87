"""Tests of checkpoints: atomic writes, manifests, formats, disk-full and corrupt days."""
