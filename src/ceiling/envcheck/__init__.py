"""``ceiling env``: the serving stack's compatibility, read from what is installed (check.py)."""
