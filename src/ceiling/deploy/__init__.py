"""``ceiling deploy``: a variant as a systemd unit and a Compose service (render.py), checked by
the real validators (validate.py); ``ceiling ready`` is the unit's readiness check (ready.py)."""
