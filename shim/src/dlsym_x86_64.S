/* dlsym: ask vgl_dlsym_intercept(handle, name); when it declines (NULL),
 * jump to the C library's dlsym with the caller's return address still on the
 * stack, so that RTLD_NEXT is resolved relative to the caller.  See dlsym.c. */
        .text
        .globl  dlsym
        .type   dlsym, @function
dlsym:
        .cfi_startproc
        push    %rdi
        .cfi_adjust_cfa_offset 8
        push    %rsi
        .cfi_adjust_cfa_offset 8
        sub     $8, %rsp                /* keep the stack 16-byte aligned at the call */
        .cfi_adjust_cfa_offset 8
        call    vgl_dlsym_intercept
        add     $8, %rsp
        .cfi_adjust_cfa_offset -8
        pop     %rsi
        .cfi_adjust_cfa_offset -8
        pop     %rdi
        .cfi_adjust_cfa_offset -8
        test    %rax, %rax
        jnz     1f
        jmp     *vgl_real_dlsym(%rip)   /* set by vgl_dlsym_intercept before it returns */
1:      ret
        .cfi_endproc
        .size   dlsym, .-dlsym

        .section .note.GNU-stack, "", @progbits
