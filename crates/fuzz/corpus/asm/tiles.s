# Replicated code, a per-tile extra section, an exchange and host bindings.
.machine small
.tiles 6

.tile all
.section code 0x4c000 rx
.entry main
main:
    sync global
    exchange 3
    bri done
done:
    exit
.section data 0x90000 rw
buf:
    .space 64

.tile 1, 4..6
.section extra 0x94000 rw
flag:
    .word 1
    .symbol flag 8
    .zero 4

.exchange 3 halo
.transfer 0 buf 8 -> 1 flag, 2 buf + 8
.transfer 5 buf 16 -> 4 buf

.binding input x 32
.slice 0 buf 0 16
.slice 1 flag 16 4
.binding weight "w.fc1" 8
.slice 2 buf 0 8
.binding output y 4
.slice 3 buf 0 4
