"""The recipe table: every experiment script of recipe/rpg/ (the Qwen3-4B set, its one-GPU LoRA variants, the authors'
7B matrix, the CPU runs), one row each, the one place they are written. `python -m rpg.tools.recipes --write`
generates the scripts from it; tests/recipes/test_recipe_table_on_cpu.py fails when a script drifts from its row.

A row is the script's path under recipe/rpg/, its comment (what it runs and where the paper reports it) and its line:
Hydra config-group choices of rpg/config/ (setup, method, optim, profile) and the overrides the script adds. Standard
library only.
"""

from __future__ import annotations

from typing import NamedTuple


class Recipe(NamedTuple):
    path: str  # under recipe/rpg/
    comment: str
    choices: tuple[str, ...]

    @property
    def directory(self) -> str:
        return self.path.split("/")[0]


def _recipe(path: str, comment: str, *choices: str) -> Recipe:
    return Recipe(path, comment, choices)


def rpg(method: str, divergence: str, beta: str) -> tuple[str, ...]:
    """An RPG method (rpg | rpg_reinforce | rpg_reinforce_hardclip) with its divergence and β."""
    return f"method={method}", f"recipe.divergence={divergence}", f"recipe.beta={beta}"


def reference(kind: str) -> tuple[str, ...]:
    """A KL reference other than the iterative one (frozen | periodic): verl builds the reference model
    (use_kl_loss=True) and adds no KL of its own (kl_loss_coef=0)."""
    return (
        f"actor_rollout_ref.actor.policy_loss.reference={kind}",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.0",
    )


#: The ratio clip (ε1, ε2) = (0.1, 0.1) of the clip ablation (Fig. 8).
CLIP_0_1 = ("actor_rollout_ref.actor.clip_ratio_low=0.1", "actor_rollout_ref.actor.clip_ratio_high=0.1")
#: The learning rate of the authors' REINFORCE scripts (docs/differences.md#d14).
LR_5E_7 = "actor_rollout_ref.actor.optim.lr=5e-7"
#: ... and their token budget, 4 × (prompt + response) (docs/differences.md#d14).
AUTHORS_REINFORCE = (LR_5E_7, "recipe.token_len_factor=4")


