"""The AMQP 1.0 machine's own error, in a module of its own: mypyc, which compiles the machine
(trimaran/compiled.py), does not compile a subclass of RuntimeError."""

from __future__ import annotations


class AMQPStateError(RuntimeError):
    """The caller used the connection in a way its state does not allow."""
