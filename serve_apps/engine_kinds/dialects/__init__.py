"""Metrics dialects: what a kind of server says about its speculation, one module each (base.Dialect)."""
