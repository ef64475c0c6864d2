/* The definition that rtld_next_wrap.c's whoami() must find as "next". */
int whoami(void) { return 1; }
