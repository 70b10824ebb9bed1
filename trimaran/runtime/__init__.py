"""One connection runtime for the three hulls (DESIGN.md, "The connection runtime")."""
