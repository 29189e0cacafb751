"""The periodic reference under LoRA is exact (rpg/reference/lora.py, docs/reference-modes.md#lora): single process,
CPU, fp32, the tiny Qwen2 of tests/conftest.py wrapped with peft LoRA on every linear layer as verl's FSDP engine wraps
it (`get_peft_model`, task CAUSAL_LM).

After 2 optimizer steps (B ≠ 0), a snapshot, then one more step:
* the reference pass (the snapshot swapped into the adapter) gives the log-probs of a full-weight model holding the
  merged snapshot weights W + (α/r)·B_snap·A_snap (peft's merge of a copy taken at the snapshot), within 1e-6;
* after the pass the policy's adapter equals what it was, bit for bit;
* the KL to the reference and its gradient (RPG-REINFORCE-URKL's k3 KL term, w·k3(ρ/w)) equal the full-weight path's.
Mutants that fail: a snapshot of the adapter-free base (B = 0), a pass that does not restore the policy's adapter.
The top-k KL under LoRA: verl's reference pass of a LoRA run (``compute_log_prob`` with ``no_lora_adapter``), through
the patch point's pieces (rpg.patches: topk_kl's, then worker_hooks') and the top-k hook's ``topk_outputs``, selects
the support of the full-weight path's ``compute_ref_log_prob`` on a model holding the merged snapshot, with its
log-probs, tail mass and the update's KL within 1e-6; mutants that fail: the adapter-free base's pass, the flagged
pass taken for π_old's (``pass_of`` ignoring the flag, or the pieces in the other order).
The worker hook's flag handling (the pass takes ``no_lora_adapter`` out of the batch so verl keeps the adapter on;
other passes are unchanged) and the checkpoint refusals are checked here too. < 20 s (the top-k test imports verl's
engine).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import shutil
from types import SimpleNamespace

import pytest
import torch

from rpg.divergences import w_k3
from rpg.reference import hooks, lora, written

R, ALPHA = 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peft_model(model_dir: str) -> torch.nn.Module:
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=R, lora_alpha=ALPHA, target_modules=TARGETS, bias="none")
    return get_peft_model(base, config)


def _batch(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 48, (4, 12), generator=g)


def token_log_probs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """log π(x_t | x_<t) of every token after the first, (bs, T − 1)."""
    logits = model(input_ids=ids).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    optimizer.zero_grad()
    (-token_log_probs(model, _batch(seed)).mean()).backward()
    optimizer.step()


def _adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in lora.adapter_parameters(model).items()}


def _merged(model: torch.nn.Module) -> torch.nn.Module:
    """A full-weight copy of `model` holding W + (α/r)·B·A (peft's merge): the non-LoRA path's weights."""
    return copy.deepcopy(model).merge_and_unload()


@pytest.fixture(scope="module")
def trained(tiny_qwen2_dir):
    """The policy after 2 optimizer steps, its snapshot and merged copy at that point, then after one more step."""
    torch.manual_seed(0)
    model = _peft_model(tiny_qwen2_dir)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for seed in (1, 2):
        _train_step(model, optimizer, seed)
    b_norm = max(float(p.detach().abs().max()) for n, p in lora.adapter_parameters(model).items() if "lora_B" in n)
    snapshot = lora.AdapterSnapshot()
    snapshot.take(model)
    merged_at_snapshot = _merged(model)
    _train_step(model, optimizer, 3)
    return SimpleNamespace(model=model, snapshot=snapshot, merged=merged_at_snapshot, b_norm=b_norm,
                           policy=_adapter(model))


@pytest.fixture(autouse=True)
def policy_adapter(trained):
    """Every test starts from the policy's adapter after step 3 (a failing mutant cannot leak into the next test)."""
    with torch.no_grad():
        for n, p in lora.adapter_parameters(trained.model).items():
            p.copy_(trained.policy[n])


def _reference_log_probs(snapshot: lora.AdapterSnapshot, model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), snapshot.swapped(model):
        return token_log_probs(model, ids)


def _gap_to_merged(snapshot: lora.AdapterSnapshot, trained) -> float:
    """max |log π_ref − log π_merged|: the reference pass against the full-weight model holding the merged snapshot."""
    ids = _batch(7)
    ref = _reference_log_probs(snapshot, trained.model, ids)
    with torch.no_grad():
        full = token_log_probs(trained.merged, ids)
    return float((ref - full).abs().max())


def _restored(snapshot: lora.AdapterSnapshot, model: torch.nn.Module) -> bool:
    """Whether the policy's adapter after a reference pass equals the one before it, bit for bit."""
    before = _adapter(model)
    _reference_log_probs(snapshot, model, _batch(8))
    return all(torch.equal(before[n], p) for n, p in _adapter(model).items())


def test_the_reference_pass_is_the_merged_snapshot(trained):
    assert trained.b_norm > 1e-3  # B ≠ 0: the snapshot is not the base
    assert _gap_to_merged(trained.snapshot, trained) < 1e-6
    with torch.no_grad():  # the policy moved after the snapshot: the check can fail
        ids = _batch(7)
        assert float((token_log_probs(trained.model, ids) - token_log_probs(trained.merged, ids)).abs().max()) > 1e-4


def test_the_policys_adapter_is_restored_bit_for_bit(trained):
    assert _restored(trained.snapshot, trained.model)
    before = _adapter(trained.model)
    with pytest.raises(RuntimeError, match="boom"):  # restored on an error inside the pass too
        with trained.snapshot.swapped(trained.model):
            raise RuntimeError("boom")
    assert all(torch.equal(before[n], p) for n, p in _adapter(trained.model).items())


def test_mutant_a_snapshot_of_the_adapter_free_base_fails(trained, monkeypatch):
    """Mutant: the snapshot copies the adapter-free base (B = 0) instead of the policy's adapter."""
    take = lora.AdapterSnapshot.take

    def take_base(self, module):
        take(self, module)
        for n, t in self.tensors.items():
            if "lora_B" in n:
                t.zero_()

    monkeypatch.setattr(lora.AdapterSnapshot, "take", take_base)
    base = lora.AdapterSnapshot()
    base.take(trained.model)
    assert _gap_to_merged(base, trained) > 1e-4


def test_mutant_a_pass_that_does_not_restore_fails(trained, monkeypatch):
    """Mutant: the pass leaves the snapshot in the adapter (no restore)."""

    @contextlib.contextmanager
    def swapped_no_restore(self, module):
        with torch.no_grad():
            for n, p in lora.adapter_parameters(module).items():
                p.copy_(self.tensors[n])
        yield

    monkeypatch.setattr(lora.AdapterSnapshot, "swapped", swapped_no_restore)
    assert not _restored(trained.snapshot, trained.model)


def _urkl_kl(log_prob: torch.Tensor, old: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """The per-token k3 KL term of RPG-REINFORCE-URKL, w·k3(ρ/w) (w = π_θ/π_old, ρ = π_ref/π_old), token-mean."""
    log_w, log_rho = log_prob - old, ref - old
    return w_k3(log_w, torch.exp(log_w), log_rho, torch.exp(log_rho)).mean()


def test_the_kl_and_its_gradient_equal_the_full_weight_path(trained):
    ids = _batch(9)
    with torch.no_grad():
        old = token_log_probs(trained.model, ids) + 0.01  # a π_old a little off the policy: w ≠ 1
        ref_full = token_log_probs(trained.merged, ids)
    ref_lora = _reference_log_probs(trained.snapshot, trained.model, ids)
    params = [p for p in trained.model.parameters() if p.requires_grad]
    results = []
    for ref in (ref_lora, ref_full):
        kl = _urkl_kl(token_log_probs(trained.model, ids), old, ref)
        results.append((kl.detach(), torch.autograd.grad(kl, params)))
    (kl_a, grads_a), (kl_b, grads_b) = results
    assert float(kl_a) > 1e-4 and abs(float(kl_a - kl_b)) < 1e-6
    assert max(float((a - b).abs().max()) for a, b in zip(grads_a, grads_b)) < 1e-6


# ---- the worker hook: the flag, which pass is swapped ---------------------------------------------------------------
class _Engine:
    def __init__(self, module):
        self.module = module

    def optimizer_step(self):
        return None


class _Worker:
    """verl's worker as the hook sees it: its config (LoRA, the policy loss) and its actor's engine."""

    def __init__(self, module, reference: str, lora_rank: int = R):
        from omegaconf import OmegaConf

        self.config = OmegaConf.create({
            "model": {"lora_rank": lora_rank},
            "actor": {"policy_loss": {"reference": reference}},
        })
        self.actor = SimpleNamespace(engine=_Engine(module))
        self.ref = None


def _td(flag: bool):
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    td = TensorDict({"x": torch.zeros(2)}, batch_size=[2])
    if flag:
        tu.assign_non_tensor(td, no_lora_adapter=True)
    return td


def test_the_hook_swaps_only_the_flagged_pass_of_a_periodic_lora_run(trained, monkeypatch):
    state = lora.LoraPeriodicReference(written.RefreshSchedule(every_steps=1), SimpleNamespace(
        engine=_Engine(trained.model)))
    state.snapshot = trained.snapshot
    worker = _Worker(trained.model, "periodic")
    worker._rpg_reference = state  # the state the hook builds on first use (hooks._state)
    policy = _adapter(trained.model)
    seen = []

    def verl_compute_log_prob(self, data):
        seen.append((lora.reference_pass_flag(data), _adapter(trained.model)))
        return "out"

    for flag in (True, False):
        assert hooks.compute_log_prob(verl_compute_log_prob, worker, _td(flag)) == "out"
    (flag_ref, during_ref), (flag_old, during_old) = seen
    assert flag_ref is False and flag_old is False  # the flag was taken out: verl does not disable the adapter
    assert all(torch.equal(during_ref[n], trained.snapshot.tensors[n]) for n in during_ref)  # the snapshot ran
    assert all(torch.equal(during_old[n], policy[n]) for n in policy)  # π_old's pass: the policy
    assert all(torch.equal(p, policy[n]) for n, p in _adapter(trained.model).items())


def test_the_hook_leaves_a_frozen_lora_run_to_verl(trained):
    worker = _Worker(trained.model, "frozen")
    seen = []
    hooks.compute_log_prob(lambda self, data: seen.append(lora.reference_pass_flag(data)), worker, _td(True))
    assert seen == [True]  # verl's disable_adapter() gives the adapter-free base


def test_the_hook_builds_the_lora_state_and_refuses_ema(trained):
    worker = _Worker(trained.model, "periodic")
    worker.config.actor.policy_loss.ref_refresh_steps = 2
    worker.config.actor.policy_loss.loss_mode = "rpg_reinforce_urkl"
    worker.config.actor.policy_loss._target_ = "rpg.RPGPolicyLossConfig"
    worker.config.actor.policy_loss.kl_coef = 0.05
    with pytest.MonkeyPatch.context() as m:
        m.setattr("rpg.loss_config.rpg_settings", lambda actor: SimpleNamespace(
            ref_refresh_steps=2, ref_refresh_kl=0.0, ref_kl_ema=0.9))
        state = hooks._state(worker, hooks.modes.REFERENCES["periodic"])
        assert isinstance(state, lora.LoraPeriodicReference) and state.ref is None
        ema = _Worker(trained.model, "ema")
        with pytest.raises(ValueError, match="not the EMA of the weights"):
            hooks._state(ema, hooks.modes.REFERENCES["ema"])


# ---- the checkpoint: the snapshot saved and loaded; a missing one refused ------------------------------------------
def _state(model) -> lora.LoraPeriodicReference:
    return lora.LoraPeriodicReference(written.RefreshSchedule(every_steps=2), SimpleNamespace(engine=_Engine(model)))


def test_the_snapshot_is_saved_and_loaded(trained, tmp_path):
    saved = _state(trained.model)
    saved.snapshot = copy.deepcopy(trained.snapshot)
    saved.save(str(tmp_path), global_step=3)
    state = json.loads((tmp_path / written.STATE_DIR / written.STATE_FILE).read_text())
    assert state[written.LORA_SNAPSHOT] is True and state[written.HAS_REF_WEIGHTS] is True
    loaded = _state(trained.model)
    loaded.load(str(tmp_path))
    assert all(torch.equal(loaded.snapshot.tensors[n], t) for n, t in trained.snapshot.tensors.items())
    assert all(t.dtype == torch.float32 for t in loaded.snapshot.tensors.values())


def test_a_checkpoint_without_the_snapshot_is_refused(trained, tmp_path):
    saved = _state(trained.model)
    saved.snapshot = copy.deepcopy(trained.snapshot)
    saved.save(str(tmp_path), global_step=3)
    shutil.rmtree(tmp_path / written.STATE_DIR / written.REF_MODEL_DIR)
    with pytest.raises(RuntimeError, match="reference adapter snapshot were saved, but .* is missing"):
        _state(trained.model).load(str(tmp_path))
    path = tmp_path / written.STATE_DIR / written.STATE_FILE
    payload = json.loads(path.read_text())
    path.write_text(json.dumps({**payload, written.HAS_REF_WEIGHTS: False}))
    with pytest.raises(RuntimeError, match="no reference adapter was saved"):
        _state(trained.model).load(str(tmp_path))


def test_lora_and_full_weight_states_are_not_mixed(trained, tmp_path):
    saved = _state(trained.model)
    saved.snapshot = copy.deepcopy(trained.snapshot)
    saved.save(str(tmp_path), global_step=3)
    full = written.WrittenReference.__new__(lora.PeriodicReference)  # a full-weight periodic state, no engine needed
    full.schedule = written.RefreshSchedule(every_steps=2)
    with pytest.raises(ValueError, match="saved with LoRA"):
        full.load(str(tmp_path))
    path = tmp_path / written.STATE_DIR / written.STATE_FILE
    payload = json.loads(path.read_text())
    payload.pop(written.LORA_SNAPSHOT)  # a full-weight state of rpg-verl before the LoRA reference
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="saved without LoRA"):
        _state(trained.model).load(str(tmp_path))
    assert os.path.isdir(tmp_path / written.STATE_DIR)


@pytest.mark.parametrize("field", ["extra_info", "meta_info"])
def test_the_flag_is_read_and_taken_from_transfer_queue_metadata_and_dataproto(field):
    """The v1 trainer hands the worker TransferQueue metadata (``extra_info``), the legacy one a DataProto
    (``meta_info``); the top-k hook reads the flag there too (the reference's pass, `rpg.topk_hook.pass_of`)."""
    from rpg import topk_hook

    data = SimpleNamespace(**{field: {"no_lora_adapter": True, "temperature": 1.0}})
    assert lora.reference_pass_flag(data)
    assert topk_hook.pass_of("compute_log_prob", data) == topk_hook.REFERENCE_PASS
    assert lora.pop_reference_pass_flag(data) and getattr(data, field) == {"temperature": 1.0}
    assert not lora.reference_pass_flag(data)
    assert topk_hook.pass_of("compute_log_prob", data) == "compute_log_prob"
    assert topk_hook.pass_of("update_actor", SimpleNamespace(extra_info={"no_lora_adapter": True})) == "update_actor"


# ---- the top-k KL under LoRA: the reference pass's support and (k) values are the full-weight path's ----------------
TOPK_LENGTHS, TOPK_K, TOPK_TEMPERATURE = [12, 7, 10, 4], 5, 0.7
TOPK_LOSS = dict(
    _target_="rpg.RPGPolicyLossConfig", loss_mode="rpg_reinforce_urkl", branch_on="advantage", kl_estimator="topk",
    kl_topk=TOPK_K, kl_topk_tail="bucket", reference="periodic", ref_refresh_steps=2,
)


def _topk_batch(flag: bool):
    """verl's log-prob batch (nested input_ids, padded layout); `flag`: verl's LoRA reference pass (no_lora_adapter)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    ids = _batch(11).flatten()[: sum(TOPK_LENGTHS)]
    offsets = torch.tensor([0, *torch.tensor(TOPK_LENGTHS).cumsum(0).tolist()])
    td = TensorDict({"input_ids": torch.nested.nested_tensor_from_jagged(ids, offsets)}, batch_size=[len(offsets) - 1])
    tu.assign_non_tensor(td, use_remove_padding=False)
    if flag:
        tu.assign_non_tensor(td, **{lora.NO_LORA_ADAPTER: True})
    return td


def _engine_outputs(model: torch.nn.Module, td) -> dict[str, torch.Tensor]:
    """What verl's engine returns for `td`: its per-token log-probs and the top-k hook's outputs (`topk_outputs`, on
    the temperature-scaled logits of the padded layout)."""
    from rpg import topk_hook

    offsets = td["input_ids"].offsets()
    values = td["input_ids"].values()
    padded = td["input_ids"].to_padded_tensor(0)  # right padding: the real rows never attend to it (causal)
    temperature = torch.full((padded.shape[0],), TOPK_TEMPERATURE)
    args = {"temperature_is_one": False, "temperature": temperature, "input_ids_rmpad_rolled": torch.roll(values, -1)}
    output = SimpleNamespace(logits=model(input_ids=padded).logits.float())
    out = topk_hook.topk_outputs(output, args, td)
    logits, labels = topk_hook.packed_logits(output, args, td)
    out["log_probs"] = torch.log_softmax(logits, -1).gather(-1, labels[:, None]).squeeze(-1)
    assert out["log_probs"].shape == (int(offsets[-1]),)
    return out


def _verl_log_prob_pass(model: torch.nn.Module):
    """verl's ``compute_log_prob``/``compute_ref_log_prob`` as the patch points see it: the pass runs under the
    engine's ``disable_adapter()`` when the batch still carries ``no_lora_adapter`` (engine_workers.py infer_batch)."""

    def call(self, data):
        from verl.utils import tensordict_utils as tu

        adapter_off = bool(tu.get_non_tensor_data(data=data, key=lora.NO_LORA_ADAPTER, default=False))
        with torch.no_grad(), (model.disable_adapter() if adapter_off else contextlib.nullcontext()):
            return _engine_outputs(model, data)

    return call


def _chain(attribute: str, original, installs=None):
    """The patch point's wrapper chain (rpg.patches: the row's pieces in its order, outermost first) around
    `original`, with the pieces of topk_kl and worker_hooks (read now, so a monkeypatched piece is the one run)."""
    from rpg import patches, topk_hook

    (point,) = [p for p in patches.POINTS if p.module == patches.WORKERS and p.attribute == attribute]
    if installs is not None:
        point = dataclasses.replace(point, installs=installs)
    patch = patches.Patch(point, original)
    for name, module in ((patches.TOPK_KL, topk_hook), (patches.WORKER_HOOKS, hooks)):
        if name in point.installs:
            patch.set(name, module.PIECES[attribute])
    return patch.call


def _topk_worker(model: torch.nn.Module, lora_rank: int, snapshot: lora.AdapterSnapshot = None) -> _Worker:
    worker = _Worker(model, "periodic", lora_rank=lora_rank)
    worker.config.actor.policy_loss = TOPK_LOSS
    if snapshot is not None:  # the LoRA state the hooks build on first use, holding the test's snapshot
        state = lora.LoraPeriodicReference(written.RefreshSchedule(every_steps=2), worker.actor)
        state.snapshot = snapshot
        worker._rpg_reference = state
    return worker


def _topk_terms(trained, installs=None) -> tuple[dict, dict]:
    """The reference's top-k outputs of both paths on the same batch: (LoRA: verl's reference pass of a LoRA run,
    compute_log_prob with no_lora_adapter through both pieces; full weights: compute_ref_log_prob of a reference
    model holding the merged snapshot)."""
    lora_worker = _topk_worker(trained.model, R, trained.snapshot)
    lora_pass = _chain("compute_log_prob", _verl_log_prob_pass(trained.model), installs)
    full_worker = _topk_worker(trained.merged, 0)
    full_pass = _chain("compute_ref_log_prob", _verl_log_prob_pass(trained.merged))
    return lora_pass(lora_worker, _topk_batch(True)), full_pass(full_worker, _topk_batch(False))


def _update_terms(trained, support: dict) -> dict[str, torch.Tensor]:
    """The update's top-k outputs (the KL with the bucket tail, 1[y ∈ S]) of the policy's logits at `support`."""
    from verl.utils import tensordict_utils as tu

    from rpg import topk_hook

    td = _topk_batch(False)
    td[topk_hook.IDS], td[topk_hook.LOG_PROBS] = support[topk_hook.IDS], support[topk_hook.LOG_PROBS]
    tu.assign_non_tensor(td, **{topk_hook.TRAIN: topk_hook.TopKUpdate("reverse", TOPK_LOSS["kl_topk_tail"])})
    with torch.no_grad():
        return _engine_outputs(trained.model, td)


def _topk_gap(trained, installs=None) -> float:
    """max over the top-k terms of |LoRA path − full-weight path| (inf when the supports differ or one is missing):
    the support ids, the reference's log-probs on it, its tail mass, verl's log-probs, and the update's KL and
    1[y ∈ S] at each support."""
    from rpg import topk_hook

    lora_out, full_out = _topk_terms(trained, installs)
    if topk_hook.IDS not in lora_out:
        return float("inf")  # no support selected in the reference's pass
    if not torch.equal(lora_out[topk_hook.IDS].values(), full_out[topk_hook.IDS].values()):
        return float("inf")
    lp_lora, lp_full = lora_out[topk_hook.LOG_PROBS].values(), full_out[topk_hook.LOG_PROBS].values()
    tail = lambda lp: 1 - lp.exp().sum(-1)  # noqa: E731 -- the reference's tail mass q_T (rpg.topk_kl, bucket tail)
    update_lora, update_full = _update_terms(trained, lora_out), _update_terms(trained, full_out)
    pairs = [(lp_lora, lp_full), (tail(lp_lora), tail(lp_full)), (lora_out["log_probs"], full_out["log_probs"]),
             *((update_lora[key].values(), update_full[key].values()) for key in (topk_hook.KL, topk_hook.IN_SUPPORT))]
    return max(float((a - b).abs().max()) for a, b in pairs)


def test_the_topk_terms_of_the_lora_reference_pass_are_the_full_weight_paths(trained):
    """The top-k KL under LoRA (docs/reference-modes.md#lora): verl's reference pass of a LoRA periodic run (through the
    patch point's pieces in their order) selects the support, and gives the reference's log-probs on it, its tail
    and the update's KL, of the non-LoRA path whose reference model holds the merged snapshot: fp32, within 1e-6."""
    from rpg import topk_hook

    assert trained.b_norm > 1e-3  # B ≠ 0: the snapshot is not the base
    assert _topk_gap(trained) < 1e-6
    lora_out, _ = _topk_terms(trained)
    policy_worker = _topk_worker(trained.model, R, trained.snapshot)
    policy_pass = _chain("compute_ref_log_prob", _verl_log_prob_pass(trained.model))  # π_θ's own support: apart
    own = policy_pass(policy_worker, _topk_batch(False))
    gap = (own[topk_hook.LOG_PROBS].values() - lora_out[topk_hook.LOG_PROBS].values()).abs().max()
    assert float(gap) > 1e-4 and 0 < float(1 - lora_out[topk_hook.LOG_PROBS].values().exp().sum(-1).min()) < 1
    assert all(torch.equal(p, trained.policy[n]) for n, p in _adapter(trained.model).items())  # restored


def test_mutant_the_topk_support_of_the_adapter_free_base_fails(trained, monkeypatch):
    """Mutant: verl's reference pass runs as verl runs it without rpg's piece (the adapter disabled: the base), so the
    support and its log-probs are the base's."""
    monkeypatch.setitem(hooks.PIECES, "compute_log_prob", lambda call, self, data, *a, **k: call(self, data, *a, **k))
    assert _topk_gap(trained) > 1e-4


@pytest.mark.parametrize("mutant", ["pass_of", "order"])
def test_mutant_the_flagged_pass_taken_for_pi_olds_fails(trained, monkeypatch, mutant):
    """Mutants: the top-k piece takes verl's flagged reference pass for π_old's (``pass_of`` ignores the flag; or the
    worker hooks' piece runs first and takes the flag out before the top-k piece reads it): no support is selected
    in the reference's pass."""
    from rpg import patches, topk_hook

    if mutant == "pass_of":
        monkeypatch.setattr(topk_hook, "pass_of", lambda method, data: method)
        assert _topk_gap(trained) == float("inf")
    else:
        assert _topk_gap(trained, installs=(patches.WORKER_HOOKS, patches.TOPK_KL)) == float("inf")
