"""Data-side helpers of rpg-verl (not imported by the verl plugin entry point).

* :mod:`rpg.data.reward` -- the reference's reward routing (docs/differences.md#s7-4) as a verl
  ``reward.custom_reward_function`` for the sources verl 0.9.1's ``default_compute_score``
  cannot score (``amc_23``, ``minerva-math``, ``olympiadbench``).

The data-preparation and report tools are :mod:`rpg.tools.prepare_data` and :mod:`rpg.tools.report`.
"""
