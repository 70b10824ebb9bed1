"""The network edge: listeners, TLS and WebSocket under the connection runtime."""
