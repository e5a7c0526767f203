/* A CPU burner for the cluster test's workload pods: spins in two named functions, so
 * that the profile must name them (built static, with frame pointers and symbols, by
 * tests/k8s/build-images.sh). Exits on SIGTERM at once, so pods delete fast. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

static volatile sig_atomic_t stop;
static volatile uint64_t sink;

static void on_term(int sig) { (void)sig; stop = 1; }

__attribute__((noinline)) static uint64_t ember_burn_inner(uint64_t x) {
    for (int i = 0; i < 100000; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}

__attribute__((noinline)) static void ember_burn_outer(void) {
    uint64_t x = 1;
    while (!stop) x = ember_burn_inner(x);
    sink = x;
}

int main(void) {
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    puts("burning");
    fflush(stdout);
    ember_burn_outer();
    return 0;
}
