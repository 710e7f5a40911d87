"""Tests of the op set and its executors: gradients against PyTorch, Philox, optimizers,
collectives, kernel compilation."""
