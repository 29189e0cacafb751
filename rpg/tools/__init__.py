"""Command-line tools of rpg-verl (``python -m rpg.tools.<name>``; console scripts ``rpg-<name>``)."""
