"""The losses Trainer logs in a short run, the gradient-accumulation loss of lesson 02
(introduced there; its practice check and tests/test_trainer_loss.py run it too)."""
import tempfile

from helpers.random_state import global_random_state_kept


def first_logged_losses(model, train_dataset, tokenizer, steps, micro_batch_size,
                        accumulation, **arguments):
    """Train ``model`` with Trainer for ``steps`` optimizer steps; the losses it logged.

    Each optimizer step accumulates ``accumulation`` micro-batches of
    ``micro_batch_size`` examples; ``arguments`` are further TrainingArguments
    (learning_rate, seed, use_cpu, ...). Trainer shows no progress bar and prints no
    logs: the caller prints what it needs.
    """
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    # save_strategy="no": nothing is written, and the folder goes when the run ends
    with tempfile.TemporaryDirectory() as output_dir, global_random_state_kept():
        # Trainer seeds the global generators; the caller's random numbers stay theirs
        args = TrainingArguments(
            output_dir=output_dir, max_steps=steps, logging_steps=1,
            per_device_train_batch_size=micro_batch_size,
            gradient_accumulation_steps=accumulation, save_strategy="no",
            report_to="none", disable_tqdm=True, **arguments)
        trainer = Trainer(model=model, args=args, train_dataset=train_dataset,
                          data_collator=DataCollatorWithPadding(tokenizer))
        # without a progress bar, Trainer would print every log
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
