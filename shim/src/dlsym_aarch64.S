/* dlsym: ask vgl_dlsym_intercept(handle, name); when it declines (NULL),
 * branch to the C library's dlsym with the caller's x30 (return address)
 * restored, so that RTLD_NEXT is resolved relative to the caller.  See
 * dlsym.c.  Assembled by CI only on arm64 machines. */
        .text
        .globl  dlsym
        .type   dlsym, %function
dlsym:
        .cfi_startproc
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
        cbnz    x9, 1f
        adrp    x16, vgl_real_dlsym
        ldr     x16, [x16, :lo12:vgl_real_dlsym]
        br      x16
1:      mov     x0, x9
        ret
        .cfi_endproc
        .size   dlsym, .-dlsym

        .section .note.GNU-stack, "", %progbits
