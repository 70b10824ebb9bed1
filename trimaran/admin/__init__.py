"""The admin side: today the management page; the API, HTTP server, telemetry and webhooks move here
from broker/ in their own step (DESIGN.md's layout)."""
