"""Friendly automatic checks for the practice notebooks of lessons 01 to 06.

One module per lesson, named for the lesson it checks: ``check_gradient_checkpointing``
(01), ``check_trainer_and_accelerator`` (02), ``check_local_sgd`` (03), ``check_adamw``
(04), ``check_mixed_precision`` (05), ``check_sharding`` (06). Each is built on
``core`` (the judge, the four verdicts, mistakes as code) and ``fixtures`` (what answers
run on).
"""
