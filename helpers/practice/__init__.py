"""Friendly automatic checks for the practice notebooks of lessons 01 to 05.

One module per lesson, named for the lesson it checks: ``check_gradient_checkpointing``
(01), ``check_trainer_and_accelerator`` (02), ``check_local_sgd`` (03), ``check_adamw``
(04), ``check_mixed_precision`` (05). What they share (the verdicts, spotting a `...`
left to fill in, turning a learner's exception into one sentence) is in ``verdicts``.
"""
