"""Smoke tests of the benchmark harness."""
