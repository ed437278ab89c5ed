#include "textflag.h"

// func prefetchSlots(slots unsafe.Pointer, shift uint64, keys []uint64)
// Prefetches the home slot (24 bytes each, Fibonacci hashing) of each key.
TEXT ·prefetchSlots(SB), NOSPLIT, $0-40
	MOVQ slots+0(FP), DI
	MOVQ shift+8(FP), CX
	MOVQ keys_base+16(FP), SI
	MOVQ keys_len+24(FP), DX
	MOVQ $0x9E3779B97F4A7C15, R8
loop:
	TESTQ DX, DX
	JEQ done
	MOVQ (SI), AX
	IMULQ R8, AX
	SHRQ CX, AX
	LEAQ (AX)(AX*2), AX
	PREFETCHT0 (DI)(AX*8)
	ADDQ $8, SI
	DECQ DX
	JMP loop
done:
	RET
