"""The practice checks (lessons 01-06): one ``check_*`` module a lesson, on ``core``."""
