# tanh forms: the f32 scalar, the f16 pair, and the pair bundled with a load.
.machine small

.tile 0
.section code 0x4c000 rx
.entry main
main:
    f32tanh $a0, $a1
    f16v2tanh $a2, $a3
    { ld64step $a4:5, $m1+=, 1 ; f16v2tanh $a6, $a4 }
    f32tanh $azero, $a14
    exit
