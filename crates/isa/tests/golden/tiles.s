# Replicated code, per-tile sections, exchange code and host bindings.
.machine small
.tiles 6

.tile all
.section code 0x4c000 rx
.entry main
main:
    sync global
    call $m14, xcode
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

# Each tile's part of exchange 3: tiles 0 and 5 send, tiles 1, 2 and 4 receive.
.tile 0, 5
.section xcode 0x4d000 rx
xcode:
    setzi $m0, buf
    send $m0, 16
    exchange 3
    br $m14

.tile 1, 2
.section xcode 0x4d000 rx
xcode:
    mux 0
    setzi $m0, buf + 8
    recv $m0, 0
    exchange 3
    br $m14

.tile 3
.section xcode 0x4d000 rx
xcode:
    exchange 3
    br $m14

.tile 4
.section xcode 0x4d000 rx
xcode:
    mux 5
    setzi $m0, buf
    recv $m0, 0
    exchange 3
    br $m14

.exchange 3 halo

.binding input x 32
.slice 0 buf 0 16
.slice 1 flag 16 4
.binding weight "w.fc1" 8
.slice 2 buf 0 8
.binding output y 4
.slice 3 buf 0 4
