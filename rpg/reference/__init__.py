"""The KL reference policy of RPG inside verl 0.9.1 (`iterative`, `frozen`, `periodic`, `ema`) and the adaptive β:
the runtime of the rows of the run-mode table `rpg.modes` (docs/reference-modes.md).

* ``iterative`` (default; paper §5 and every RPG script): π_ref = π_old, the policy that sampled the batch. The losses
  use ``old_log_prob``; no reference model is built (``actor.use_kl_loss=False``) and nothing in this package is
  installed.
* ``frozen``: π_ref = the initial model, computed by verl's own reference worker (``actor.use_kl_loss=True`` with
  ``actor.kl_loss_coef=0`` so that verl builds it and ships ``ref_log_prob`` but adds no KL term of its own). This is
  the Fig. 9 "no iterative reference" ablation. The losses use the ρ-weighted surrogates (ρ = π_ref/π_old).
* ``periodic``: the paper's scheme "set the reference to the current policy every K optimizer steps, or when a moving
  average of the token-level KL exceeds κ" (paper §5, "Iterative reference updates"; the authors' code does not
  implement it). Same verl setup as ``frozen``; in addition the reference weights are overwritten with the actor's.
* ``ema``: π_ref ← τ·π_ref + (1 − τ)·π_θ every ``ref_ema_period`` optimizer steps (EMA-PG, arXiv 2602.04417), an
  fp32 blend of each rank's own reference shards.
* ``kl_control='adaptive'`` (any mode): β follows Ziegler et al.'s proportional controller.

Under LoRA (docs/reference-modes.md#lora; `rpg.reference.lora_modes`) verl has no reference engine: it computes the
reference in the actor with the adapter disabled. ``iterative`` is unchanged, ``frozen`` is that adapter-free base,
``periodic`` is a snapshot of the policy's adapter swapped in for verl's reference pass (`rpg.reference.lora`), and
``ema`` is refused (a blend of the LoRA factors is not the EMA of the weights; the exact one needs a full-size ΔW).

Cost: ``frozen``/``periodic``/``ema`` keep a second copy of the weights (the reference engine; verl shards/offloads it
like the actor's parameters, without optimizer state) and run one extra forward pass per training step (verl's
``compute_ref_log_prob``). A ``periodic`` refresh copies the actor's parameter shards into the reference's (a memory
copy of each rank's own shards when both engines use the same FSDP2 layout; no forward pass).

One module per job (none is imported by this package's ``__init__``):

* `rpg.reference.adapter` — the ``ref_log_prob`` adapter around verl's ``ppo_loss`` (`current_ref_log_prob`);
* `rpg.reference.step` — `TrainingStep`, β and the two KL sums of one training step in the worker;
* `rpg.reference.micro_batch` — `MicroBatch`, what the pieces of ``ppo_loss`` publish for one micro-batch;
* `rpg.reference.schedule` — `RefreshSchedule`, when a written reference is refreshed (pure);
* `rpg.reference.weights` — the weight copy and the EMA blend on each rank's shards;
* `rpg.reference.written`, `rpg.reference.periodic`, `rpg.reference.ema`, `rpg.reference.adaptive_kl` — the per-mode
  state in verl's worker (schedule, write, metrics, checkpoint);
* `rpg.reference.lora_modes` (what each mode is under LoRA, pure) and `rpg.reference.lora` (the adapter snapshot and
  the periodic reference's LoRA state);
* `rpg.reference.hooks` — the hooks on ``ActorRolloutRefWorker`` that build and drive those states.

When verl is patched: only when a run asks for it, and only by `rpg.install`, the one installation point (through the
table of patch points `rpg.patches`), which also holds `require(settings)` (called by the RPG losses: it fails
clearly, naming the fix, when something the settings need is not installed in the process that runs them, e.g. a run
started with ``python -m verl.trainer.main_ppo`` without ``RPG_INSTALL``; docs/reference-modes.md#installation).
"""
