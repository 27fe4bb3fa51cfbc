"""Small utilities shared by the library, benchmarks and tests."""
