"""Benchmarks for corral: run by hand, never collected as tests."""
