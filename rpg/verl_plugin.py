"""verl plugin entry point (placeholder while the core lands)."""
