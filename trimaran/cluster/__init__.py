"""Several nodes on one PostgreSQL: membership, routes, forwards and session hand-over."""
