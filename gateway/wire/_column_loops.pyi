# The compiled twin of columns.py_walk (_column_loops.c): same signature.
def walk(
    buf: memoryview,
    first: int,
    count: int,
    overhead: int,
    start: int,
    lo: int,
    hi: int,
    prefixes: tuple[bytes, ...],
    /,
) -> tuple[bytearray, int]: ...
