"""Shared test setup. pytest's default (prepend) import mode puts this folder on sys.path when it loads this file, so
the helper modules here (rpg_oracles, verl_batch, cpu_trainer) are importable from every test subfolder."""
