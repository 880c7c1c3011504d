"""Byte units shared by the catalog, the memory plan and the engine."""

GIB = 1024**3
MIB = 1024**2


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
