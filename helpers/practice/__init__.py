"""Friendly automatic checks for the practice notebooks of lessons 01 to 06: one
``check_*`` module per lesson (its README names which), each on ``core`` (the judge,
the four verdicts, mistakes as code) and ``fixtures`` (what answers run on)."""
