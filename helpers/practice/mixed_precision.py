"""TEMPORARY: the old name of ``check_mixed_precision`` (lesson 05's practice checks),
which practice 5's notebooks still import. Lesson 5 is being rewritten; remove when it
lands."""
from helpers.practice.check_mixed_precision import (  # noqa: F401
    SmallNet,
    check_autocast_prediction,
    check_bf16_setups,
    check_bytes_per_parameter,
    check_float16_loop,
)
