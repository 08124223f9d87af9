# The fixed form of misaligned_ld64step.s: the same six-worker rearrangement, with
# its source buffer 8-byte aligned as `ld64step` requires. It runs to completion:
#
#   tessera asm examples/faults/aligned_ld64step.s -o /tmp/a.tpk
#   tessera sim /tmp/a.tpk          # ok

.machine small

.tile 0
.section code 0x4c000 rx
.entry main
main:
    setzi $m2, rearrange_row_major_to_amp_f16
    setzi $m3, state
    runall $m2, $m3, 8          # worker i: $m0 = state + 8*i, $m1 = i
    sync local
    exit

.align 8
rearrange_row_major_to_amp_f16:
    ld32 $m2, $m0, 0            # source rows
    ld32 $m3, $m0, 1            # destination (AMP layout)
    setzi $m4, 4                # 16-element rows: four 64-bit groups each
    .org rearrange_row_major_to_amp_f16 + 0x88
    rpt $m4, 2
    ld64step $a0:1, $m2+=, 1    # +0x8c: 8-byte load, needs an 8-byte-aligned $m2
    st64step $a0:1, $m3+=, 1
    exit

.section data 0x90000 rw
# Worker i reads 32 bytes at src + 64*i and writes them at dst + 64*i.
state:
    .word src + 0,   dst + 0
    .word src + 64,  dst + 64
    .word src + 128, dst + 128
    .word src + 192, dst + 192
    .word src + 256, dst + 256
    .word src + 320, dst + 320
.align 8
                                # (no padding: the buffer is 8-byte aligned)
src:
    .f16 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16
    .zero 400
.align 8
dst:
    .zero 400
