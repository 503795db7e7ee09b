"""Adapters of the contract to training frameworks that own the training loop:

* :mod:`rubick.integrations.hf` — a Hugging Face ``Trainer`` (a callback and its
  ``TrainingArguments``);
* :mod:`rubick.integrations.lightning` — a PyTorch Lightning ``Trainer`` (a callback
  and its keyword arguments);
* :mod:`rubick.integrations.torchtitan` — torchtitan's own trainer, started by
  ``python -m rubick.integrations.torchtitan``.

Importing this package imports none of them (nor any framework): each is imported by
name, when a script needs it.
"""
