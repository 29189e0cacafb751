"""Pre-launch checks of the RPG recipes, one module per concept (see `rpg.launch`, the entry point that runs them)."""