RECIPES: tuple[Recipe, ...] = (
    _recipe("4b/run_dapo_2k.sh", """\
DAPO — Qwen3-4B, 2K context. Paper: Table 6, Fig. 6, row "DAPO".""",
           "setup=qwen3_4b_2k", "method=dapo"),
    _recipe("4b/run_dapo_4k.sh", """\
DAPO — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "DAPO".""",
           "setup=qwen3_4b_4k", "method=dapo"),
    _recipe("4b/run_dapo_8k.sh", """\
DAPO — Qwen3-4B, 8K context. Paper: Table 3, Fig. 4, row "DAPO".""",
           "setup=qwen3_4b_8k", "method=dapo"),
    _recipe("4b/run_gspo_urkl_4k.sh", """\
GSPO + RPG's URKL — Qwen3-4B, 4K context. Not a paper row: verl's GSPO loss (sequence-level ratio, clip
(3e-4, 4e-4), seq-mean-token-mean) with the URKL regulariser added at the token ratio, β = 1e-4, iterative reference
(docs/losses.md#kl-addon). Its KL term is aggregated with the constant denominator B·loss_scale_factor (4096, the
maximum response length), not GSPO's seq-mean-token-mean: exact, and β per token is scaled by the mean response
length over 4096 against a token-mean run (docs/losses.md#kl-aggregation). Dynamic sampling and the overlong penalty
as every recipe here.""",
           "setup=qwen3_4b_4k", "method=rpg_kl", "recipe.divergence=urkl", "recipe.beta=1e-4", "recipe.base=gspo",
           "actor_rollout_ref.actor.clip_ratio_low=3e-4", "actor_rollout_ref.actor.clip_ratio_high=4e-4",
           "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean", "actor_rollout_ref.actor.loss_scale_factor=4096"),
    _recipe("4b/run_grpo_2k.sh", """\
GRPO — Qwen3-4B, 2K context. Paper: Table 6, Fig. 6, row "GRPO".""",
           "setup=qwen3_4b_2k", "method=grpo"),
    _recipe("4b/run_grpo_4k.sh", """\
GRPO — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "GRPO".""",
           "setup=qwen3_4b_4k", "method=grpo"),
    _recipe("4b/run_grpo_8k.sh", """\
GRPO — Qwen3-4B, 8K context. Paper: Table 3, Fig. 4, row "GRPO".""",
           "setup=qwen3_4b_8k", "method=grpo"),
    _recipe("4b/run_rfpp_2k.sh", """\
REINFORCE++ — Qwen3-4B, 2K context. Paper: not in the paper's tables at this context.""",
           "setup=qwen3_4b_2k", "method=reinforce_pp"),
    _recipe("4b/run_rfpp_4k.sh", """\
REINFORCE++ — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "REINFORCE++".""",
           "setup=qwen3_4b_4k", "method=reinforce_pp"),
    _recipe("4b/run_rfpp_8k.sh", """\
REINFORCE++ — Qwen3-4B, 8K context. Paper: not in the paper's tables at this context.""",
           "setup=qwen3_4b_8k", "method=reinforce_pp"),
    _recipe("4b/run_rfppb_2k.sh", """\
REINFORCE++-Baseline — Qwen3-4B, 2K context. Paper: not in the paper's tables at this context.""",
           "setup=qwen3_4b_2k", "method=reinforce_pp_baseline"),
    _recipe("4b/run_rfppb_4k.sh", """\
REINFORCE++-Baseline — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "REINFORCE++-Baseline".""",
           "setup=qwen3_4b_4k", "method=reinforce_pp_baseline"),
    _recipe("4b/run_rfppb_8k.sh", """\
REINFORCE++-Baseline — Qwen3-4B, 8K context. Paper: not in the paper's tables at this context.""",
           "setup=qwen3_4b_8k", "method=reinforce_pp_baseline"),
    _recipe("4b/run_rpg_reinforce_ufkl_2k.sh", """\
RPG-REINFORCE-UFKL — Qwen3-4B, 2K context. Paper: Table 6, Fig. 6, row "RPG-REINFORCE-UFKL".""",
           "setup=qwen3_4b_2k", *rpg("rpg_reinforce", "ufkl", "1e-4")),
    _recipe("4b/run_rpg_reinforce_ufkl_2k_clip0.1_0.1.sh", """\
RPG-REINFORCE-UFKL with clip (0.1, 0.1) — Qwen3-4B, 2K context. Paper: Fig. 8 (clip ablation;
compare run_rpg_reinforce_ufkl_2k.sh with (0.2, 0.28)).""",
           "setup=qwen3_4b_2k", *rpg("rpg_reinforce", "ufkl", "1e-4"), *CLIP_0_1),
    _recipe("4b/run_rpg_reinforce_ufkl_4k.sh", """\
RPG-REINFORCE-UFKL — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "RPG-REINFORCE-UFKL".""",
           "setup=qwen3_4b_4k", *rpg("rpg_reinforce", "ufkl", "1e-4")),
    _recipe("4b/run_rpg_reinforce_ufkl_4k_beta1e-3.sh", """\
RPG-REINFORCE-UFKL with β = 1e-3 — Qwen3-4B, 4K context. Paper: Fig. 9 (KL-coefficient ablation;
compare run_rpg_reinforce_ufkl_4k.sh with β = 1e-4).""",
           "setup=qwen3_4b_4k", *rpg("rpg_reinforce", "ufkl", "1e-3")),
    _recipe("4b/run_rpg_reinforce_ufkl_4k_beta1e-3_noiterref.sh", """\
RPG-REINFORCE-UFKL with β = 1e-3 and no iterative reference — Qwen3-4B, 4K context. Paper: Fig. 9 "noiterref".
The KL reference is the frozen initial model: verl builds it (use_kl_loss=True) and adds no KL of its own
(kl_loss_coef=0); the loss uses the ρ-weighted estimator of docs/losses.md#rho-weighting (the authors' code had none,
docs/differences.md#d10).""",
           "setup=qwen3_4b_4k", *rpg("rpg_reinforce", "ufkl", "1e-3"), *reference("frozen")),
    _recipe("4b/run_rpg_reinforce_ufkl_8k.sh", """\
RPG-REINFORCE-UFKL — Qwen3-4B, 8K context. Paper: Table 3, Fig. 4, row "RPG-REINFORCE-UFKL".""",
           "setup=qwen3_4b_8k", *rpg("rpg_reinforce", "ufkl", "1e-4")),
    _recipe("4b/run_rpg_reinforce_urkl_2k.sh", """\
RPG-REINFORCE-URKL — Qwen3-4B, 2K context. Paper: Table 6, Fig. 6, row "RPG-REINFORCE-URKL".""",
           "setup=qwen3_4b_2k", *rpg("rpg_reinforce", "urkl", "1e-4")),
    _recipe("4b/run_rpg_reinforce_urkl_2k_clip0.1_0.1.sh", """\
RPG-REINFORCE-URKL with clip (0.1, 0.1) — Qwen3-4B, 2K context. Paper: Fig. 8 (clip ablation;
compare run_rpg_reinforce_urkl_2k.sh with (0.2, 0.28)).""",
           "setup=qwen3_4b_2k", *rpg("rpg_reinforce", "urkl", "1e-4"), *CLIP_0_1),
    _recipe("4b/run_rpg_reinforce_urkl_4k.sh", """\
RPG-REINFORCE-URKL — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "RPG-REINFORCE-URKL".""",
           "setup=qwen3_4b_4k", *rpg("rpg_reinforce", "urkl", "1e-4")),
    _recipe("4b/run_rpg_reinforce_urkl_4k_async.sh", """\
RPG-REINFORCE-URKL — Qwen3-4B, 4K context, asynchronous: the paper's best configuration (Tables 5 and 7, row
"RPG-REINFORCE-URKL", as run_rpg_reinforce_urkl_4k.sh) on verl's colocated asynchronous trainer. Not a paper row:
the paper trains synchronously. Generation runs one batch ahead of the update, so samples are up to a version stale
(μ ≠ π_old); π_old is recomputed by the actor and token-level TIS weights v̄ = min(π_old/μ, 2) correct the measure
(docs/async.md#modes, docs/async.md#truncation). TRAINER_MODE in the environment wins (sync gives the paper's run
plus TIS weights); OLD_LOGPROB=rollout is refused here, since bypass mode would ignore the TIS weights.""",
           "setup=qwen3_4b_4k", *rpg("rpg_reinforce", "urkl", "1e-4"), "trainer.v1.trainer_mode=colocate_async",
           "algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2.0"),
    _recipe("4b/run_rpg_reinforce_urkl_4k_periodic.sh", """\
RPG-REINFORCE-URKL with the paper's periodic reference — Qwen3-4B, 4K context. Paper §5 "Iterative reference
updates": π_ref ← π_θ every K optimizer steps or when a moving average of the token KL exceeds κ (no values given;
the authors' code only refreshes every training step). K = 64 here = every 4 training steps (16 updates each);
set REF_REFRESH_STEPS / REF_REFRESH_KL in the environment. Not a paper table row: the scheme the paper describes.""",
           "setup=qwen3_4b_4k", *rpg("rpg_reinforce", "urkl", "1e-4"), *reference("periodic"),
           "actor_rollout_ref.actor.policy_loss.ref_refresh_steps=64"),
    _recipe("4b/run_rpg_reinforce_urkl_4k_ema.sh", """\
RPG-REINFORCE-URKL with an EMA (Polyak) reference — Qwen3-4B, 4K context. Not a paper row: π_ref ← τ·π_ref +
(1 − τ)·π_θ after every P optimizer steps (EMA-PG, arXiv 2602.04417; docs/reference-modes.md#ema), τ = 0.99 and
P = 16 (one training step) here; τ = 0 is the periodic reference, τ → 1 the frozen one. Set REF_EMA_DECAY /
REF_EMA_PERIOD in the environment. No value was tuned at this scale.""",
           "setup=qwen3_4b_4k", *rpg("rpg_reinforce", "urkl", "1e-4"), *reference("ema"),
           "actor_rollout_ref.actor.policy_loss.ref_ema_decay=0.99",
           "actor_rollout_ref.actor.policy_loss.ref_ema_period=16"),
    _recipe("4b/run_rpg_reinforce_urkl_4k_adaptive_beta.sh", """\
RPG-REINFORCE-URKL with an adaptive β — Qwen3-4B, 4K context. Not a paper row: β starts at 1e-4 and follows the
proportional controller of Ziegler et al. 2019 towards a target of actor/rpg/kl (here the KL to π_old, the policy's
drift within a training step; docs/losses.md#adaptive-beta), horizon H = 10 training steps. The target 1e-3 nats per
token is a starting point, not a measured value: set KL_TARGET / KL_HORIZON in the environment.""",
           "setup=qwen3_4b_4k", *rpg("rpg_reinforce", "urkl", "1e-4"),
           "actor_rollout_ref.actor.policy_loss.kl_control=adaptive",
           "actor_rollout_ref.actor.policy_loss.kl_target=1e-3", "actor_rollout_ref.actor.policy_loss.kl_horizon=10"),
    _recipe("4b/run_rpg_reinforce_urkl_4k_seqkl.sh", """\
RPG-REINFORCE-URKL with sequence-level KL credit — Qwen3-4B, 4K context. Not a paper row: token t's KL weight also
credits the KL terms of the tokens after it, an estimate of the gradient of the KL between whole responses (Tang &
Munos, arXiv 2506.09477; docs/losses.md#kl-credit) instead of the per-token one every paper number uses. Exact only
with kl_ratio=raw and no clip active (and up to token-mean's O(1/B), docs/losses.md#kl-aggregation); this recipe keeps
the default kl_ratio=clipped, C_KL at the clipped ratio (Remark F.2), the documented approximation.""",
           "setup=qwen3_4b_4k", *rpg("rpg_reinforce", "urkl", "1e-4"),
           "actor_rollout_ref.actor.policy_loss.kl_credit=sequence"),
    _recipe("4b/run_rpg_reinforce_urkl_8k.sh", """\
RPG-REINFORCE-URKL — Qwen3-4B, 8K context. Paper: Table 3, Fig. 4, row "RPG-REINFORCE-URKL".""",
           "setup=qwen3_4b_8k", *rpg("rpg_reinforce", "urkl", "1e-4")),
    _recipe("4b/run_rpg_ufkl_2k.sh", """\
RPG-UFKL — Qwen3-4B, 2K context. Paper: Table 6, Fig. 6, row "RPG-UFKL".""",
           "setup=qwen3_4b_2k", *rpg("rpg", "ufkl", "1e-4")),
    _recipe("4b/run_rpg_ufkl_4k.sh", """\
RPG-UFKL — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "RPG-UFKL".""",
           "setup=qwen3_4b_4k", *rpg("rpg", "ufkl", "1e-4")),
    _recipe("4b/run_rpg_ufkl_8k.sh", """\
RPG-UFKL — Qwen3-4B, 8K context. Paper: Table 3, Fig. 4, row "RPG-UFKL".""",
           "setup=qwen3_4b_8k", *rpg("rpg", "ufkl", "1e-4")),
    _recipe("4b/run_rpg_urkl_2k.sh", """\
RPG-URKL — Qwen3-4B, 2K context. Paper: Table 6, Fig. 6, row "RPG-URKL".""",
           "setup=qwen3_4b_2k", *rpg("rpg", "urkl", "1e-4")),
    _recipe("4b/run_rpg_urkl_4k.sh", """\
RPG-URKL — Qwen3-4B, 4K context. Paper: Tables 5 and 7, Fig. 5, row "RPG-URKL".""",
           "setup=qwen3_4b_4k", *rpg("rpg", "urkl", "1e-4")),
    _recipe("4b/run_rpg_urkl_4k_topk.sh", """\
RPG-URKL with the top-k KL — Qwen3-4B, 4K context. Not a paper row: the pair of run_rpg_urkl_4k.sh (Tables 5 and 7,
row "RPG-URKL", the sampled estimator) at the paper's β = 1e-4, with the per-token KL computed from the logits on
π_old's 64 most probable tokens plus the sampled tail (unbiased; docs/losses.md#topk-kl). Costs 512 bytes per token
between the old-log-prob pass and the update and one more logits gradient in the backward (the memory plan counts
both). Not trained at this scale yet.""",
           "setup=qwen3_4b_4k", *rpg("rpg", "urkl", "1e-4"), "actor_rollout_ref.actor.policy_loss.kl_estimator=topk",
           "actor_rollout_ref.actor.policy_loss.kl_topk=64", "actor_rollout_ref.actor.policy_loss.kl_topk_tail=sampled"),
    _recipe("4b/run_rpg_urkl_8k.sh", """\
RPG-URKL — Qwen3-4B, 8K context. Paper: Table 3, Fig. 4, row "RPG-URKL".""",
           "setup=qwen3_4b_8k", *rpg("rpg", "urkl", "1e-4")),
    _recipe("1gpu/run_dapo_2k_lora.sh", """\
DAPO with LoRA on one GPU — Qwen3-4B, 2K context. Not the paper's setting: the paper's row "DAPO" (Table 6, Fig. 6;
4b/run_dapo_2k.sh) trains every weight on 8 × H100. Same data, rewards, batch and evaluation; LoRA on every linear
layer, rank 32, α = 32, learning rate 1e-5 = 10 × the row's 1e-6 (LoRA Without Regret, Schulman et al., Thinking
Machines Lab, 2025; rpg/config/setup/lora_1gpu.yaml). Fits one 80 GB GPU by the memory plan (docs/gpu.md#lora).
Projected wall time on one GPU: 225-379 hours, 9-16 days (recipe/rpg/README.md#one-gpu).""",
           "setup=qwen3_4b_2k_lora", "method=dapo"),
    _recipe("1gpu/run_dapo_4k_lora.sh", """\
DAPO with LoRA on one GPU — Qwen3-4B, 4K context. Not the paper's setting: the paper's row "DAPO" (Tables 5 and 7,
Fig. 5; 4b/run_dapo_4k.sh) trains every weight on 8 × H100. Same data, rewards, batch and evaluation; LoRA on every
linear layer, rank 32, α = 32, learning rate 1e-5 = 10 × the row's 1e-6 (LoRA Without Regret, Schulman et al.,
Thinking Machines Lab, 2025; rpg/config/setup/lora_1gpu.yaml). Fits one 80 GB GPU by the memory plan
(docs/gpu.md#lora). Projected wall time on one GPU: 263-819 hours, 11-34 days, 5-19 days of it validation
(recipe/rpg/README.md#one-gpu).""",
           "setup=qwen3_4b_4k_lora", "method=dapo"),
    _recipe("1gpu/run_dapo_qwen3_1_7b_2k_lora.sh", """\
DAPO with LoRA on one GPU — Qwen3-1.7B, 2K context: the small-scale pair of
run_rpg_reinforce_urkl_qwen3_1_7b_2k_lora.sh. Not the paper's setting: 128 prompts × 8 responses per step, 200 steps
(rpg/config/setup/qwen3_1_7b_2k_lora.yaml says what the pair can and cannot show); LoRA on every linear layer, rank
32, α = 32, learning rate 1e-5 (LoRA Without Regret, Schulman et al., Thinking Machines Lab, 2025). Projected cost:
6-11 GPU-hours (recipe/rpg/README.md#one-gpu).""",
           "setup=qwen3_1_7b_2k_lora", "method=dapo"),
    _recipe("1gpu/run_rpg_reinforce_urkl_2k_lora.sh", """\
RPG-REINFORCE-URKL with LoRA on one GPU — Qwen3-4B, 2K context. Not the paper's setting: the paper's row
"RPG-REINFORCE-URKL" (Table 6, Fig. 6; 4b/run_rpg_reinforce_urkl_2k.sh) trains every weight on 8 × H100. Same data,
rewards, β, batch and evaluation; LoRA on every linear layer, rank 32, α = 32, learning rate 1e-5 = 10 × the row's
1e-6 (LoRA Without Regret, Schulman et al., Thinking Machines Lab, 2025; rpg/config/setup/lora_1gpu.yaml). The
iterative reference π_old is the policy before the update, adapter included (docs/reference-modes.md#lora). Fits one
80 GB GPU by the memory plan (docs/gpu.md#lora). Projected wall time on one GPU: 225-379 hours, 9-16 days
(recipe/rpg/README.md#one-gpu).""",
           "setup=qwen3_4b_2k_lora", *rpg("rpg_reinforce", "urkl", "1e-4")),
    _recipe("1gpu/run_rpg_reinforce_urkl_4k_lora.sh", """\
RPG-REINFORCE-URKL with LoRA on one GPU — Qwen3-4B, 4K context. Not the paper's setting: the paper's row
"RPG-REINFORCE-URKL" (Tables 5 and 7, Fig. 5; 4b/run_rpg_reinforce_urkl_4k.sh) trains every weight on 8 × H100. Same
data, rewards, β, batch and evaluation; LoRA on every linear layer, rank 32, α = 32, learning rate 1e-5 = 10 × the
row's 1e-6 (LoRA Without Regret, Schulman et al., Thinking Machines Lab, 2025; rpg/config/setup/lora_1gpu.yaml).
Fits one 80 GB GPU by the memory plan (docs/gpu.md#lora). Projected wall time on one GPU: 263-819 hours, 11-34 days,
5-19 days of it validation (recipe/rpg/README.md#one-gpu).""",
           "setup=qwen3_4b_4k_lora", *rpg("rpg_reinforce", "urkl", "1e-4")),
    _recipe("1gpu/run_rpg_reinforce_urkl_qwen3_1_7b_2k_lora.sh", """\
RPG-REINFORCE-URKL with LoRA on one GPU — Qwen3-1.7B, 2K context: the small-scale pair of
run_dapo_qwen3_1_7b_2k_lora.sh. Not the paper's setting: 128 prompts × 8 responses per step, 200 steps
(rpg/config/setup/qwen3_1_7b_2k_lora.yaml says what the pair can and cannot show); LoRA on every linear layer, rank
32, α = 32, learning rate 1e-5 (LoRA Without Regret, Schulman et al., Thinking Machines Lab, 2025). Projected cost:
6-11 GPU-hours (recipe/rpg/README.md#one-gpu).""",
           "setup=qwen3_1_7b_2k_lora", *rpg("rpg_reinforce", "urkl", "1e-4")),
    _recipe("7b/run_dapo_7b.sh", """\
DAPO — Qwen2.5-Math-7B, 2K context.
The authors' script #1 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", "method=dapo"),
    _recipe("7b/run_dapo_7b_schedulefree.sh", """\
DAPO — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #2 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", "method=dapo", "optim=schedulefree"),
    _recipe("7b/run_dapo_7b_schedulefree_7binstruct.sh", """\
DAPO — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #3 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_instruct", "method=dapo", "optim=schedulefree"),
    _recipe("7b/run_dapo_7binstruct.sh", """\
DAPO — Qwen2.5-7B-Instruct, 2K context.
The authors' script #4 (docs/differences.md#authors-scripts); Table 8 row "DAPO".""",
           "setup=authors_7b_instruct", "method=dapo"),
    _recipe("7b/run_grpo_7b.sh", """\
GRPO — Qwen2.5-Math-7B, 2K context.
The authors' script #5 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", "method=grpo"),
    _recipe("7b/run_grpo_7b_7binstruct.sh", """\
GRPO — Qwen2.5-7B-Instruct, 2K context.
The authors' script #6 (docs/differences.md#authors-scripts); Table 8 row "GRPO".""",
           "setup=authors_7b_instruct", "method=grpo"),
    _recipe("7b/run_grpo_7b_schedulefree.sh", """\
GRPO — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #7 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", "method=grpo", "optim=schedulefree"),
    _recipe("7b/run_grpo_7b_schedulefree_7binstruct.sh", """\
GRPO — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #8 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_instruct", "method=grpo", "optim=schedulefree"),
    _recipe("7b/run_rfpp_7b_1e-4.sh", """\
REINFORCE++ — Qwen2.5-Math-7B, 2K context.
The authors' script #9 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", "method=reinforce_pp"),
    _recipe("7b/run_rfpp_7b_1e-4_7binstruct.sh", """\
REINFORCE++ — Qwen2.5-7B-Instruct, 2K context.
The authors' script #10 (docs/differences.md#authors-scripts); Table 8 row "REINFORCE++".""",
           "setup=authors_7b_instruct", "method=reinforce_pp"),
    _recipe("7b/run_rfpp_7b_1e-4_schedulefree.sh", """\
REINFORCE++ — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #11 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", "method=reinforce_pp", "optim=schedulefree"),
    _recipe("7b/run_rfpp_7b_1e-4_schedulefree_7binstruct.sh", """\
REINFORCE++ — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #12 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_instruct", "method=reinforce_pp", "optim=schedulefree"),
    _recipe("7b/run_rfppb_7b_1e-4.sh", """\
REINFORCE++-Baseline — Qwen2.5-Math-7B, 2K context.
The authors' script #13 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", "method=reinforce_pp_baseline"),
    _recipe("7b/run_rfppb_7b_1e-4_7binstruct.sh", """\
REINFORCE++-Baseline — Qwen2.5-7B-Instruct, 2K context.
The authors' script #14 (docs/differences.md#authors-scripts); Table 8 row "REINFORCE++-Baseline".""",
           "setup=authors_7b_instruct", "method=reinforce_pp_baseline"),
    _recipe("7b/run_rfppb_7b_1e-4_schedulefree.sh", """\
REINFORCE++-Baseline — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #15 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", "method=reinforce_pp_baseline", "optim=schedulefree"),
    _recipe("7b/run_rfppb_7b_1e-4_schedulefree_7binstruct.sh", """\
REINFORCE++-Baseline — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #16 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_instruct", "method=reinforce_pp_baseline", "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_fkl1e-4.sh", """\
RPG-FKL (fully differentiable, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context.
The authors' script #17 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", *rpg("rpg", "fkl", "1e-4")),
    _recipe("7b/run_rpg_7b_fkl1e-4_7binstruct.sh", """\
RPG-FKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
The authors' script #18 (docs/differences.md#authors-scripts); Table 8 row "RPG-FKL".""",
           "setup=authors_7b_instruct", *rpg("rpg", "fkl", "1e-4")),
    _recipe("7b/run_rpg_7b_fkl1e-4_rf_clip_ppo_0.1_0.1_7binstruct.sh", """\
RPG-REINFORCE-FKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
The authors' script #19 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.
Clip (0.1, 0.1): the clip ablation of Fig. 8 (the paper shows it for Qwen3-4B).""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "fkl", "1e-4"), *CLIP_0_1, *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_fkl1e-4_rf_clip_ppo_0.1_0.1_schedulefree_7binstruct.sh", """\
RPG-REINFORCE-FKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #20 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.
Clip (0.1, 0.1): the clip ablation of Fig. 8 (the paper shows it for Qwen3-4B).""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "fkl", "1e-4"), *CLIP_0_1, *AUTHORS_REINFORCE,
           "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_fkl1e-4_rf_clip_ppo_0.2_0.28.sh", """\
RPG-REINFORCE-FKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context.
The authors' script #21 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_math", *rpg("rpg_reinforce", "fkl", "1e-4"), *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_fkl1e-4_rf_clip_ppo_0.2_0.28_7binstruct.sh", """\
RPG-REINFORCE-FKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
The authors' script #22 (docs/differences.md#authors-scripts); Table 8 row "RPG-REINFORCE-FKL".
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "fkl", "1e-4"), *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_fkl1e-4_rf_clip_ppo_0.2_0.28_schedulefree.sh", """\
RPG-REINFORCE-FKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #23 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_math", *rpg("rpg_reinforce", "fkl", "1e-4"), *AUTHORS_REINFORCE, "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_fkl1e-4_rf_clip_ppo_0.2_0.28_schedulefree_7binstruct.sh", """\
RPG-REINFORCE-FKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #24 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "fkl", "1e-4"), *AUTHORS_REINFORCE, "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_fkl1e-4_schedulefree.sh", """\
RPG-FKL (fully differentiable, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #25 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", *rpg("rpg", "fkl", "1e-4"), "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_fkl1e-4_schedulefree_7binstruct.sh", """\
RPG-FKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #26 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_instruct", *rpg("rpg", "fkl", "1e-4"), "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_rkl1e-4.sh", """\
RPG-RKL (fully differentiable, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context.
The authors' script #27 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", *rpg("rpg", "rkl", "1e-4")),
    _recipe("7b/run_rpg_7b_rkl1e-4_7binstruct.sh", """\
RPG-RKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
The authors' script #28 (docs/differences.md#authors-scripts); Table 8 row "RPG-RKL".""",
           "setup=authors_7b_instruct", *rpg("rpg", "rkl", "1e-4")),
    _recipe("7b/run_rpg_7b_rkl1e-4_rf.sh", """\
RPG-REINFORCE-RKL, hard clip, no dual clip (the authors' `rpg_rf_rkl`) — Qwen2.5-Math-7B, 2K context.
The authors' script #29 (docs/differences.md#authors-scripts); not reported in the paper.
Hard clip: docs/differences.md#d6. The authors passed this KL through verl's in-reward path, which trained with a
length penalty of −1e-4 per token instead of the RKL estimator (docs/differences.md#d2); here the KL is in the loss.""",
           "setup=authors_7b_math", *rpg("rpg_reinforce_hardclip", "rkl", "1e-4"), LR_5E_7),
    _recipe("7b/run_rpg_7b_rkl1e-4_rf_clip_ppo.sh", """\
RPG-REINFORCE-RKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context.
The authors' script #30 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.
Clip (0.1, 0.1): the clip ablation of Fig. 8 (the paper shows it for Qwen3-4B).""",
           "setup=authors_7b_math", *rpg("rpg_reinforce", "rkl", "1e-4"), *CLIP_0_1, *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_rkl1e-4_rf_clip_ppo_0.1_0.1_7binstruct.sh", """\
RPG-REINFORCE-RKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
The authors' script #31 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.
Clip (0.1, 0.1): the clip ablation of Fig. 8 (the paper shows it for Qwen3-4B).""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "rkl", "1e-4"), *CLIP_0_1, *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_rkl1e-4_rf_clip_ppo_0.1_0.1_schedulefree_7binstruct.sh", """\
RPG-REINFORCE-RKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #32 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.
Clip (0.1, 0.1): the clip ablation of Fig. 8 (the paper shows it for Qwen3-4B).""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "rkl", "1e-4"), *CLIP_0_1, *AUTHORS_REINFORCE,
           "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_rkl1e-4_rf_clip_ppo_0.2_0.28.sh", """\
RPG-REINFORCE-RKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context.
The authors' script #33 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_math", *rpg("rpg_reinforce", "rkl", "1e-4"), *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_rkl1e-4_rf_clip_ppo_0.2_0.28_7binstruct.sh", """\
RPG-REINFORCE-RKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
The authors' script #34 (docs/differences.md#authors-scripts); Table 8 row "RPG-REINFORCE-RKL".
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "rkl", "1e-4"), *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_rkl1e-4_rf_clip_ppo_0.2_0.28_schedulefree.sh", """\
RPG-REINFORCE-RKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #35 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_math", *rpg("rpg_reinforce", "rkl", "1e-4"), *AUTHORS_REINFORCE, "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_rkl1e-4_rf_clip_ppo_0.2_0.28_schedulefree_7binstruct.sh", """\
RPG-REINFORCE-RKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #36 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "rkl", "1e-4"), *AUTHORS_REINFORCE, "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_rkl1e-4_rf_clip_ppo_schedulefree.sh", """\
RPG-REINFORCE-RKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #37 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.
Clip (0.1, 0.1): the clip ablation of Fig. 8 (the paper shows it for Qwen3-4B).""",
           "setup=authors_7b_math", *rpg("rpg_reinforce", "rkl", "1e-4"), *CLIP_0_1, *AUTHORS_REINFORCE,
           "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_rkl1e-4_schedulefree.sh", """\
RPG-RKL (fully differentiable, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #38 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", *rpg("rpg", "rkl", "1e-4"), "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_rkl1e-4_schedulefree_7binstruct.sh", """\
RPG-RKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #39 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_instruct", *rpg("rpg", "rkl", "1e-4"), "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_schedulefree.sh", """\
RPG-UFKL with β = 0 (no KL) — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #40 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", *rpg("rpg", "ufkl", "0"), "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_ufkl1e-4.sh", """\
RPG-UFKL (fully differentiable, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context.
The authors' script #41 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", *rpg("rpg", "ufkl", "1e-4")),
    _recipe("7b/run_rpg_7b_ufkl1e-4_7binstruct.sh", """\
RPG-UFKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
The authors' script #42 (docs/differences.md#authors-scripts); Table 8 row "RPG-UFKL".""",
           "setup=authors_7b_instruct", *rpg("rpg", "ufkl", "1e-4")),
    _recipe("7b/run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.1_0.1_7binstruct.sh", """\
RPG-REINFORCE-UFKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
The authors' script #43 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.
Clip (0.1, 0.1): the clip ablation of Fig. 8 (the paper shows it for Qwen3-4B).""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "ufkl", "1e-4"), *CLIP_0_1, *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.1_0.1_schedulefree_7binstruct.sh", """\
RPG-REINFORCE-UFKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #44 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.
Clip (0.1, 0.1): the clip ablation of Fig. 8 (the paper shows it for Qwen3-4B).""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "ufkl", "1e-4"), *CLIP_0_1, *AUTHORS_REINFORCE,
           "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28.sh", """\
RPG-REINFORCE-UFKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context.
The authors' script #45 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_math", *rpg("rpg_reinforce", "ufkl", "1e-4"), *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28_7binstruct.sh", """\
RPG-REINFORCE-UFKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
The authors' script #46 (docs/differences.md#authors-scripts); Table 8 row "RPG-REINFORCE-UFKL".
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "ufkl", "1e-4"), *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28_schedulefree.sh", """\
RPG-REINFORCE-UFKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #47 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_math", *rpg("rpg_reinforce", "ufkl", "1e-4"), *AUTHORS_REINFORCE, "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28_schedulefree_7binstruct.sh", """\
RPG-REINFORCE-UFKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #48 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "ufkl", "1e-4"), *AUTHORS_REINFORCE,
           "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_ufkl1e-4_schedulefree.sh", """\
RPG-UFKL (fully differentiable, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #49 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", *rpg("rpg", "ufkl", "1e-4"), "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_ufkl1e-4_schedulefree_7binstruct.sh", """\
RPG-UFKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #50 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_instruct", *rpg("rpg", "ufkl", "1e-4"), "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_urkl1e-4.sh", """\
RPG-URKL (fully differentiable, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context.
The authors' script #51 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", *rpg("rpg", "urkl", "1e-4")),
    _recipe("7b/run_rpg_7b_urkl1e-4_7binstruct.sh", """\
RPG-URKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
The authors' script #52 (docs/differences.md#authors-scripts); Table 8 row "RPG-URKL".""",
           "setup=authors_7b_instruct", *rpg("rpg", "urkl", "1e-4")),
    _recipe("7b/run_rpg_7b_urkl1e-4_rf_clip_ppo_0.1_0.1_7binstruct.sh", """\
RPG-REINFORCE-URKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
The authors' script #53 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.
Clip (0.1, 0.1): the clip ablation of Fig. 8 (the paper shows it for Qwen3-4B).""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "urkl", "1e-4"), *CLIP_0_1, *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_urkl1e-4_rf_clip_ppo_0.1_0.1_schedulefree_7binstruct.sh", """\
RPG-REINFORCE-URKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #54 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.
Clip (0.1, 0.1): the clip ablation of Fig. 8 (the paper shows it for Qwen3-4B).""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "urkl", "1e-4"), *CLIP_0_1, *AUTHORS_REINFORCE,
           "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_urkl1e-4_rf_clip_ppo_0.2_0.28.sh", """\
RPG-REINFORCE-URKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context.
The authors' script #55 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_math", *rpg("rpg_reinforce", "urkl", "1e-4"), *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_urkl1e-4_rf_clip_ppo_0.2_0.28_7binstruct.sh", """\
RPG-REINFORCE-URKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context.
The authors' script #56 (docs/differences.md#authors-scripts); Table 8 row "RPG-REINFORCE-URKL".
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "urkl", "1e-4"), *AUTHORS_REINFORCE),
    _recipe("7b/run_rpg_7b_urkl1e-4_rf_clip_ppo_0.2_0.28_schedulefree.sh", """\
RPG-REINFORCE-URKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #57 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_math", *rpg("rpg_reinforce", "urkl", "1e-4"), *AUTHORS_REINFORCE, "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_urkl1e-4_rf_clip_ppo_0.2_0.28_schedulefree_7binstruct.sh", """\
RPG-REINFORCE-URKL (Algorithm 2, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #58 (docs/differences.md#authors-scripts); not reported in the paper.
The authors' run had β = 0 in effect (Algorithm 2 was never called, docs/differences.md#d1); this runs
Algorithm 2 with the stated β = 1e-4, as the paper describes.""",
           "setup=authors_7b_instruct", *rpg("rpg_reinforce", "urkl", "1e-4"), *AUTHORS_REINFORCE,
           "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_urkl1e-4_schedulefree.sh", """\
RPG-URKL (fully differentiable, RPG-Style Clip) — Qwen2.5-Math-7B, 2K context, schedule-free AdamW.
The authors' script #59 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_math", *rpg("rpg", "urkl", "1e-4"), "optim=schedulefree"),
    _recipe("7b/run_rpg_7b_urkl1e-4_schedulefree_7binstruct.sh", """\
RPG-URKL (fully differentiable, RPG-Style Clip) — Qwen2.5-7B-Instruct, 2K context, schedule-free AdamW.
The authors' script #60 (docs/differences.md#authors-scripts); not reported in the paper.""",
           "setup=authors_7b_instruct", *rpg("rpg", "urkl", "1e-4"), "optim=schedulefree"),
    _recipe("cpu/run_dapo.sh", """\
DAPO (clip-higher, dynamic sampling, overlong penalty, no KL)
on the tiny CPU task (profile=cpu: sizes and machine in rpg/config/profile/cpu.yaml). Build the model first:
.venv/bin/python -m rpg.tools.tiny_model. Extra arguments are Hydra overrides.""",
           "profile=cpu", "method=dapo"),
    _recipe("cpu/run_grpo.sh", """\
GRPO (k3 KL loss against the frozen initial model, beta=1e-3)
on the tiny CPU task (profile=cpu: sizes and machine in rpg/config/profile/cpu.yaml). Build the model first:
.venv/bin/python -m rpg.tools.tiny_model. Extra arguments are Hydra overrides.""",
           "profile=cpu", "method=grpo"),
    _recipe("cpu/run_rpg_reinforce_urkl.sh", """\
RPG-REINFORCE-URKL (Algorithm 2, RPG-Style Clip, beta=1e-4, iterative reference)
on the tiny CPU task (profile=cpu: sizes and machine in rpg/config/profile/cpu.yaml). Build the model first:
.venv/bin/python -m rpg.tools.tiny_model. Extra arguments are Hydra overrides.""",
           "profile=cpu", *rpg("rpg_reinforce", "urkl", "1e-4")),
    _recipe("cpu/run_rpg_ufkl.sh", """\
RPG-UFKL (fully differentiable, Algorithm 1, beta=1e-4, iterative reference)
on the tiny CPU task (profile=cpu: sizes and machine in rpg/config/profile/cpu.yaml). Build the model first:
.venv/bin/python -m rpg.tools.tiny_model. Extra arguments are Hydra overrides.""",
           "profile=cpu", *rpg("rpg", "ufkl", "1e-4")),
)  # fmt: skip

#: The authors' published 7B scripts (docs/differences.md#authors-scripts).
AUTHORS_7B = tuple(r for r in RECIPES if r.directory == "7b")
