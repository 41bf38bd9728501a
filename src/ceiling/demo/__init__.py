"""Demo assets (the tiny model builder) that run without a GPU."""
