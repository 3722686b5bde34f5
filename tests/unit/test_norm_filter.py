"""The NORM socket filter's program (gateway.transport.norm_filter) is one the kernel can load: classic BPF
jumps forward only, by at most 255 instructions for a conditional jump, within BPF_MAXINSNS (4,096)."""

from gateway.transport.norm_filter import program

_JMP_CLASS, _JA, _RET = 0x05, 0x05, 0x06  # linux/filter.h: BPF_JMP, BPF_JMP|BPF_JA, BPF_RET|BPF_K


def test_every_jump_lands_forward_inside_the_program() -> None:
    code = program()
    assert len(code) <= 4096
    for i, (op, jt, jf, k) in enumerate(code):
        if op & 0x07 != _JMP_CLASS:
            continue
        targets = [k] if op == _JA else [jt, jf]
        for offset in targets:
            assert offset >= 0 and i + 1 + offset < len(code), (i, op, jt, jf, k)
            assert op == _JA or offset <= 255


def test_it_ends_in_a_verdict() -> None:
    assert [op for op, *_ in program()[-2:]] == [_RET, _RET]  # keep, then drop
