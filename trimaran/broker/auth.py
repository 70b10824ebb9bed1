"""Who may connect: one user table for every protocol (MQTT CONNECT, AMQP SASL PLAIN / AMQPLAIN)."""

from __future__ import annotations

import enum
import hmac

from trimaran.config import AuthSettings


class AuthResult(enum.Enum):
    OK = "ok"
    ANONYMOUS_REFUSED = "anonymous refused"
    BAD_CREDENTIALS = "bad user name or password"


class Authenticator:
    def __init__(self, settings: AuthSettings) -> None:
        self.allow_anonymous = settings.allow_anonymous
        self._passwords = {user.name: user.password.get_secret_value().encode() for user in settings.users}

    def check(self, username: str | None, password: str | bytes | None) -> AuthResult:
        """``username=None`` is an anonymous client; compare passwords in constant time."""
        if username is None or (not self._passwords and self.allow_anonymous):
            # With no users configured, a user name (even an empty one, as several MQTT client
            # libraries send) names nobody: the client is anonymous, as Mosquitto treats it with
            # allow_anonymous and no password file. Users that exist always need their password.
            return AuthResult.OK if self.allow_anonymous else AuthResult.ANONYMOUS_REFUSED
        expected = self._passwords.get(username)
        if isinstance(password, str):
            password = password.encode()
        if expected is None or password is None or not hmac.compare_digest(password, expected):
            return AuthResult.BAD_CREDENTIALS
        return AuthResult.OK
