"""Tests of the trainer's math and Steps: GAE, C51 projection, value norm, golden records, data
parallel, learning, the lr schedule."""
