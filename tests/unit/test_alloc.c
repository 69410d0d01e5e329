/*
 * test_alloc.c - the one allocator (src/common/huge_alloc.h, mem.c): alignment, the
 * huge-page advice really taking (the mapping's VmFlags say "hg"), and the failure hook.
 *
 * Until gradcomp 0.1 big buffers were aligned_alloc(64) blocks, whose addresses glibc
 * never page-aligns, so every madvise(MADV_HUGEPAGE) failed with EINVAL and no workspace
 * got huge pages.  Whether the kernel then backs the region with huge pages depends on
 * memory fragmentation, so that is printed, not asserted; the advice itself is asserted
 * wherever the kernel has transparent huge pages.
 */
#define _GNU_SOURCE
#include "check.h"
#include "core/internal.h"

#include <stdint.h>

/* The smaps entry of the mapping holding `addr`: its VmFlags line and AnonHugePages (kB).
 * Returns 0 when found. */
static int smaps_of(const void *addr, char *flags, size_t cap, long *huge_kb) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int inside = 0, found = -1;
    uintptr_t a = (uintptr_t)addr;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char *dash = strchr(line, '-'), *space = strchr(line, ' ');
        if (dash && space && dash < space && sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
            if (inside) break;
            inside = a >= lo && a < hi;
            continue;
        }
        if (!inside) continue;
        if (!strncmp(line, "AnonHugePages:", 14)) sscanf(line + 14, "%ld", huge_kb);
        if (!strncmp(line, "VmFlags:", 8)) {
            snprintf(flags, cap, "%s", line + 8);
            found = 0;
        }
    }
    fclose(f);
    return found;
}

static void test_alignment(void) {
    const size_t MB = (size_t)1 << 20;
    const size_t sizes[] = {0, 1, 63, 64, 4096, 2 * MB, 4 * MB - 1, 4 * MB, 4 * MB + 1, 100 * MB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *p = gcomp__alloc(sizes[i]);
        CHECK_MSG(p != NULL, "%zu bytes", sizes[i]);
        if (!p) continue;
        CHECK_MSG((uintptr_t)p % 64 == 0, "%zu bytes at %p", sizes[i], (void *)p);
        if (sizes[i] >= 4 * MB)
            CHECK_MSG((uintptr_t)p % (2 * MB) == 0, "%zu bytes at %p: not on a 2 MiB page",
                      sizes[i], (void *)p);
        p[0] = 1;
        if (sizes[i]) p[sizes[i] - 1] = 2;
        gcomp__free(p);
    }
    gcomp__free(NULL);
}

static void test_huge_pages(void) {
    FILE *t = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!t) {
        printf("no transparent huge pages in this kernel: advice not checked\n");
        return;
    }
    char mode[128] = "";
    if (!fgets(mode, sizeof mode, t)) mode[0] = 0;
    fclose(t);
    size_t bytes = (size_t)64 << 20;
    float *p = gcomp__calloc(bytes); /* touches every page */
    CHECK(p != NULL);
    if (!p) return;
    char flags[512] = "";
    long huge_kb = -1;
    CHECK(smaps_of(p, flags, sizeof flags, &huge_kb) == 0);
    /* VM_HUGEPAGE: the advice was taken for this mapping. */
    CHECK_MSG(strstr(flags, " hg") != NULL, "VmFlags:%s", flags);
    printf("64 MiB workspace: AnonHugePages %ld kB (THP mode: %.*s)\n", huge_kb,
           (int)strcspn(mode, "\n"), mode);
    gcomp__free(p);
}

static void test_fail_hook(void) {
    gcomp__test_fail_alloc_after(0);
    CHECK(gcomp__alloc(10) == NULL);
    CHECK(gcomp__alloc((size_t)8 << 20) == NULL);
    gcomp__test_fail_alloc_after(1);
    void *a = gcomp__alloc((size_t)8 << 20);
    CHECK(a != NULL);
    CHECK(gcomp__calloc(10) == NULL);
    gcomp__test_fail_alloc_after((size_t)-1);
    gcomp__free(a);
    gcomp__buf b = {0};
    gcomp__test_fail_alloc_after(0);
    CHECK(gcomp__buf_reserve(&b, 100) == GCOMP_E_NOMEM && b.p == NULL);
    gcomp__test_fail_alloc_after((size_t)-1);
    CHECK_OK(gcomp__buf_reserve(&b, (size_t)5 << 20));
    CHECK((uintptr_t)b.p % ((size_t)2 << 20) == 0);
    gcomp__buf_free(&b);
    /* Sizes whose rounding would wrap. */
    CHECK(gcomp__alloc(SIZE_MAX) == NULL);
    CHECK(gcomp__alloc(SIZE_MAX - 100) == NULL);
}

int main(void) {
    test_alignment();
    test_huge_pages();
    test_fail_hook();
    return CHECK_DONE();
}
