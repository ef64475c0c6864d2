/* The pod sandbox's process for tests/cri.py, built with gcc -static (the
 * image holds nothing it could link against): it waits until it is told to
 * stop, as Kubernetes' pause does. */
#include <signal.h>
#include <unistd.h>

static void stop(int sig)
{
    (void)sig;
    _exit(0);
}

int main(void)
{
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    for (;;)
        pause();
}
