"""The KV cache managers, on vLLM's seams: one manager per kind of KV group (its hit
search, caching, skipped-block release and allocation count), one map from kind to
manager, and the coordinators chosen by caching and group count."""
