"""Specs: the nouns that describe what is served (ModelSpec), on what (Hardware), and how
(Deployment), plus a measured hardware profile that overrides datasheet numbers."""
