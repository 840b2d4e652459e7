"""Friendly automatic checks for the practice notebooks in notebooks/practice/.

One module per lesson: ``gradient_checkpointing`` (01), ``trainer_and_accelerator``
(02), ``local_sgd`` (03), ``adamw`` (04). What they share (the verdicts, spotting a
`...` left to fill in, turning a learner's exception into one sentence) is in
``verdicts``.
"""
