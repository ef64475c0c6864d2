/* dlsym: ask vgl_dlsym_intercept(handle, name); when it declines (NULL),
 * branch to the C library's dlsym with the caller's x30 (return address)
 * restored, so that RTLD_NEXT is resolved relative to the caller.  See
 * dlsym.c.
 *
 * Branch protection, for a shim linked into a BTI/PAC-marked process: the
 * entry (reached through the caller's PLT, `br x17`) is a landing pad, and x30
 * is signed while it is on the stack.  paciasp and autiasp are written as the
 * hints they are, which run as no-ops on cores without them, so one build
 * serves every aarch64 core.  The note below marks this file as both, or the
 * linker would take BTI/PAC off the whole shim (it keeps a marking only when
 * every input has it).  tests/test_platforms.py assembles this file for the
 * note, and cross-builds the shim with -mbranch-protection=standard and
 * -z force-bti to run every look-up path and the RTLD_NEXT test under
 * qemu-aarch64, which enforces both. */
        .text
        .globl  dlsym
        .type   dlsym, %function
dlsym:
        .cfi_startproc
        hint    #25                     /* paciasp: sign x30; also a BTI landing pad */
        .cfi_negate_ra_state
        stp     x29, x30, [sp, #-32]!
        .cfi_def_cfa_offset 32
        .cfi_offset 29, -32
        .cfi_offset 30, -24
        mov     x29, sp
        stp     x0, x1, [sp, #16]
        bl      vgl_dlsym_intercept
        mov     x9, x0
        ldp     x0, x1, [sp, #16]
        ldp     x29, x30, [sp], #32
        .cfi_def_cfa_offset 0
        .cfi_restore 29
        .cfi_restore 30
        hint    #29                     /* autiasp: x30 is the caller's again */
        .cfi_negate_ra_state
        cbnz    x9, 1f
        adrp    x16, vgl_real_dlsym
        ldr     x16, [x16, :lo12:vgl_real_dlsym]
        br      x16                     /* set by vgl_dlsym_intercept before it returns */
1:      mov     x0, x9
        ret
        .cfi_endproc
        .size   dlsym, .-dlsym

        .section .note.GNU-stack, "", %progbits

/* GNU property note: GNU_PROPERTY_AARCH64_FEATURE_1_AND = BTI | PAC. */
        .section .note.gnu.property, "a"
        .p2align 3
        .word   4                       /* name size */
        .word   16                      /* descriptor size */
        .word   5                       /* NT_GNU_PROPERTY_TYPE_0 */
        .asciz  "GNU"
        .word   0xc0000000              /* GNU_PROPERTY_AARCH64_FEATURE_1_AND */
        .word   4                       /* data size */
        .word   3                       /* BTI (1) | PAC (2) */
        .word   0                       /* padding to 8 bytes */
