"""Identities, passwords and one permission model for every protocol (DESIGN.md, "Security model")."""
