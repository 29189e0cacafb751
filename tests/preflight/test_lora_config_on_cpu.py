"""`rpg.preflight.lora_config`: a run is a LoRA run exactly when verl's trainer says so (``ref_in_actor``)."""

from omegaconf import OmegaConf

from rpg.preflight.lora_config import lora_settings


def _config(**model):
    return OmegaConf.create({"actor_rollout_ref": {"model": model}})


def test_the_rank_is_read_where_verl_reads_it():
    assert lora_settings(_config(lora_rank=0)).enabled is False
    assert lora_settings(_config(lora_rank=32)).rank == 32
    assert lora_settings(_config(lora_rank=8, lora={"rank": 16})).rank == 16  # verl reads lora.rank first
    assert lora_settings(_config(lora_rank=8, lora={"rank": 0})).rank == 8


def test_an_adapter_path_alone_makes_a_lora_run():
    s = lora_settings(_config(lora_rank=0, lora_adapter_path="/x/adapter"))
    assert s.enabled and s.rank == 0 and s.adapter_path == "/x/adapter"


def test_merge_and_alpha():
    s = lora_settings(_config(lora_rank=4, lora_alpha=8, lora={"merge": True}))
    assert s.merge is True and s.alpha == 8.0
    assert lora_settings(_config(lora_rank=4)).merge is False
