"""The reference on cases worked by hand from vLLM's code: each step's decisions written
out, then checked step by step."""
