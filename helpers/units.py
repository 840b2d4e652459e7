"""Byte units, so that every lesson and check divides by the same numbers (introduced in
lesson 01)."""
KiB = 2**10
MiB = 2**20
GiB = 2**30
