"""Train and evaluate a recipe.

  python -m symjax.main --config=symbolic[:task=text,size=medium] [--workdir=DIR] [--config.FIELD=VALUE ...]

--config names a recipe shipped with the package or the path of a config file (configs/NAME.py from a
clone). Rerunning the same command resumes from its latest checkpoint. The implementation is
``symjax.cli.train``.

Config fields, by group (every one with its default and meaning: docs/configs.md, from a clone or on the
docs site; the source is symjax/train/config.py's default_config):
  task          task, data_seed, text_path, token_path, tokenizer, bpe_vocab_size, seq_len, eval_windows
  model         model.* (ModelConfig's fields: kind, num_layers, num_heads, head_dim, ... see docs/configs.md)
  optimisation  seed, batch_size, total_steps, learning_rate, warmup_steps, end_learning_rate_fraction,
                weight_decay, adam_b1, adam_b2, grad_clip_norm, length_balance, soft_steps,
                straight_steps, readout_sparsity
  evaluation    log_every_steps, eval_every_steps, top_ks, keep_checkpoints, best_metric, stop_at_accuracy,
                numeral_glyph_init, progress_bar, compilation_cache_dir
  distillation  distill.* (teacher, teacher_checkpoint, label_weight, logits_weight, temperature, streams)
  devices       mesh.* (data, vocab), sharding_rules, readout, distributed.*
"""

from absl import flags

from symjax.cli import train

flags.adopt_module_key_flags(train)  # --help lists the training flags, not only this module's (none)

if __name__ == '__main__':
  train.run()
