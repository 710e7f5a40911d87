"""Tests of the bench scripts' own logic, on small runs."""
