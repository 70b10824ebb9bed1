"""Bridges to other brokers: each a client of the remote broker and a subscriber of the local router."""
