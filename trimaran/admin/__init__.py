"""The admin side: the HTTP server and API, the management page, telemetry and webhooks.

It sees the running server through trimaran/admin/view.py's protocols (the app and the MQTT hull
implement them) and imports no protocol hull (tests/admin/test_imports.py).
"""
