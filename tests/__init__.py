"""The test suite; not part of the distribution."""
