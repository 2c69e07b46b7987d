"""Tests of one part each, without vLLM: the spec, the proofs, the reference's parts, the
formats, the command line and the machinery of the live checks run against stand-ins."""
