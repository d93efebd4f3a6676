"""Serving the policy to programs that reach a model over HTTP (optional: needs the `feedback` extra)."""
