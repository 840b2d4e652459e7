"""The tiny model's training settings (introduced in lesson 02, used again in lessons
03 to 05 and their practice checks)."""

# The tiny DistilBERT's training settings, shared by lessons 02 and 03 and their
# practice checks.
LEARNING_RATE = 3e-3  # high, as a tiny model trained from scratch likes it
WARMUP_SHARE = 0.1  # share of the optimizer steps with a rising learning rate
# Trainer's default, which the hand-written loops copy (torch's AdamW defaults to 0.01)
WEIGHT_DECAY = 0.0
# Trainer's default gradient clipping, which the hand-written loops copy
MAX_GRAD_NORM = 1.0
# Lesson 02's Trainer batches (the slide's): 64 examples per optimizer step, which
# exercise 2.1 keeps.
MICRO_BATCH_SIZE = 16  # examples in one forward + backward
# micro-batches per optimizer step (gradient_accumulation_steps)
TRAINER_ACCUMULATION = 4
# Lesson 02's Accelerator loop (the slide's): micro-batches per optimizer step
ACCELERATOR_ACCUMULATION = 2
EPOCHS = 3  # lesson 02's full runs (Trainer, Accelerator) and lab 05's three
SEED = 0  # the tiny model's initial weights and the order of its batches
