"""Tests of the repository as a whole: README and docs, comments, the layers."""
