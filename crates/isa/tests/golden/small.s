# Every instruction form, the `li` pseudo-instruction, bundle alignment and data.
.machine small

.tile 0
.section code 0x4c000 rx
.entry main
main:
    li $m1, table            # pseudo: setzi / shl / or
    setzi $m2, 0x9a000
    add $m3, $m1, $m2
    sub $m3, $m3, 4095
    mov $m4, $m3
    mov $a0, $m4
    mov $m5, $a0
    ld32 $m6, $m1, 1
    ld32 $a1, $m1
    st32 $m6, $m2, 3
    st32 $azero, $m2, 0
    ld64 $a0:1, $m1, 2
    st64 $a2:3, $m2, 1
    ld64step $a0:1, $m2+=, 1
    st64step $a4:5, $m2+=, -2
    ld128 $a0:3, $m1, 0
    ld2x64pace $a0:1, $a2:3, $m1+=, $m2+=
    ldst64pace $a0:1, $a2:3, $m1+=, $m2+=
    ampw $m1+=, 31
    call $m10, worker
    rpt $m3, 2
    f32add $a0, $a1, $a2
    f32v2mul $a0:1, $a2:3, $a4:5
    rpt 100, 1
    { ld2xst64pace $a2:3, $a4:5, $a0:1, $m1+=, $m2+=, $m3+= ; amp $a0:1, $a2:3, $a4:5, 0 }
    brz $m3, done
    brnz $mzero, main
    run $m1, $m2, 5
    runall $m1, $m2, 16
    sync local
    sync global
    exchange 3
    hostxfer $m4
    mark 7
done:
    exit

worker:
    f16v2add $a0, $a1, $a2
    f16v4mac $a0:1, $a2:3, $a4:5
    f32exp $a0, $a1
    f32rsqrt $a2, $a3
    f16v2tof32 $a0:1, $a2
    uput $FP_SCL, $a6
    { ld64step $a0:1, $m2+=, 1 ; f8v4tof16 $a4:5, $a1 }
    f8v4tof16 $a0:1, $a2
    f16v8tof8 $a2:3, $a4:7
    f16v8tof8 $a14:15, $a12:15
    f32v2tof16 $a2, $a0:1
    f16v4sum $a0, $a2:3
    f32v2bcast $a0:1, $a2
    mov $a6:7, $a0:1
    mov $a1, $a2
    { nop ; f32v2max $a0:1, $a2:3, $a4:5 }
    br $m10

.section data 0x90000 rw
table:
    .word 1, 2, 0xdeadbeef, table
    .half 0x1234, -1
    .byte 1, 2, 3
    .align 8
halves:
    .f16 1.0, 2.5, -0.5, inf
    .f32 3.25
buf:
    .symbol buf 64
    .space 64
